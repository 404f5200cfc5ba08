"""The browser tests' fixtures: headless Chromium driven by Playwright for Python, the real
dashboard server (:func:`sgd_dashboard.app.create_app` under uvicorn, in a thread, on a free
loopback port), a page that records every request, dialog and error, and run folders written
file by file (no Ray).

The browser is Debian's ``chromium`` (``apt-get install chromium chromium-driver``) through
``executable_path``: Playwright's own browser download is never used. Without it, or without the
``playwright`` package, every browser test is skipped with a message saying how to install it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

CHROMIUM = os.environ.get("SGD_DASHBOARD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
INSTALL = ("the browser tests need Debian's Chromium and Playwright for Python: `apt-get install chromium "
           "chromium-driver` and `pip install playwright` (never `playwright install`: the system browser is used)")
#: The repository's docs/images, where SGD_DASHBOARD_SCREENSHOTS=1 makes the tests save their screenshots.
IMAGES = Path(__file__).resolve().parents[4] / "docs" / "images"
HOST = "vm-test"


def _missing() -> Optional[str]:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f"playwright is not installed; {INSTALL}"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM}; {INSTALL}"
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the session."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: the tests may run as root (CI containers), where Chromium's sandbox refuses to start
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


class Server:
    """The dashboard on a free loopback port, served by uvicorn in a thread."""

    def __init__(self, root: Path, **options: Any):
        import uvicorn

        from sgd_dashboard.app import create_app

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        options.setdefault("poll_s", 0.1)
        app = create_app(root, port=self.port, **options)
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive(), "the dashboard's server thread ended while starting"
            assert time.monotonic() < deadline, "the dashboard's server did not start within 30 s"
            self.thread.join(0.02)

    def api(self, path: str) -> Any:
        """GET a JSON endpoint."""
        import urllib.request

        with urllib.request.urlopen(self.url + path, timeout=30) as resp:
            return json.load(resp)

    def run_id(self, name: str) -> str:
        """The server's id of the run named ``name`` (its path below the root)."""
        ids = [r["id"] for r in self.api("/api/runs")["runs"] if r["name"] == name]
        assert ids, f"no run {name!r} in /api/runs"
        return ids[0]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    """``serve(root, **create_app options)`` starts a server; all are stopped after the test."""
    started: List[Server] = []

    def start(root: Path, **options: Any) -> Server:
        started.append(Server(root, **options))
        return started[-1]

    yield start
    for s in started:
        s.stop()


@dataclass
class Watched:
    """A page and what it did: every request's URL, every response's status, dialogs, errors."""

    page: Any
    requests: List[str] = field(default_factory=list)
    failed: List[str] = field(default_factory=list)
    dialogs: List[str] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)

    def foreign(self, origin: str) -> List[str]:
        """The requests to anywhere but ``origin``."""
        return [u for u in self.requests if not (u == origin or u.startswith(origin + "/"))]


@pytest.fixture
def open_page(browser: Any) -> Iterator[Callable[[str], Watched]]:
    """``open_page(url)``: a fresh browser context (1440x1000) on ``url``, recorded."""
    contexts = []

    def opener(url: str) -> Watched:
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        w = Watched(page)
        page.on("request", lambda r: w.requests.append(r.url))
        page.on("response", lambda r: r.status >= 400 and w.failed.append(f"{r.status} {r.url}"))
        page.on("requestfailed", lambda r: "/stream" not in r.url and w.failed.append(f"failed {r.url}: {r.failure}"))

        def dialog(d: Any) -> None:
            w.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", dialog)
        page.on("pageerror", lambda e: w.errors.append(f"page error: {e}"))
        page.on("console", lambda m: m.type == "error" and w.errors.append(f"console: {m.text}"))
        page.goto(url)
        return w

    yield opener
    for c in contexts:
        c.close()


def screenshot(page: Any, name: str) -> None:
    """Save the page as docs/images/dashboard-NAME.png when SGD_DASHBOARD_SCREENSHOTS=1."""
    if os.environ.get("SGD_DASHBOARD_SCREENSHOTS") == "1":
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMAGES / f"dashboard-{name}.png"), full_page=False)


# -- run folders written file by file ------------------------------------------------------------

