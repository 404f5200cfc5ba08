"""Run the test suite measuring each test's wall and CPU time; write a table of where it goes.

    python scripts/suite_cost.py [--out build/suite-cost] [-- PYTEST ARGS]   (nox -s suite_cost)
    python scripts/suite_cost.py --report build/suite-cost/tests.jsonl

The suite runs in a cgroup of its own, so the CPU time counted is that of pytest and every
process it starts (Ray's daemons and workers, spawned drivers), and nothing else on the machine:
the figure holds on a busy machine, where wall times do not. Making a cgroup needs root (cgroup
v1 ``cpuacct`` or v2); without it each test's CPU time leaves out Ray's processes
(``sgd_testing.suite_cost``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

CGROUP_NAME = f"sgd-suite-cost-{os.getpid()}"


def make_cgroup() -> Optional[str]:
    """A new cgroup holding this process (so everything it starts), or ``None`` if none can be made."""
    for parent in ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if not os.path.isdir(parent):
            continue
        path = os.path.join(parent, CGROUP_NAME)
        try:
            os.mkdir(path)
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError:
            continue
        if os.path.isfile(os.path.join(path, "cpuacct.usage")) or os.path.isfile(os.path.join(path, "cpu.stat")):
            return path
    return None


def _package(test_id: str) -> str:
    path = test_id.split("::")[0]
    return "/".join(path.split("/")[:2]) if path.startswith("packages/") else path.split("/")[0]


def report(rows: List[Dict], wall: Optional[float] = None, cpu: Optional[float] = None) -> str:
    """The Markdown summary of a run's per-test lines."""
    wall = wall if wall is not None else sum(r["wall"] for r in rows)
    cpu = cpu if cpu is not None else sum(r["cpu"] for r in rows)
    waits = sum(max(0.0, r["wall"] - r["cpu"]) for r in rows)
    out = [f"{len(rows)} tests; wall {wall / 60:.1f} min, CPU {cpu / 60:.1f} min "
           f"({cpu / wall if wall else 0:.2f} cores busy on average); tests waiting (wall above CPU) "
           f"{waits / 60:.1f} min in all.", ""]
    for title, key in (("package", _package), ("file", lambda i: i.split("::")[0])):
        sums: Dict[str, List[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
        for r in rows:
            s = sums[key(r["id"])]
            s[0] += r["wall"]
            s[1] += r["cpu"]
            s[2] += 1
        out += [f"| {title} | tests | wall s | CPU s |", "|---|---|---|---|"]
        for name, (w, c, n) in sorted(sums.items(), key=lambda kv: -kv[1][1])[:30 if title == "file" else None]:
            out.append(f"| {name} | {n} | {w:.0f} | {c:.0f} |")
        out.append("")
    out += ["| slowest tests (wall) | wall s | CPU s | outcome |", "|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -r["wall"])[:30]:
        out.append(f"| {r['id']} | {r['wall']:.1f} | {r['cpu']:.1f} | {r.get('outcome', '')} |")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/suite-cost", help="folder for tests.jsonl and suite-cost.md")
    parser.add_argument("--report", metavar="JSONL", help="only summarise an earlier run's tests.jsonl")
    parser.add_argument("pytest_args", nargs="*", default=["packages", "tests"])
    args = parser.parse_args()
    if args.report:
        rows = [json.loads(line) for line in Path(args.report).read_text().splitlines() if line.strip()]
        sys.stdout.write(report(rows))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = out / "tests.jsonl"
    lines.unlink(missing_ok=True)
    cgroup = make_cgroup()
    if cgroup is None:
        print("suite_cost: no cgroup could be made (needs root); CPU times leave out Ray's processes",
              file=sys.stderr)
    from sgd_testing.suite_cost import cgroup_cpu_reader

    read = cgroup_cpu_reader(cgroup)
    env = dict(os.environ, SGD_SUITE_COST_OUT=str(lines.resolve()), SGD_SUITE_COST_CGROUP=cgroup or "",
               PYTHONUNBUFFERED="1")
    start, cpu0 = time.monotonic(), read() if read else 0.0
    rc = subprocess.call([sys.executable, "-m", "pytest", "-p", "sgd_testing.suite_cost", *args.pytest_args], env=env)
    wall, cpu = time.monotonic() - start, (read() - cpu0) if read else None
    rows = [json.loads(line) for line in lines.read_text().splitlines() if line.strip()] if lines.exists() else []
    text = report(rows, wall, cpu)
    if "-n" in args.pytest_args or any(a.startswith(("-n", "--numprocesses")) for a in args.pytest_args):
        # One cgroup holds every xdist worker: a test's CPU figure counts the others' too.
        text = text.replace("\n", "\n\nRun on xdist workers: the totals hold; per-test and per-file CPU figures "
                            "count every worker's processes during that test, so they are not the test's own.\n", 1)
    (out / "suite-cost.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"wall_s": round(wall, 1), "cpu_s": cpu and round(cpu, 1),
                                                  "tests": len(rows), "pytest_rc": rc, "args": args.pytest_args,
                                                  "load_at_end": os.getloadavg()}, indent=1))
    print(text.split("\n", 1)[0])
    if cgroup:
        try:
            with open("/sys/fs/cgroup/cpuacct/cgroup.procs" if "cpuacct" in cgroup else
                      os.path.join(os.path.dirname(cgroup), "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            os.rmdir(cgroup)
        except OSError:
            pass  # a process of the run is still in it; the empty cgroup is left for the system
    return rc


if __name__ == "__main__":
    sys.exit(main())
