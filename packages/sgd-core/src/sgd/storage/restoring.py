"""What a run resumes from: the driver's kept checkpoints read back.

:class:`_Restoring` is that part of :class:`sgd.storage.manager.CheckpointManager` (a mixin: the
manager sets its state up): the latest checkpoint's state (:meth:`_Restoring.latest`), what a
restart resumes from (:meth:`_Restoring.restorable`: not one filed under a report the failure cut
off), the kept checkpoints found on disk when a run resumes, the best one.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from sgd import plugins
from sgd.checkpoint.encoded import EncodedState
from sgd.checkpoint.format import METADATA_FILE, Checkpoint, CheckpointIntegrityError
from sgd.checkpoint.integrity import checkpoint_dirs
from sgd.storage.kept import _Kept, _recorded_files, _status
from sgd.storage.validations import spec_from_json

logger = logging.getLogger("sgd")


class _Restoring:
    """Reading back the checkpoints :class:`sgd.storage.manager.CheckpointManager` keeps (a
    mixin: the manager's ``__init__`` sets the state declared here)."""

    checkpoint_dir: Path
    hook: Any
    latest_id: int
    latest_state: Any
    latest_iteration: int
    delivered_iteration: Optional[int]
    _kept: List[_Kept]
    #: the folder the state in :attr:`latest_state` was last read from (``None``: none read yet)
    loaded_from: Optional[Path]

    if TYPE_CHECKING:
        def _tell(self, kind: str, **fields: Any) -> None: ...

    def latest(self) -> Optional[Dict[str, Any]]:
        """The latest checkpoint's state (read back from disk if rank 0 wrote it directly).

        A kept checkpoint that no longer verifies is skipped with a warning, and the newest
        one that does is used (:attr:`latest_iteration` then follows it).
        """
        return self._latest(decode=True)

    def _latest(self, decode: bool) -> Any:
        if self.latest_state is None and self.latest_id and self._kept:
            newest = max(self._kept, key=lambda c: c.checkpoint_id)
            if newest.checkpoint_id == self.latest_id:
                self._load_newest_verified(decode=decode)
        if decode and isinstance(self.latest_state, EncodedState):
            self.latest_state = self.latest_state.decode(self.hook)
        return self.latest_state

    def restorable(self, decode: bool = True) -> Any:
        """What a restart resumes from: :meth:`latest`, unless it is filed under a report not
        yet delivered (saved before that report, which the failure cut off); then the newest
        kept one filed under a delivered report, whose steps after it are redone and reported.
        :attr:`latest_state` and :attr:`latest_iteration` follow it.

        :param decode: ``False``: a dict checkpoint read from disk comes verified but encoded
            (:class:`~sgd.checkpoint.encoded.EncodedState`), for the workers to decode: the
            driver does not import the framework its codec needs (a restart sends it on).
        """
        done = self.delivered_iteration
        if done is None or self.latest_iteration <= done:
            return self._latest(decode)
        candidates = [c for c in self._kept if c.iteration <= done]
        if not candidates:  # none kept on disk (num_to_keep=0): its progress beats a redone report
            logger.warning("the newest checkpoint goes with report %d, which the failure cut off, and no earlier "
                           "one is kept: resuming from it; that report is not delivered", self.latest_iteration)
            return self._latest(decode)
        logger.info("the newest checkpoint goes with report %d, which the failure cut off; resuming from the one "
                    "before it and redoing the steps after that", self.latest_iteration)
        self.latest_state, self.latest_iteration = None, 0
        self._load_newest_verified(candidates, decode)
        return self._latest(decode)

    def _newest_restorable(self) -> Optional[_Kept]:
        done = self.delivered_iteration
        candidates = [c for c in self._kept if done is None or c.iteration <= done]
        return max(candidates, key=lambda c: c.checkpoint_id, default=None)
    def checkpoint_for(self, iteration: int) -> Optional[Path]:
        """The kept checkpoint filed under report ``iteration`` (the newest, if several), or ``None``."""
        found = [c for c in self._kept if c.iteration == iteration]
        return max(found, key=lambda c: c.checkpoint_id).path if found else None

    def _load_newest_verified(self, among: Optional[List[_Kept]] = None, decode: bool = True) -> None:
        """Read the newest kept checkpoint (of ``among``) that verifies into :attr:`latest_state`:
        decoded, or left encoded (``decode=False``)."""
        for kept in sorted(self._kept if among is None else among, key=lambda c: c.checkpoint_id, reverse=True):
            # What this driver wrote in this run is trusted as long as its files are
            # still the ones it recorded; checkpoints found on disk follow the caller's switch.
            ours = kept.files is not None and _recorded_files(kept.path) == kept.files
            try:
                with plugins.using(self.hook):
                    checkpoint = Checkpoint.from_directory(kept.path, trusted=True if ours else None)
                    state = checkpoint.to_dict() if decode else checkpoint.to_encoded()
            except (CheckpointIntegrityError, FileNotFoundError) as exc:
                logger.warning("skipping checkpoint %s, which does not verify: %s", kept.path, exc)
                self._tell("checkpoint_rejected", checkpoint=kept.path.name, iteration=kept.iteration,
                           reason=str(exc))
                continue
            self.latest_state, self.loaded_from = state, kept.path
            if kept.checkpoint_id != self.latest_id:
                self.latest_iteration = kept.iteration
            return
        raise CheckpointIntegrityError(
            f"none of the checkpoints kept in {self.checkpoint_dir} verifies, so there is nothing to resume from; "
            "see the warnings above for each one.")
    # --- reading ----------------------------------------------------------------

    def _scan(self) -> List[_Kept]:
        kept = []
        for _, p in checkpoint_dirs(self.checkpoint_dir):  # numbered and named ones
            try:
                meta = json.loads((p / METADATA_FILE).read_text())
            except (OSError, ValueError):
                continue
            try:
                score = meta.get("score")
                metrics = meta.get("metrics")
                kept.append(_Kept(int(meta["id"]), -math.inf if score is None else float(score), p,
                                  int(meta.get("iteration") or 0), None,
                                  metrics if isinstance(metrics, dict) else None, _status(meta),
                                  spec_from_json(meta.get("validation_spec"))))
            except (TypeError, ValueError, KeyError):
                continue  # metadata altered: never ranked, never loaded
        return kept

    @property
    def best_path(self) -> Optional[Path]:
        if not self._kept:
            return None
        return max(self._kept, key=lambda c: (c.score, c.checkpoint_id)).path

    @property
    def kept_ids(self) -> List[int]:
        return sorted(c.checkpoint_id for c in self._kept)