def rounds(start: int, count: int, ranks: int, t0: float, metrics: Callable[[int, int], Dict[str, Any]],
           pids: Optional[List[int]] = None, step_s: float = 1.0) -> List[str]:
    """``count`` lines of ``results.jsonl`` from iteration ``start``: one dict per rank."""
    pids = pids or [1000 + r for r in range(ranks)]
    lines = []
    for it in range(start, start + count):
        t = t0 + it * step_s
        lines.append(json.dumps([{**metrics(it, rank), "_training_iteration": it, "_timestamp": int(t),
                                  "_time_this_iter_s": step_s * (1.5 if rank == ranks - 1 else 1.0),
                                  "_date": time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(t)),
                                  "_time_total_s": it * step_s, "_pid": pids[rank], "_hostname": HOST,
                                  "_node_ip": "192.0.2.2"} for rank in range(ranks)]))
    return lines


def loss(it: int, rank: int) -> Dict[str, Any]:
    """A falling loss, an accuracy, a learning rate: metrics that look like training."""
    import math

    return {"loss": 2.0 * math.exp(-it / 25) + 0.05 * math.sin(it + rank) + 0.1,
            "accuracy": 1 - math.exp(-it / 20) * 0.9, "lr": 0.1 * 0.98 ** it}


def event(kind: str, t: float, **fields: Any) -> Dict[str, Any]:
    return {"v": 1, "time": t, "event": kind, **fields}


def write_run(root: Path, name: str, *, status: str = "FINISHED", ranks: int = 2, iterations: int = 40,
              t0: Optional[float] = None, metrics: Callable[[int, int], Dict[str, Any]] = loss,
              events: Optional[List[Dict[str, Any]]] = None, lines: Optional[List[str]] = None,
              logs: Optional[Dict[int, str]] = None, checkpoints: Optional[List[int]] = None,
              settings: Optional[Dict[str, Any]] = None, driver_alive: bool = True) -> Path:
    """A run folder as sgd writes it: trainer.json, status.json, results.jsonl (``lines``, else
    ``iterations`` rounds of ``metrics``), events.jsonl, logs/rank_N.log and checkpoints. A
    ``RUNNING`` run's driver is this process (alive), or with ``driver_alive=False`` a pid that does
    not exist on this host (the run reads as ``DRIVER_DIED``)."""
    run = root / name
    run.mkdir(parents=True)
    t0 = time.time() - iterations - 60 if t0 is None else t0
    (run / "trainer.json").write_text(json.dumps({
        "backend": "torch", "num_workers": ranks, "use_gpu": False, "max_retries": 1, "format_version": 1,
        "sgd_version": "0.1.0", "run_config": {"name": name}, **(settings or {})}))
    running = status == "RUNNING"
    if lines is None:
        lines = rounds(1, iterations, ranks, t0, metrics)
    last = json.loads(lines[-1])[0]["_timestamp"] + 1 if lines else t0
    driver = os.getpid() if running and driver_alive else 999_999_999
    (run / "status.json").write_text(json.dumps({
        "status": status, "time": t0 if running else last, "pid": driver,
        "host": socket.gethostname() if running else HOST, "attempt": 1}))
    os.utime(run / "trainer.json", (t0, t0))  # the run's start, as the index reads it
    (run / "results.jsonl").write_text("".join(line + "\n" for line in lines))
    if events is not None:
        (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if logs:
        (run / "logs").mkdir()
        for rank, text in logs.items():
            (run / "logs" / f"rank_{rank}.log").write_text(text)
    for it in checkpoints or []:
        ckpt = run / "checkpoints" / f"checkpoint_{it:06d}"
        ckpt.mkdir(parents=True)
        (ckpt / "model.pt").write_bytes(b"\0" * 2048 * it)
        (ckpt / ".sgd_checkpoint.json").write_text(json.dumps({
            "id": it, "iteration": it, "score": None, "timestamp": t0 + it, "metrics": metrics(it, 0)}))
    return run


def log_header(rank: int, pid: int, t: float) -> str:
    """The line a worker start writes at the top of its part of logs/rank_N.log."""
    return f"=== rank {rank}: pid {pid} on {HOST}, {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))} ===\n"


class Make:
    """What a test builds run folders with (the fixture ``make``): ``make.run``, ``make.rounds``,
    ``make.event``, ``make.log_header``, ``make.loss``, and ``make.screenshot``."""

    run = staticmethod(write_run)
    rounds = staticmethod(rounds)
    event = staticmethod(event)
    log_header = staticmethod(log_header)
    loss = staticmethod(loss)
    screenshot = staticmethod(screenshot)


@pytest.fixture
def make() -> Make:
    """The run-folder builders (:class:`Make`)."""
    return Make()
