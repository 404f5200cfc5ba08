"""A live dashboard server for tests that need real HTTP (the event stream, the browser):
uvicorn on a free loopback port in a thread; and a reader of server-sent events."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator

from sgd_testing import wait_for


@contextmanager
def live_server(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a thread; yields its base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=20, message="the dashboard's server did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


def sse_messages(lines: Iterator[str]) -> Iterator[Dict[str, Any]]:
    """Server-sent events as ``{"id", "event", "data"}`` dicts (comments as ``{"comment"}``)."""
    message: Dict[str, Any] = {}
    for line in lines:
        if line == "":
            if message:
                yield message
            message = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            key, _, value = line.partition(":")
            message[key] = value[1:] if value.startswith(" ") else value
