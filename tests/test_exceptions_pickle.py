"""Every exception class of every sgd package pickles whole: type, message, attributes and
cause, through ``pickle`` and ``cloudpickle`` (what Ray and Ray Tune use to move errors between
processes). The classes are found by reading the packages' sources, so a new one is covered
(and one that does not pickle fails here) without anyone listing it."""

import ast
import importlib
import inspect
import pickle
from pathlib import Path
from typing import List, Tuple

import pytest
import ray.cloudpickle as cloudpickle

import sgd

ROOT = Path(__file__).resolve().parents[1]


def _exception_classes() -> List[Tuple[str, str]]:
    """``(module, class)`` for every public class in the packages' sources whose bases name an
    exception (``...Error``, ``...Exception``, ``BaseException``) or another such class."""
    found: List[Tuple[str, str]] = []
    names = set()
    for src in sorted(ROOT.glob("packages/*/src")):
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            module = ".".join(parts)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                    if any(b.endswith(("Error", "Exception")) or b in names for b in bases):
                        names.add(node.name)
                        if not node.name.startswith("_"):  # private ones never leave their module
                            found.append((module, node.name))
    return found


CLASSES = _exception_classes()


def test_the_walk_finds_the_known_ones():
    found = {name for _, name in CLASSES}
    assert {"WorkerError", "WorkerDiedError", "TrainingFailedError", "ScriptExitError", "RunStopped",
            "CollectiveInExecuteSingleError", "ResourcesUnavailableError"} <= found


def _instance(cls: type) -> BaseException:
    """An instance made the way the code makes one: every required argument filled in by its
    annotation or name."""
    values = []
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        hint = str(p.annotation)
        failure = RuntimeError(f"{p.name} of the failure")
        if hint.lower().startswith(("dict", "typing.dict")):  # by rank: {3: an exception or a text}
            values.append({3: failure if "Exception" in hint else f"{p.name} of the failure"})
        elif "Exception" in hint:
            values.append(failure)
        elif hint.lower().startswith(("list", "typing.list")):
            values.append([3] if "int" in hint else [f"{p.name} of the failure"])
        elif "int" in hint or "rank" in p.name or p.name == "code":
            values.append(3)
        else:
            values.append(f"{p.name} of the failure")
    return cls(*values) if values else cls(f"{cls.__name__} message")


def _comparable(value):
    """``value`` with every exception in it as its type and args (exceptions compare by identity)."""
    if isinstance(value, BaseException):
        return type(value), value.args
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("module,name", CLASSES, ids=[f"{m}.{n}" for m, n in CLASSES])
@pytest.mark.parametrize("dumps,loads", [(pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)],
                         ids=["pickle", "cloudpickle"])
def test_exception_round_trips_whole(module, name, dumps, loads):
    cls = getattr(importlib.import_module(module), name)
    exc = _instance(cls)
    try:
        raise exc from ZeroDivisionError("the root cause")
    except BaseException as raised:
        exc = raised
    back = loads(dumps(exc))
    assert type(back) is cls
    assert str(back) == str(exc) and back.args == exc.args
    assert _comparable(vars(back)) == _comparable(vars(exc))  # the rank, the remote traceback, the exit code...
    assert type(back.__cause__) is ZeroDivisionError and str(back.__cause__) == "the root cause"


def test_worker_error_keeps_rank_and_remote_traceback():
    error = sgd.WorkerError("boom on rank 1", 1, "Traceback (most recent call last):\n  ...\nValueError: boom")
    error.__cause__ = ValueError("boom")
    back = pickle.loads(pickle.dumps(error))
    assert (back.world_rank, back.remote_traceback) == (1, error.remote_traceback)
    assert repr(back.__cause__) == "ValueError('boom')"


def test_a_cause_that_does_not_pickle_travels_as_its_description():
    class Local(Exception):  # a class defined in a function: pickle cannot find it by name
        pass

    error = sgd.WorkerDiedError("worker rank 2 died", 2)
    error.__cause__ = Local("the local reason")
    back = pickle.loads(pickle.dumps(error))
    assert back.world_rank == 2
    assert type(back.__cause__) is RuntimeError
    assert "Local: the local reason" in str(back.__cause__)
