"""A dict checkpoint's state as its codec wrote it, read and verified but not yet decoded.

Decoding may need the framework the codec belongs to (``torch.load`` for the ``"torch"``
codec): a driver that restarts a run from its latest checkpoint would import it just to
unpickle the state and pickle it again for the workers, which have the framework already.
A cold ``import torch`` made a restart after a lost host 1.2 s slower on the driver (issue 35).
So a restart sends the workers an :class:`EncodedState`, and each decodes it where the run
asks for it (``sgd.load_checkpoint()``).

The codec is looked up by its name among the registered codecs, on the side that decodes; no
module is imported by a name read from the checkpoint.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import IO, Any, Dict, List, Optional

from sgd.checkpoint.codecs import Codec, get_codec, untrusted_error
from sgd.checkpoint.preprocessor import PREPROCESSOR_KEY
from sgd.errors import CheckpointError, CheckpointIntegrityError, UntrustedCheckpointError


@dataclass(frozen=True)
class EncodedState:
    """The verified bytes of a dict checkpoint's state file and how to decode them.

    :param codec: the name of the registered codec that wrote ``data``.
    :param data: the state file's bytes (its digest was checked when it was read).
    :param trusted: whether decoding may unpickle arbitrary objects (resolved when it was read).
    :param where: the checkpoint it came from, for error messages.
    :param needs_trust: the types the writer recorded as needing the full unpickler.
    :param preprocessor: the checkpoint's encoded preprocessor, if it has one.
    :param state_file: the state file's name, for error messages.
    """

    codec: str
    data: bytes
    trusted: bool
    where: str
    needs_trust: Optional[List[str]] = None
    preprocessor: Optional[bytes] = None
    state_file: str = "its state file"

    def decode(self, hook: Optional[Any] = None) -> Dict[str, Any]:
        """The state, decoded by the registered codec of that name (asked of ``hook``, a plugin
        manager, or the process-wide one).

        :raises CheckpointIntegrityError: no codec has that name, or the bytes do not decode.
        :raises UntrustedCheckpointError: the state needs pickle and it was not trusted.
        """
        codec = get_codec(self.codec, self.where, hook)
        return decode_state(codec, io.BytesIO(self.data), self.trusted, self.where, self.needs_trust,
                            self.preprocessor, self.state_file)


def decode_state(codec: Codec, source: IO[bytes], trusted: bool, where: str, needs_trust: Any,
                 preprocessor: Optional[bytes], name: str = "its state file") -> Dict[str, Any]:
    """Decode a dict checkpoint's state from ``source`` with ``codec``, as every reader does:
    an untrusted state names the types that need trust; anything else that fails to decode is
    a damaged checkpoint; the preprocessor's bytes go under its key."""
    try:
        state = codec.load(source, trusted, where)
    except UntrustedCheckpointError as exc:
        if isinstance(needs_trust, list) and needs_trust and "objects of type" not in str(exc):
            raise untrusted_error(where, [str(t) for t in needs_trust]) from None
        raise
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointIntegrityError(
            f"checkpoint {where}: cannot decode {name} with codec {codec.name!r} "
            f"({type(exc).__name__}: {exc}); it is damaged or was not written by sgd"
        ) from exc
    if not isinstance(state, dict):
        raise CheckpointIntegrityError(f"checkpoint {where}: its state is a {type(state).__name__}, not a dict")
    if preprocessor is not None:  # bytes: decoded by get_preprocessor()
        state[PREPROCESSOR_KEY] = preprocessor
    return state


def decoded(state: Any, hook: Optional[Any] = None) -> Any:
    """``state`` decoded if it is an :class:`EncodedState`, else as it is."""
    return state.decode(hook) if isinstance(state, EncodedState) else state


__all__ = ["EncodedState", "decode_state", "decoded"]
