"""Does an sgd module carry a Ray Train module's public names, with compatible signatures?

Issue 53's promise is that Ray Train 2.60 code runs with its imports renamed
(``ray.train.xgboost`` -> ``sgd_xgboost.xgboost``...). :func:`compare` checks one module pair
against the Ray wheel installed beside sgd: every name of the Ray module's ``__all__`` must be
in the sgd module, and every function, class constructor and public method of Ray's must accept
Ray's calls in sgd:

- each of Ray's parameters exists under the same name; a positional one at the same position;
  a keyword-only one may be positional-or-keyword in sgd; ``*args`` / ``**kwargs`` stay;
- each of Ray's defaults is sgd's default (Ray's required parameters may have one in sgd);
- every parameter sgd adds has a default.

A Ray class whose ``__init__`` only forwards ``(*args, **kwargs)`` to a framework class (the
Lightning strategies) is matched by sgd's class deriving from the same framework class.

:func:`compare_in_subprocess` runs it in a fresh interpreter: importing ``ray.train.tensorflow``
imports TensorFlow, which a test session should not carry (nor its Keras choice, fixed at import).
"""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["compare", "compare_in_subprocess", "signature_differences"]

_VAR = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _same_default(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) or repr(a) == repr(b)
    except Exception:  # an object whose == raises
        return repr(a) == repr(b)


def _params(sig: inspect.Signature) -> List[inspect.Parameter]:
    return [p for p in sig.parameters.values() if p.name not in ("self", "cls")]


def signature_differences(ray_sig: inspect.Signature, sgd_sig: inspect.Signature) -> List[str]:
    """What Ray's calls of ``ray_sig`` would find wrong in ``sgd_sig`` (empty: compatible)."""
    out: List[str] = []
    ray_params, sgd_params = _params(ray_sig), _params(sgd_sig)
    sgd_by_name = {p.name: p for p in sgd_params}
    sgd_kinds = {p.kind for p in sgd_params}
    sgd_positional = [p.name for p in sgd_params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    ray_positional = [p.name for p in ray_params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for p in ray_params:
        if p.kind in _VAR:
            if p.kind not in sgd_kinds:
                out.append(f"takes {'*' if p.kind == p.VAR_POSITIONAL else '**'}{p.name} in Ray, not in sgd")
            continue
        q = sgd_by_name.get(p.name)
        if q is None:
            out.append(f"no parameter {p.name!r}" + (" (only through **kwargs)" if q is None and
                                                     inspect.Parameter.VAR_KEYWORD in sgd_kinds else ""))
            continue
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            at = ray_positional.index(p.name)
            if q.kind not in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD) or sgd_positional.index(p.name) != at:
                out.append(f"{p.name!r} is positional #{at} in Ray, not in sgd")
        elif q.kind == q.POSITIONAL_ONLY:
            out.append(f"{p.name!r} is keyword-only in Ray, positional-only in sgd")
        if p.default is not p.empty:
            if q.default is q.empty:
                out.append(f"{p.name!r} has a default in Ray ({p.default!r}), none in sgd")
            elif not _same_default(p.default, q.default):
                out.append(f"{p.name!r} defaults to {p.default!r} in Ray, {q.default!r} in sgd")
    ray_names = {p.name for p in ray_params}
    for q in sgd_params:
        if q.name not in ray_names and q.kind not in _VAR and q.default is q.empty:
            out.append(f"sgd's extra parameter {q.name!r} has no default")
    return out


def _signature(obj: Any) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _forwards_only(sig: inspect.Signature) -> bool:
    kinds = [p.kind for p in _params(sig)]
    return bool(kinds) and all(k in _VAR for k in kinds)


def _framework_base(cls: type) -> Optional[type]:
    for base in cls.__mro__[1:]:
        if not base.__module__.startswith("ray.") and base is not object:
            return base
    return None


def _compare_class(name: str, ray_cls: type, sgd_obj: Any) -> List[str]:
    if not inspect.isclass(sgd_obj):
        return [f"{name}: a class in Ray, a {type(sgd_obj).__name__} in sgd"]
    out: List[str] = []
    ray_init = _signature(vars(ray_cls)["__init__"]) if "__init__" in vars(ray_cls) else None
    if ray_init is not None and _forwards_only(ray_init):
        base = _framework_base(ray_cls)
        if base is not None and not issubclass(sgd_obj, base):
            out.append(f"{name}: Ray's derives from {base.__module__}.{base.__qualname__}, sgd's does not")
    elif ray_init is not None:
        sgd_init = _signature(sgd_obj.__init__)
        if sgd_init is not None:
            out += [f"{name}(): {d}" for d in signature_differences(ray_init, sgd_init)]
    for attr, value in vars(ray_cls).items():
        if attr.startswith("_"):
            continue
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        if isinstance(value, property):
            if not hasattr(sgd_obj, attr):
                out.append(f"{name}.{attr}: no such property in sgd")
            continue
        if not callable(value):
            if not hasattr(sgd_obj, attr):
                out.append(f"{name}.{attr}: no such attribute in sgd")
            continue
        if not hasattr(sgd_obj, attr):
            out.append(f"{name}.{attr}(): no such method in sgd")
            continue
        ray_sig, sgd_sig = _signature(value), _signature(inspect.getattr_static(sgd_obj, attr))
        if isinstance(inspect.getattr_static(sgd_obj, attr), (classmethod, staticmethod)):
            sgd_sig = _signature(inspect.getattr_static(sgd_obj, attr).__func__)
        if ray_sig is not None and sgd_sig is not None:
            out += [f"{name}.{attr}(): {d}" for d in signature_differences(ray_sig, sgd_sig)]
    return out


def compare(ray_module: str, sgd_module: str, names: Optional[List[str]] = None) -> Dict[str, Any]:
    """``{"names": Ray's __all__, "missing": names sgd lacks, "differences": [...]}`` for the pair
    (``names``: these instead of Ray's ``__all__``, for a module without one)."""
    ray_mod = importlib.import_module(ray_module)
    sgd_mod = importlib.import_module(sgd_module)
    names = list(names if names is not None else getattr(ray_mod, "__all__", []))
    missing: List[str] = []
    differences: List[str] = []
    for name in names:
        ray_obj = getattr(ray_mod, name)
        try:
            sgd_obj = getattr(sgd_mod, name)
        except AttributeError:
            missing.append(name)
            continue
        if inspect.isclass(ray_obj):
            differences += _compare_class(name, ray_obj, sgd_obj)
        elif callable(ray_obj):
            ray_sig, sgd_sig = _signature(ray_obj), _signature(sgd_obj)
            if ray_sig is not None and sgd_sig is not None:
                differences += [f"{name}(): {d}" for d in signature_differences(ray_sig, sgd_sig)]
    return {"names": names, "missing": missing, "differences": differences}


_SCRIPT = ("import json, sys\nfrom sgd_testing.ray_api import compare\n"
           "pairs = json.loads(sys.argv[1])\n"
           "print(json.dumps({pair[1]: compare(*pair) for pair in pairs}))")


def compare_in_subprocess(*pairs: Tuple[Any, ...], env: Optional[Dict[str, str]] = None,
                          timeout_s: float = 300) -> Dict[str, Dict[str, Any]]:
    """:func:`compare` of each ``(ray_module, sgd_module)`` pair (or ``(ray_module, sgd_module,
    names)``) in one fresh interpreter (``env``: its environment, default this one's); the results
    by sgd module."""
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(pairs)], capture_output=True, text=True,
                         timeout=timeout_s, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"comparing {pairs} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
