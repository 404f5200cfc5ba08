"""What ``DataParallelTrainer.fit()`` keeps in its run directory so that ``restore()`` can go on.

A run directory may come from elsewhere (copied from a colleague, a shared bucket), so reading
it back must not run code. The trainer's settings are kept as JSON (``air_trainer.json``):
plain values, the AIR config dataclasses sgd-core names, and backend configs, which are rebuilt
through the backend registry by their name, never by importing a name read from the file.
What JSON cannot hold (the training function, callbacks, arbitrary objects in a config) is
pickled apart, in ``air_trainer.pkl``, and each such value leaves a marker with its dotted name
in the JSON. Restoring reads the pickle only when a marker's value was not passed again and
the caller trusts the directory (``trusted=True`` or ``SGD_TRUST_CHECKPOINTS=1``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import numbers
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

logger = logging.getLogger(__name__)

STATE_FILE = "air_trainer.json"
PICKLE_FILE = "air_trainer.pkl"
FORMAT = 1
_TAG = "$sgd"


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class _Encoder:
    def __init__(self, known: Iterable[type], backend_name: Callable[[Any], Optional[str]]) -> None:
        self._known = {class_name(c): c for c in known}
        self._backend_name = backend_name
        self.pickled: Dict[str, Any] = {}

    def encode(self, value: Any, where: str) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, numbers.Integral):  # numpy's integers
            return int(value)
        if isinstance(value, numbers.Real):
            return float(value)
        if isinstance(value, (list, tuple)):
            items = [self.encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
            return items if isinstance(value, list) else {_TAG: "tuple", "items": items}
        if isinstance(value, dict) and all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: self.encode(v, f"{where}.{k}") for k, v in value.items()}
        if isinstance(value, Path):
            return {_TAG: "path", "value": str(value)}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
            name = self._backend_name(value)
            if name is not None:
                return {_TAG: "backend", "name": name,
                        "fields": {k: self.encode(v, f"{where}.{k}") for k, v in fields.items()}}
            if self._known.get(class_name(type(value))) is type(value):
                return {_TAG: "config", "type": class_name(type(value)),
                        "fields": {k: self.encode(v, f"{where}.{k}") for k, v in fields.items()}}
        self.pickled[where] = value
        return {_TAG: "pickled", "name": where}


def save(run_dir: Path, cls: type, state: Mapping[str, Any], known: Iterable[type],
         backend_name: Callable[[Any], Optional[str]]) -> None:
    """Write ``state`` (attribute name → value) as ``air_trainer.json``, and what JSON cannot
    hold as ``air_trainer.pkl``. A value that cannot be pickled either is left out with a
    warning: restoring then needs it passed again."""
    encoder = _Encoder(known, backend_name)
    tree = {key: encoder.encode(value, key) for key, value in state.items()}
    unpicklable: List[str] = []
    if encoder.pickled:
        import ray.cloudpickle as cloudpickle

        kept: Dict[str, bytes] = {}
        for name, value in encoder.pickled.items():
            try:
                kept[name] = cloudpickle.dumps(value)
            except Exception as exc:  # e.g. a callback holding a lock
                unpicklable.append(name)
                logger.warning("%s of the trainer could not be pickled; restore() will need it passed again: %s",
                               name, exc)
        _write(run_dir / PICKLE_FILE, cloudpickle.dumps(kept))
    else:
        (run_dir / PICKLE_FILE).unlink(missing_ok=True)
    document = {"format": FORMAT, "class": class_name(cls), "state": tree,
                "pickled": sorted(encoder.pickled), "unpicklable": sorted(unpicklable)}
    _write(run_dir / STATE_FILE, json.dumps(document, indent=1, allow_nan=True).encode())


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def exists(run_dir: Path) -> bool:
    return (run_dir / STATE_FILE).is_file()


class SavedTrainer:
    """``air_trainer.json`` of one run directory, read once.

    :raises ValueError: the file cannot be read or is not in this version's format.
    """

    def __init__(self, run_dir: Path) -> None:
        path = run_dir / STATE_FILE
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path} cannot be read ({exc}); the run cannot be restored") from exc
        if (not isinstance(document, dict) or document.get("format") != FORMAT
                or not isinstance(document.get("state"), dict)):
            raise ValueError(f"{path} is not a trainer state this version of sgd writes (format {FORMAT})")
        self.run_dir = run_dir
        self._document = document
        #: The attribute names the saved trainer has.
        self.keys: List[str] = list(document["state"])

    def saved_class(self, candidates: Iterable[type]) -> type:
        """The class among ``candidates`` (already imported) that wrote the run.

        :raises TypeError: none of them did.
        """
        name = self._document["class"]
        for cls in candidates:
            if class_name(cls) == name:
                return cls
        raise TypeError(f"{self.run_dir} was written by {name}, which is neither the class restore() was called "
                        "on nor one of its subclasses; call restore() on that class")

    def load(self, given: Iterable[str], trusted: bool, known: Iterable[type],
             backend_config: Callable[[str, Dict[str, Any]], Any], who: str) -> Dict[str, Any]:
        """The saved state, attribute name → value, without the attributes in ``given`` (the
        caller passes them again).

        :param trusted: whether values kept only pickled may be unpickled.
        :raises sgd.UntrustedCheckpointError: a value not given again is kept only pickled and
            ``trusted`` is false (the message names each one).
        :raises ValueError: a value not given again could not be saved at all.
        """
        from sgd.errors import UntrustedCheckpointError

        run_dir, document = self.run_dir, self._document
        given = set(given)
        state = {k: v for k, v in document["state"].items() if k not in given}
        needed = [n for n in document.get("pickled", []) if _top(n) not in given]
        lost = [n for n in document.get("unpicklable", []) if n in needed]
        if lost:
            raise ValueError(f"{run_dir}: the trainer's {', '.join(lost)} could not be saved when the run started; "
                             f"pass {', '.join(sorted({_top(n) + '=' for n in lost}))} to {who}.restore()")
        pickled: Dict[str, Any] = {}
        if needed:
            if not trusted:
                arguments = ", ".join(sorted({_top(n) + "=..." for n in needed}))
                raise UntrustedCheckpointError(
                    f"{run_dir}: the trainer's {', '.join(needed)} {'is' if len(needed) == 1 else 'are'} kept only "
                    f"pickled ({PICKLE_FILE}), and unpickling runs whatever code the file names. Pass "
                    f"{'it' if len(needed) == 1 else 'them'} again ({who}.restore(path, {arguments})), or pass "
                    "trusted=True (or set SGD_TRUST_CHECKPOINTS=1) if you wrote this run directory yourself."
                )
            import ray.cloudpickle as cloudpickle

            kept = cloudpickle.loads((run_dir / PICKLE_FILE).read_bytes())  # trusted: the caller's word
            pickled = {n: cloudpickle.loads(kept[n]) for n in needed}
        decoder = _Decoder({class_name(c): c for c in known}, backend_config, pickled, run_dir)
        return {k: decoder.decode(v) for k, v in state.items()}


def _top(name: str) -> str:
    for i, ch in enumerate(name):
        if ch in ".[":
            return name[:i]
    return name


class _Decoder:
    def __init__(self, known: Dict[str, type], backend_config: Callable[[str, Dict[str, Any]], Any],
                 pickled: Dict[str, Any], run_dir: Path) -> None:
        self._known = known
        self._backend_config = backend_config
        self._pickled = pickled
        self._run_dir = run_dir

    def decode(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if not isinstance(value, dict):
            return value
        tag = value.get(_TAG)
        if tag is None:
            return {k: self.decode(v) for k, v in value.items()}
        if tag == "tuple":
            return tuple(self.decode(v) for v in value["items"])
        if tag == "path":
            return Path(value["value"])
        if tag == "pickled":
            return self._pickled[value["name"]]
        fields = {k: self.decode(v) for k, v in value["fields"].items()}
        if tag == "backend":
            return self._backend_config(value["name"], fields)
        if tag == "config" and value["type"] in self._known:
            return self._known[value["type"]](**fields)
        raise ValueError(f"{self._run_dir / STATE_FILE}: {value.get('type', tag)!r} is not a config type sgd-core "
                         "writes; the file was not written by this version of sgd")


def state_of(obj: Any, leave_out: Tuple[str, ...]) -> Dict[str, Any]:
    """``obj``'s attributes as :func:`save` keeps them, those in ``leave_out`` set to ``None``."""
    return dict(vars(obj), **{k: None for k in leave_out})
