"""Growing and re-forming an actor group in place, while its run goes on (:mod:`sgd.elastic`).

New workers are started beside a running in-place run and join it at its next reset; a group
that lost workers is re-formed around the survivors (:mod:`sgd.group.reform`). Slots taken for
workers that never joined go back.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional

import ray
from ray.util.placement_group import remove_placement_group

from sgd._common.nodes import NodeWatch
from sgd.group.deaths import deaths_as_errors
from sgd.group.placing import ELASTIC_ATTEMPT_S
from sgd.group.reform import reform_in_place
from sgd.group.rounds import RoundCollector
from sgd.group.status import HEALTHY, Barrier, Health
from sgd.worker_group import WorkerGroup

logger = logging.getLogger("sgd")


class _InPlace:
    """The in-place part of :class:`sgd.group.actors.ActorGroup` (a mixin: the group's
    ``__init__`` sets these)."""

    worker_group: Optional[WorkerGroup]
    nodes: NodeWatch
    _rounds: Optional[RoundCollector]
    _reforms: bool
    _joining: Optional[tuple]
    _initialization_hook: Optional[Callable[[], Any]]
    _health: Health
    _next_health_check: float

    @property
    def recovers_in_place(self) -> bool:
        """Whether the current run announced ``sgd.elastic.run`` (a loss, or growth, re-forms
        the group in place)."""
        return self._rounds is not None and self._rounds.elastic and self._reforms

    def grow(self, count: int) -> Optional[BaseException]:
        """Start ``count`` more workers for the current in-place run, while it goes on; they
        join at its next reset, which is asked for now (the runs come to the barrier at their
        next commit or report). The failure to place or start them, or ``None``."""
        wg = self.worker_group
        assert wg is not None and self._rounds is not None
        if self._joining is not None:
            return None
        timeout = wg._placement_timeout_s
        wg._avoid_nodes = frozenset(self.nodes.avoid())
        wg._placement_timeout_s = ELASTIC_ATTEMPT_S  # there was room a moment ago; else try again later
        try:
            with deaths_as_errors(None, "starting workers to grow the group"):
                slots = wg._slots_for(count)
                try:
                    actors, metadata = wg._launch(slots)
                    if self._initialization_hook is not None:
                        ray.get([a._sgd_execute.remote(self._initialization_hook, (), {}) for a in actors])
                except BaseException:
                    self._drop_slots(slots)
                    raise
        except Exception as exc:
            return exc
        finally:
            wg._placement_timeout_s = timeout
        self._joining = (slots, actors, metadata)
        logger.info("elastic: %d new worker(s) started; they join at the run's next commit", count)
        self._rounds.request_reset()
        return None

    def reform(self, barrier: Barrier, iteration: int) -> Optional[BaseException]:
        """Re-form the group in place around the workers waiting at ``barrier``: leave out the
        ones gone, add new ones where the group needs them (a fixed size, or below its min),
        set the backend up on the new group, and let the runs go on (new workers join them).
        ``iteration``: the reports delivered so far. The failure to do so, or ``None``."""
        try:
            with deaths_as_errors(self.worker_group, "re-forming the group"):
                reform_in_place(self, barrier, iteration)
        except Exception as exc:
            self._rounds = None
            return exc
        return None

    def _end_rounds(self) -> None:
        self._rounds = None
        if self._joining is not None and self.worker_group is not None:
            # Started to grow a run that ended first: not part of the group.
            slots, actors, _ = self._joining
            for a in actors:
                ray.kill(a, no_restart=True)
            self._drop_slots(slots)
        self._joining = None

    def _drop_slots(self, slots: List[Any]) -> None:
        """Slots taken for workers that will not join: spare ones go back, new reservations go."""
        wg = self.worker_group
        assert wg is not None
        in_use = {id(pg) for pg, _ in wg._slots}
        for slot in slots:
            if id(slot[0]) in in_use:
                wg._spare.append(slot)
        for pg in {id(s[0]): s[0] for s in slots if id(s[0]) not in in_use and s[0] in wg._own_pgs}.values():
            wg._own_pgs.remove(pg)
            remove_placement_group(pg)
        self._health, self._next_health_check = HEALTHY, 0.0
