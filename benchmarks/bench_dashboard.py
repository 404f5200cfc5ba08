"""What sgd-dashboard costs: listing runs, opening a huge run, live latency, memory while following.

    python benchmarks/bench_dashboard.py [--quick] [--runs 1000] [--rounds 1000000] [--follow-s 60]

Run folders are written directly (the files sgd's driver writes, no Ray). Cases (issue 54):

- list 1,000 runs, cold (a new server: every run summed up, its sparkline sampled) and warm (the
  index cached by size and mtime), through ``GET /api/runs``; target <= 1 s;
- open a run of 1,000,000 report rounds (2 ranks): ``GET /api/runs/<id>`` and ``/metrics`` for 2
  metrics on a server that never saw it; target <= 1 s. The first answer is cut from lines
  sampled across the file while its columns are read in the background; the time until the exact
  min/max answer, and that answer's time, are reported beside it;
- latency from a round appended to ``results.jsonl`` (flushed) to a client of the event stream
  receiving it (``sgd dashboard`` in its own process, on loopback); target <= 1 s;
- the server's RSS while a client follows a run that grows by 100 rounds/s (and polls
  ``/metrics`` every 5 s, as a reopened page would): it must not grow but by the new rounds' columns.

Results: ``benchmarks/results/dashboard.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

sys.path.insert(0, str(Path(__file__).parent))

from _results import RESULTS, loadavg, machine, write

T0 = 1_790_000_000
HOST = socket.gethostname()
_ROUND = ('[{{"loss": {loss}, "acc": {acc}, "_timestamp": {t}, "_time_this_iter_s": 0.01, "_training_iteration": {i}, '
          '"_date": "2026-11-29_00-00-00", "_time_total_s": {tt}, "_pid": 1000, "_hostname": "' + HOST + '", '
          '"_node_ip": "192.0.2.2"}}, {{"loss": {loss1}, "acc": {acc}, "_timestamp": {t}, "_time_this_iter_s": 0.011, '
          '"_training_iteration": {i}, "_date": "2026-11-29_00-00-00", "_time_total_s": {tt}, "_pid": 1001, '
          '"_hostname": "' + HOST + '", "_node_ip": "192.0.2.2"}}]\n')


def round_line(i: int) -> str:
    loss = 1.0 / i
    return _ROUND.format(loss=loss, loss1=loss + 0.01, acc=min(1.0, i * 1e-6), t=T0 + i // 100, i=i, tt=i * 0.01)


def make_run(folder: Path, rounds: int, status: str = "FINISHED", pid: int = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer.json").write_text(json.dumps({"backend": "torch", "num_workers": 2, "trial_id": None}))
    (folder / "status.json").write_text(json.dumps({"status": status, "time": T0 + rounds, "pid": pid,
                                                    "host": HOST, "attempt": 1}))
    with open(folder / "results.jsonl", "w") as f:
        step = 10_000
        for start in range(1, rounds + 1, step):
            f.write("".join(round_line(i) for i in range(start, min(rounds, start + step - 1) + 1)))
    return folder


def _client(root: Path) -> Any:
    from sgd_dashboard import create_app
    from starlette.testclient import TestClient

    return TestClient(create_app(root), base_url="http://127.0.0.1:6007")


def bench_listing(work: Path, count: int, repeat: int) -> Dict[str, Any]:
    root = work / "many"
    for n in range(count):
        make_run(root / f"exp_{n:04d}" / "run_001", rounds=100)
    cold, warm, cold_cpu = [], [], []
    for _ in range(repeat):
        client = _client(root)
        begun, cpu = time.perf_counter(), time.process_time()
        rows = client.get("/api/runs").json()["runs"]
        cold.append(time.perf_counter() - begun)
        cold_cpu.append(time.process_time() - cpu)
        assert len(rows) == count and all(r["metric"] and len(r["metric"]["spark"]) == 64 for r in rows)
        for _ in range(3):
            begun = time.perf_counter()
            client.get("/api/runs")
            warm.append(time.perf_counter() - begun)
    return {"cold_s": cold, "warm_s": warm, "cold_cpu_s": cold_cpu}


def bench_open(work: Path, rounds: int, repeat: int) -> Dict[str, Any]:
    root = work / "big"
    begun = time.perf_counter()
    run = make_run(root / "run_001", rounds)
    written = time.perf_counter() - begun
    size = (run / "results.jsonl").stat().st_size
    opens, exact_wait, exact, open_cpu = [], [], [], []
    for n in range(repeat):
        client = _client(root)
        begun, cpu = time.perf_counter(), time.process_time()
        (row,) = client.get("/api/runs").json()["runs"]
        detail = client.get(f"/api/runs/{row['id']}").json()
        body = client.get(f"/api/runs/{row['id']}/metrics", params={"names": "loss,acc"}).json()
        opens.append(time.perf_counter() - begun)
        open_cpu.append(time.process_time() - cpu)
        assert detail["metrics"] == ["loss", "acc"] and len(body["series"]) == 2 and body["total_points"] == rounds
        if n < repeat - 1:  # the columns are read (and timed) once, on the last server
            client.app.state.dashboard.close()  # type: ignore[attr-defined]
            continue
        begun = time.perf_counter()
        while not body["complete"]:
            time.sleep(0.5)
            body = client.get(f"/api/runs/{row['id']}/metrics", params={"names": "loss,acc"}).json()
        exact_wait.append(time.perf_counter() - begun)
        for _ in range(3):
            begun = time.perf_counter()
            body = client.get(f"/api/runs/{row['id']}/metrics", params={"names": "loss,acc"}).json()
            exact.append(time.perf_counter() - begun)
        assert (body["downsampled"] or rounds <= 2000) and len(body["series"][0]["x"]) <= 2000
        assert body["series"][0]["y"][0] == 1.0
        columns = client.app.state.dashboard.columns  # type: ignore[attr-defined]
        held = sum(r.nbytes() for r in columns._runs.values())
    return {"rounds": rounds, "file_bytes": size, "write_s": written, "open_s": opens, "open_cpu_s": open_cpu,
            "columns_read_s": exact_wait, "exact_metrics_s": exact, "columns_bytes": held}


def _serve(root: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "sgd", "dashboard", str(root), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()  # type: ignore[union-attr]
    m = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"sgd dashboard did not print its URL: {line!r} {proc.stderr.read()}")  # type: ignore
    proc.url = m.group(1)  # type: ignore[attr-defined]
    return proc


def sse_messages(lines: Iterator[str]) -> Iterator[Dict[str, str]]:
    """The messages of an event stream (its comments left out)."""
    message: Dict[str, str] = {}
    for line in lines:
        if line == "":
            if message:
                yield message
            message = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            message[key] = value[1:] if value.startswith(" ") else value


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_live(work: Path, samples: int, follow_s: float, poll_metrics: bool = True) -> Dict[str, Any]:
    import httpx

    root = work / "live"
    run = make_run(root / "run_001", rounds=10, status="RUNNING", pid=os.getpid())
    results = run / "results.jsonl"
    server = _serve(root)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:  # type: ignore[attr-defined]
            (row,) = client.get("/api/runs").json()["runs"]
            rid = row["id"]
            latencies: List[float] = []
            next_round = [11]
            with client.stream("GET", f"/api/runs/{rid}/stream", params={"names": "loss"}) as r:
                messages = sse_messages(r.iter_lines())
                for _ in range(samples):
                    with open(results, "a") as f:
                        f.write(round_line(next_round[0]))
                        f.flush()
                        written = time.perf_counter()
                    next_round[0] += 1
                    for m in messages:
                        if m.get("event") == "rounds":
                            latencies.append(time.perf_counter() - written)
                            break
                    time.sleep(0.05 + (len(latencies) % 7) * 0.03)  # not in step with the server's polls
            # Follow a run that grows by 100 rounds a second.
            stop = threading.Event()
            received = [0]

            def follow() -> None:
                try:
                    with client.stream("GET", f"/api/runs/{rid}/stream", params={"names": "loss,acc"}) as r:
                        for m in sse_messages(r.iter_lines()):
                            if m.get("event") == "rounds":
                                received[0] += json.loads(m["data"])["rows"]
                            if stop.is_set():
                                return
                except httpx.HTTPError:
                    if not stop.is_set():
                        raise

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            rss = [(0.0, _rss_mb(server.pid))]
            begun = time.monotonic()
            last_poll = begun
            while time.monotonic() - begun < follow_s:
                with open(results, "a") as f:
                    f.write("".join(round_line(next_round[0] + k) for k in range(10)))
                next_round[0] += 10
                time.sleep(0.1)
                if time.monotonic() - last_poll >= 5:
                    if poll_metrics:  # as a page opened again would: the run's columns grow with it
                        client.get(f"/api/runs/{rid}/metrics", params={"names": "loss,acc"})
                    last_poll = time.monotonic()
                    rss.append((round(last_poll - begun, 1), _rss_mb(server.pid)))
            stop.set()
            written_rounds = next_round[0] - 11 - samples
            follower.join(10)
    finally:
        server.terminate()
        server.wait(30)
    return {"latency_s": latencies, "rss_mb": rss, "followed_rounds": written_rounds, "received_rounds": received[0],
            "follow_s": follow_s, "metrics_polled": poll_metrics}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer runs and rounds, shorter follow")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--follow-s", type=float, default=None)
    parser.add_argument("--stream-only", action="store_true",
                        help="while following, only the event stream (no /metrics every 5 s)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where dashboard.{json,md} go")
    args, _ = parser.parse_known_args()  # `nox -s bench` hands every script the same arguments
    count = args.runs or (200 if args.quick else 1000)
    rounds = args.rounds or (100_000 if args.quick else 1_000_000)
    follow_s = args.follow_s or (15.0 if args.quick else 60.0)
    repeat = 1 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="sgd_bench_dashboard_") as tmp:
        work = Path(tmp)
        loads = {"before_listing": loadavg()}
        listing = bench_listing(work, count, repeat)
        loads["before_open"] = loadavg()
        print(f"list {count} runs: cold {listing['cold_s']}, warm {listing['warm_s']}", flush=True)
        opened = bench_open(work, rounds, repeat)
        print(f"open {rounds} rounds: {opened['open_s']} (exact after {opened['columns_read_s']})", flush=True)
        loads["before_live"] = loadavg()
        live = bench_live(work, 20 if args.quick else 50, follow_s, poll_metrics=not args.stream_only)
        print(f"latency {live['latency_s']}, rss {live['rss_mb']}", flush=True)

    def case(name: str, values: List[float], unit: str, target: str, limit: Optional[float] = None) -> Dict[str, Any]:
        med = statistics.median(values)
        return {"case": name, "median": med if unit != "ms" else med * 1000, "unit": unit,
                "spread": f"{min(values):.3f}–{max(values):.3f} s" if unit == "s" else
                          f"{min(values) * 1000:.0f}–{max(values) * 1000:.0f} ms (p95 "
                          f"{sorted(values)[int(0.95 * (len(values) - 1))] * 1000:.0f} ms)",
                "target": target, "met": None if limit is None else med <= limit}

    rss = [mb for _, mb in live["rss_mb"]]
    cases = [
        case(f"list {count} runs, cold", listing["cold_s"], "s", "<= 1 s", 1.0),
        case("… CPU seconds of the server process (cold)", listing["cold_cpu_s"], "s", "—"),
        case(f"list {count} runs, warm", listing["warm_s"], "s", "<= 1 s", 1.0),
        case(f"open a run of {rounds:,} rounds (run + 2 metrics, sampled)", opened["open_s"], "s", "<= 1 s", 1.0),
        case("… CPU seconds of the server process (and of its background reader)", opened["open_cpu_s"], "s", "—"),
        case("… until its columns are read (background)", opened["columns_read_s"], "s", "—"),
        case("… then /metrics for 2 metrics, exact min/max", opened["exact_metrics_s"], "s", "<= 1 s", 1.0),
        case("round on disk → SSE client", live["latency_s"], "ms", "<= 1000 ms", 1.0),
        {"case": f"server RSS following a run {live['follow_s']:.0f} s at 100 rounds/s", "median": rss[-1],
         "unit": "MB", "spread": f"{rss[0]:.0f} → {max(rss):.0f} MB ({live['followed_rounds']} rounds)",
         "target": "flat", "met": None},
    ]
    meta = machine(loadavg=loadavg(), loadavg_during=loads, runs=count, rounds=rounds, file_bytes=opened["file_bytes"],
                   columns_bytes=opened["columns_bytes"], follow=live)
    table = write("dashboard", "# sgd-dashboard\n\nListing, opening, live latency and memory "
                               "(benchmarks/bench_dashboard.py).", meta, cases, args.out)
    print(table)


if __name__ == "__main__":
    main()
