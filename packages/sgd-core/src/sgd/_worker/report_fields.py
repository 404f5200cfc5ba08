"""What sgd adds to every report a worker makes: its count, times, and where it ran.

``_training_iteration``, ``_timestamp`` and ``_time_this_iter_s`` show in every result; the
detailed fields (:data:`sgd._common.protocol.DETAILED_AUTOFILLED_KEYS`: date, total time, pid,
host name, node IP) are in every report's ``results.jsonl`` text, and travel on their own with a
report that carries a checkpoint (under :data:`~sgd._common.protocol.DETAIL_KEY`); the driver
decides per round whether to hand them on (so the switch works when set late). Until a report is
encoded, :data:`~sgd._common.protocol.DETAIL_KEY` holds only its time: the other four follow from
it and from the process.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Dict, List, Optional

from sgd._common.protocol import DETAIL_KEY, DETAILED_AUTOFILLED_KEYS, encode_heads, encode_line

_HOSTNAME = socket.gethostname()
_node_ip_cache: Optional[str] = None


def _node_ip() -> str:
    global _node_ip_cache
    if _node_ip_cache is None:
        import ray.util

        _node_ip_cache = ray.util.get_node_ip_address()
    return _node_ip_cache


class ReportFields:
    """The report count of one run on one worker, and the fields it stamps on each report.

    :param iteration: reports already made (a run resumed or re-formed goes on from there).
    """

    def __init__(self, iteration: int = 0):
        #: reports made so far in this run (the next report is one more)
        self.iteration = iteration
        self._start_time = time.time()
        self._last_report_time = self._start_time
        self._date_second = -1
        self._date_text = ""
        self._pid = os.getpid()

    def stamp(self, out: Dict[str, Any]) -> Dict[str, Any]:
        """Count one report and add sgd's fields to ``out`` (the report's own dict); returns it.
        The report's time goes under :data:`~sgd._common.protocol.DETAIL_KEY`, for :meth:`lines`
        (or :meth:`detail`)."""
        now = time.time()
        self.iteration += 1
        out["_timestamp"] = int(now)
        out["_time_this_iter_s"] = now - self._last_report_time
        out["_training_iteration"] = self.iteration
        out[DETAIL_KEY] = self._last_report_time = now
        return out

    def detail(self, when: float) -> Dict[str, Any]:
        """The detailed autofilled values of a report stamped at ``when``."""
        return {"_date": self._date(when), "_time_total_s": when - self._start_time, "_pid": self._pid,
                "_hostname": _HOSTNAME, "_node_ip": _node_ip()}

    def lines(self, reports: List[Dict[str, Any]]) -> List[str]:
        """Each report's ``results.jsonl`` text (:func:`~sgd._common.protocol.encode_line` of it
        with its detailed values), its time taken out of it. The common batch (plain values)
        costs one encoder call, the detailed values joined on as text: of the five only the time
        changes from one report to the next, and the date once a second."""
        whens = [report.pop(DETAIL_KEY, None) for report in reports]
        heads = encode_heads(reports) if None not in whens else None
        if heads is None or not _DETAIL_NAMES.isdisjoint(set().union(*reports)):
            return [encode_line(report if when is None else {**report, DETAIL_KEY: self.detail(when)})
                    for report, when in zip(reports, whens)]
        start, tail, befores = self._start_time, self._tail(), _BEFORES
        return [f"{head}{befores.get(int(when)) or self._before(when)}{when - start!r}{tail}"
                for head, when in zip(heads, whens)]

    def _date(self, when: float) -> str:
        second = int(when)
        if second != self._date_second:  # the date string changes once a second
            self._date_second = second
            self._date_text = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(when))
        return self._date_text

    def _before(self, when: float) -> str:
        """The text between a report's own values and its total time: its date's."""
        if len(_BEFORES) > 8:
            _BEFORES.clear()
        text = _BEFORES[int(when)] = f', "_date": {json.dumps(self._date(when))}, "_time_total_s": '
        return text

    def _tail(self) -> str:
        """The text after a report's total time: the values that are the same in every report
        this process makes."""
        tail = _TAILS.get(self._pid)
        if tail is None:
            tail = _TAILS[self._pid] = ", " + encode_line(
                {"_pid": self._pid, "_hostname": _HOSTNAME, "_node_ip": _node_ip()})[1:]
        return tail


#: What :meth:`ReportFields.lines` joins on, kept for the process (made once, not once per run):
#: the text of the values every report shares (by pid: a forked child is another process), and the
#: date's text by second.
_TAILS: Dict[int, str] = {}
_BEFORES: Dict[int, str] = {}
_DETAIL_NAMES = frozenset(DETAILED_AUTOFILLED_KEYS)
