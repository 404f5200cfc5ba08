"""What a collective's failure looks like when another worker died (a leaf module).

The driver reads it to tell a worker's own error from the echo of a peer's death
(:mod:`sgd.group.rounds`); a worker reads it to tell which failures of a training function
``sgd.elastic.run`` recovers from in place. Horovod raises ``HorovodInternalError`` from every
collective once a peer's failure stopped its background loop."""

from __future__ import annotations

import re

_PEER_FAILURE = re.compile(
    r"connection (reset|closed) by peer|broken pipe|connection refused|socket closed|"
    r"communicator was aborted|nccl.*(remote|abort|error)|gloo/transport|gloo.*(timed out|timeout|connect)|"
    r"DistBackendError|DistNetworkError|HorovodInternalError",
    re.IGNORECASE,
)


def reads_like_peer_failure(type_name: str, message: str) -> bool:
    """Whether an error (its type's name and message) is what a collective raises when a
    peer died or stopped answering."""
    return bool(_PEER_FAILURE.search(f"{type_name}: {message}"))


__all__ = ["reads_like_peer_failure"]
