"""What each test costs: wall time and the CPU time of every process it made work.

An opt-in pytest plugin (``pytest -p sgd_testing.suite_cost``) for finding where a suite's time
goes. On a 2-core machine that difference decides what helps: a test whose wall time is far above
its CPU time waits (a timeout, a backoff, a resource another test holds) and parallel workers hide
it; one whose CPU time is near its wall time keeps a core busy (worker processes importing their
framework, a cluster starting) and only doing less makes it cheaper.

The CPU time is read from a cgroup holding the test process and everything it starts (Ray's
daemons and workers, subprocess drivers), named by ``SGD_SUITE_COST_CGROUP`` (a cgroup-v1
``cpuacct`` path or a cgroup-v2 directory: ``scripts/suite_cost.py`` makes one). Without one it
is this process's own CPU time plus its waited-for children's, which leaves Ray's processes out.
Each test appends one JSON line to ``SGD_SUITE_COST_OUT`` (default ``suite-cost.jsonl``):
``{"id", "wall", "cpu", "outcome"}``.
"""

from __future__ import annotations

import json
import os
import resource
import time
from typing import Any, Callable, Generator, Iterator, Optional

import pytest


def cgroup_cpu_reader(path: Optional[str]) -> Optional[Callable[[], float]]:
    """A function returning the cgroup's CPU seconds so far, or ``None`` if ``path`` has no
    readable counter (cgroup v1 ``cpuacct.usage`` in ns, v2 ``cpu.stat``'s ``usage_usec``)."""
    if not path:
        return None
    v1 = os.path.join(path, "cpuacct.usage")
    v2 = os.path.join(path, "cpu.stat")
    if os.path.isfile(v1):
        def read_v1() -> float:
            with open(v1) as f:
                return int(f.read()) / 1e9
        return read_v1
    if os.path.isfile(v2):
        def read_v2() -> float:
            with open(v2) as f:
                for line in f:
                    key, value = line.split()
                    if key == "usage_usec":
                        return int(value) / 1e6
            raise RuntimeError(f"{v2} has no usage_usec line")
        return read_v2
    return None


def _own_cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


_read_cpu: Callable[[], float] = cgroup_cpu_reader(os.environ.get("SGD_SUITE_COST_CGROUP")) or _own_cpu


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    wall, cpu = time.monotonic(), _read_cpu()
    reports: list = []
    item.stash[_REPORTS] = reports
    yield
    line = {"id": item.nodeid, "wall": round(time.monotonic() - wall, 3), "cpu": round(_read_cpu() - cpu, 3),
            "outcome": _outcome(reports)}
    with open(os.environ.get("SGD_SUITE_COST_OUT", "suite-cost.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


_REPORTS = pytest.StashKey[list]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    reports = item.stash.get(_REPORTS, None)
    if reports is not None:
        reports.append(report)
    return report


def _outcome(reports: list) -> str:
    for report in reports:
        if report.failed:
            return "failed"
    return "skipped" if any(r.skipped for r in reports) else "passed"
