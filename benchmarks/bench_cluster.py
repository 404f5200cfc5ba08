"""A real three-host cluster: cold start, and recovery from a host lost without warning.

    python benchmarks/bench_cluster.py [--quick] [--frameworks sgd,sgd-inplace,ray]

The cluster is ``sgd_testing.hosts.HostCluster``: a head at 127.0.0.2 with 0 CPUs (the drivers
run there) and two worker hosts at 127.0.0.3 and 127.0.0.4 with 2 CPUs each, every host its own
``ray start --block`` with its own address, the worker hosts with private ``/tmp``, ``/dev/shm``
and ``~/sgd_results``. Each case runs in a fresh driver process (``_cluster_drivers.py``):

- **cold start**: from the trainer's construction to the first report of 4 torch workers.
- **host loss**: elastic 2..4 workers; at step 10 every process of one worker host is SIGKILLed;
  measured from the kill to the first report of the restarted group, and whether any step
  reported before the kill is missing afterwards.

sgd (restarting every worker from the latest checkpoint), sgd in place (``sgd.elastic.run``: the
survivors keep their processes; issue 36) and Ray Train (``TorchTrainer``,
``ScalingConfig(num_workers=(2, 4))``, ``FailureConfig``) run the same workload on the same
cluster; between cases the lost host is started again and Ray has declared the old one dead.
Results: ``benchmarks/results/cluster.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).parent))

from _results import RESULTS, loadavg, machine, save

HERE = Path(__file__).parent


def _driver(cluster: Any, framework: str, case: str, timeout_s: float = 600) -> Dict[str, Any]:
    # Shared disk, not the worker hosts' private /tmp: Ray Train's storage_path must be
    # readable from every host.
    work = Path(tempfile.mkdtemp(prefix=f"sgdbench-{framework}-{case}-", dir="/var/tmp"))
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "SGD_BENCH_HEAD_IP": cluster.head_ip,
           "RAY_AUTH_MODE": "disabled", "SGD_RESULTS_DIR": str(work / "results"), "SGD_PROGRESS": "0",
           "RAY_TRAIN_ENABLE_STATE_TRACKING": "0"}
    log = open(work / "driver.log", "wb")
    proc = subprocess.Popen([sys.executable, str(HERE / "_cluster_drivers.py"), framework, case, str(work)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(HERE))
    killed_at = None
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{framework} {case}: no result within {timeout_s:.0f}s; see {work}/driver.log")
            if case == "loss" and killed_at is None and (work / "kill_now").exists():
                # Not waiting for the processes to be reaped: rank 0 holds its step until the
                # kill is done, and the host is gone once the signals are out.
                killed_at = cluster.hosts[1].kill(wait=False)
                (work / "kill_now.done").write_text("")
            time.sleep(0.01)
    finally:
        log.close()
    if proc.returncode != 0:
        tail = (work / "driver.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{framework} {case} failed ({proc.returncode}):\n{tail}")
    out = json.loads((work / "driver.json").read_text())
    out["killed_at"] = killed_at
    if os.environ.get("SGD_BENCH_KEEP") != "1":  # 1: keep each driver's folder (driver.log) to read
        shutil.rmtree(work, ignore_errors=True)
    return out


def _start_s(out: Dict[str, Any]) -> float:
    return float(out["rounds"][0]["t"] - out["begun"])


def _loss(out: Dict[str, Any], lost_ip: str) -> Dict[str, Any]:
    killed = out["killed_at"]
    rounds = out["rounds"]
    # The first report of the group that went on without the host: a step the old group was
    # finishing when the signals went out can still report at the old size just after them.
    size = max((r for r in rounds if r["t"] <= killed), key=lambda r: r["t"])["world_size"]
    after = [r for r in rounds if r["t"] > killed and r["world_size"] != size]
    first = min(after, key=lambda r: r["t"])
    steps = sorted({r["step"] for r in rounds})
    before = {r["step"] for r in rounds if r["t"] <= killed}
    restarted = None
    if all("workers" in r for r in rounds):  # sgd: where each worker ran, before and after
        survivors = {tuple(w) for r in rounds if r["t"] <= killed for w in r["workers"] if w[0] != lost_ip}
        later = {tuple(w) for r in after for w in r["workers"]}
        restarted = len(survivors - later)
    return {"recover_s": first["t"] - killed, "world_size_after": first["world_size"],
            "survivors_restarted": restarted,
            "last_step_before_kill": max(before), "first_step_after": first["step"],
            "steps_missing": [s for s in range(1, max(steps) + 1) if s not in steps],
            "reported_before_kill_kept": sorted(before) == list(range(1, len(before) + 1))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one repetition of each case")
    parser.add_argument("--frameworks", default="sgd,sgd-inplace,ray")
    parser.add_argument("--keep-others", action="store_true",
                        help="keep the results of the frameworks not run from the last cluster.json")
    args, _ = parser.parse_known_args()
    reps = 1 if args.quick else 3
    frameworks = args.frameworks.split(",")

    from sgd_testing.hosts import HostCluster

    cluster = HostCluster(num_hosts=2, cpus_per_host=2)
    cluster.start()
    results: Dict[str, Dict[str, List[Any]]] = {f: {"start_s": [], "loss": []} for f in frameworks}
    try:
        for framework in frameworks:
            for _ in range(reps):
                results[framework]["start_s"].append(_start_s(_driver(cluster, framework, "start")))
                print(f"{framework} cold start: {results[framework]['start_s'][-1]:.2f}s", flush=True)
            # Ray Train waits ~75 s to recover: one repetition of it says enough.
            for _ in range(reps if framework != "ray" else 1):
                loss = _loss(_driver(cluster, framework, "loss"), cluster.hosts[1].ip)
                results[framework]["loss"].append(loss)
                print(f"{framework} host loss: first report {loss['recover_s']:.2f}s after the kill "
                      f"({loss['world_size_after']} workers), missing steps {loss['steps_missing']}", flush=True)
                cluster.restart(cluster.hosts[1])
                _wait_dead_gone(cluster)
    finally:
        cluster.shutdown()

    if args.keep_others and (RESULTS / "cluster.json").exists():
        earlier = json.loads((RESULTS / "cluster.json").read_text())["results"]
        ran = list(frameworks)
        frameworks = [f for f in ("sgd", "sgd-inplace", "ray") if f in ran or f in earlier]
        results = {f: results[f] if f in ran else earlier[f] for f in frameworks}
    data: Dict[str, Any] = {"machine": machine(loadavg=loadavg()), "cluster": "head 127.0.0.2 (0 CPU) + "
                            "2 worker hosts x 2 CPU, private /tmp,/dev/shm", "results": results}
    summary = {}
    for framework in frameworks:
        r = results[framework]
        summary[framework] = {
            "start_s": statistics.median(r["start_s"]),
            "recover_s": statistics.median([x["recover_s"] for x in r["loss"]]),
            "recover_runs": [round(x["recover_s"], 2) for x in r["loss"]],
            "steps_missing": sorted({s for x in r["loss"] for s in x["steps_missing"]}),
            # (a step the old group finished just after the kill makes the first step after it
            # come later: nothing was run again then, not "-1")
            "steps_redone": [max(0, x["last_step_before_kill"] - x["first_step_after"] + 1) for x in r["loss"]],
            "survivors_restarted": [x["survivors_restarted"] for x in r["loss"]],
        }
    data["summary"] = summary
    lines = ["# A three-host cluster: cold start and host loss", "",
             f"{reps} repetitions (Ray Train's host loss: 1), medians; load average at the end "
             f"{data['machine']['loadavg']}.", "",
             "| framework | cold start, 4 workers (s) | host lost: kill → first report after recovery (s) "
             "| runs | steps lost | steps run again | surviving processes restarted |",
             "|---|---|---|---|---|---|---|"]
    names = {"sgd": "sgd, restart from checkpoint", "sgd-inplace": "sgd, in place (sgd.elastic.run)",
             "ray": "Ray Train " + data["machine"]["ray"]}
    for framework in frameworks:
        s = summary[framework]
        restarted = "n/a" if None in s["survivors_restarted"] else s["survivors_restarted"]
        lines.append(f"| {names[framework]} | {s['start_s']:.2f} | {s['recover_s']:.2f} | {s['recover_runs']} "
                     f"| {s['steps_missing'] or 'none'} | {s['steps_redone']} | {restarted} |")
    for framework in ("sgd", "sgd-inplace"):
        if framework in summary and "ray" in summary:
            ratio = summary["ray"]["recover_s"] / summary[framework]["recover_s"]
            data["summary"][f"recover_speedup_{framework}"] = ratio
            lines += ["", f"{names[framework]} recovers from a lost host {ratio:.1f}x faster than Ray Train."]
    markdown = "\n".join(lines) + "\n"
    save("cluster", data, markdown, RESULTS)
    print(markdown)


def _wait_dead_gone(cluster: Any) -> None:
    from sgd_testing.fixtures import wait_for

    alive_ips = [n["ip"] for n in cluster.nodes() if n["alive"]]
    wait_for(lambda: len([n for n in cluster.nodes() if n["alive"]]) == 1 + len(cluster.hosts), timeout=90,
             message=f"a lost node is still alive for Ray: {alive_ips}")


if __name__ == "__main__":
    main()
