"""What sgd adds to every report a worker makes: its count, times, and where it ran.

``_training_iteration``, ``_timestamp`` and ``_time_this_iter_s`` show in every result; the
detailed fields (:data:`sgd._common.protocol.DETAILED_AUTOFILLED_KEYS`: date, total time, pid,
host name, node IP) always travel, under :data:`~sgd._common.protocol.DETAIL_KEY`, and the
driver decides per round whether to hand them on (so the switch works when set late).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Dict, Optional

from sgd._common.protocol import DETAIL_KEY

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
        self._date = ""
        self._pid = os.getpid()

    def stamp(self, out: Dict[str, Any]) -> Dict[str, Any]:
        """Count one report and add sgd's fields to ``out`` (the report's own dict); returns it."""
        now = time.time()
        self.iteration += 1
        out["_timestamp"] = int(now)
        out["_time_this_iter_s"] = now - self._last_report_time
        out["_training_iteration"] = self.iteration
        second = int(now)
        if second != self._date_second:  # the date string changes once a second
            self._date_second = second
            self._date = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now))
        out[DETAIL_KEY] = {"_date": self._date, "_time_total_s": now - self._start_time, "_pid": self._pid,
                           "_hostname": _HOSTNAME, "_node_ip": _node_ip()}
        self._last_report_time = now
        return out
