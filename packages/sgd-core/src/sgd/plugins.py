"""Plugin discovery: entry-point group ``sgd``, managed by pluggy.

``SGD_DISABLE_PLUGIN_AUTOLOAD=1`` turns entry-point discovery off (only the
built-in plugin and plugins registered by hand remain). ``SGD_PLUGINS=a,b``
loads only the named entry points.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import pluggy

from sgd import _builtin as builtin
from sgd import hookspecs
from sgd.backend import BackendSpec

if TYPE_CHECKING:
    from sgd.backend import Backend, BackendConfig, Workers

logger = logging.getLogger("sgd")

ENTRY_POINT_GROUP = "sgd"

# Packages that provide the backends users most often ask for by name.
KNOWN_PROVIDERS = {"torch": "sgd-torch", "tensorflow": "sgd-tensorflow", "horovod": "sgd-horovod"}


@dataclass
class PluginFailure:
    """An entry point that could not be loaded or registered."""

    name: str
    distribution: Optional[str]
    reason: str


@dataclass
class _State:
    pm: pluggy.PluginManager
    failures: List[PluginFailure] = field(default_factory=list)
    backends: Optional[Dict[str, BackendSpec]] = None
    backend_conflicts: Dict[str, List[str]] = field(default_factory=dict)
    backend_failures: List[PluginFailure] = field(default_factory=list)


_lock = threading.RLock()
_state: Optional[_State] = None


def _truthy(value: Optional[str]) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _load_entry_points(pm: pluggy.PluginManager, failures: List[PluginFailure]) -> None:
    only = os.environ.get("SGD_PLUGINS")
    wanted = {n.strip() for n in only.split(",") if n.strip()} if only else None
    seen: Dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else None
        if wanted is not None and ep.name not in wanted:
            continue
        if ep.name in seen:
            # pluggy would silently skip the second one; say so instead.
            failures.append(
                PluginFailure(ep.name, dist, f"entry point name {ep.name!r} already provided by {seen[ep.name]}")
            )
            continue
        seen[ep.name] = dist or "?"
        try:
            module = ep.load()
            pm.register(module, name=ep.name)
        except Exception as exc:  # a broken plugin must not break sgd
            failures.append(PluginFailure(ep.name, dist, f"{type(exc).__name__}: {exc}"))
            continue
        _DIST_OF_PLUGIN[ep.name] = dist


_DIST_OF_PLUGIN: Dict[str, Optional[str]] = {}


def _build() -> _State:

    pm = pluggy.PluginManager("sgd")
    pm.add_hookspecs(hookspecs)
    pm.register(builtin, name="sgd-core")
    _DIST_OF_PLUGIN["sgd-core"] = "sgd-core"
    state = _State(pm=pm)
    if not _truthy(os.environ.get("SGD_DISABLE_PLUGIN_AUTOLOAD")):
        _load_entry_points(pm, state.failures)
    return state


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide registry (built on first use): sgd-core's own plugin and the installed
    entry points. A trainer calls hooks through its own manager (:func:`plugin_manager_for`);
    what runs outside any trainer (checkpoint storage and codecs) calls them through this one."""
    return _get_state().pm


def plugin_manager_for(extra: Sequence[object] = ()) -> pluggy.PluginManager:
    """A plugin manager of its own, for one trainer (or one ``sgd run`` launch), as pytest
    keeps one per session: every plugin the process-wide registry holds (sgd-core's own, the
    installed entry points, any registered by hand), in the same order, plus ``extra``, which
    only this manager sees. Hooks called through it reach exactly these plugins.
    """
    state = _get_state()
    pm = pluggy.PluginManager("sgd")
    pm.add_hookspecs(hookspecs)
    with _lock:
        shared = [(name, plugin) for name, plugin in state.pm.list_name_plugin() if plugin is not None]
    for name, plugin in shared:
        pm.register(plugin, name=name)
    for plugin in extra:
        pm.register(plugin)
    return pm


def _get_state() -> _State:
    global _state
    with _lock:
        if _state is None:
            _state = _build()
        return _state


def reset() -> None:
    """Forget loaded plugins; the next use discovers them again (after an install, in tests)."""
    global _state
    with _lock:
        _state = None
        _DIST_OF_PLUGIN.clear()
        importlib.invalidate_caches()


def register(plugin: object, name: Optional[str] = None) -> None:
    """Register a plugin object (a module or instance with ``@sgd.hookimpl`` functions) by hand."""
    state = _get_state()
    with _lock:
        state.pm.register(plugin, name=name)
        state.backends = None


def run_backend_teardown(worker_group: Workers, backend_config: BackendConfig, backend: Backend,
                         hook: Optional[Any] = None) -> None:
    """Call every ``sgd_backend_teardown`` implementation (the backend's own last), logging
    the ones that fail instead of raising: the workers must be released whatever happens.

    :param hook: the hook relay of the plugin manager to use (a trainer's own,
        :func:`plugin_manager_for`); by default the process-wide one's.
    """
    caller = (hook if hook is not None else get_plugin_manager().hook).sgd_backend_teardown
    kwargs = {"worker_group": worker_group, "backend_config": backend_config, "backend": backend}
    for impl in reversed(caller.get_hookimpls()):
        try:
            impl.function(**{name: kwargs[name] for name in impl.argnames})
        except Exception:
            logger.exception("sgd_backend_teardown of plugin %r failed", impl.plugin_name)


def plugin_distribution(plugin_name: str) -> Optional[str]:
    return _DIST_OF_PLUGIN.get(plugin_name)


def load_failures() -> List[PluginFailure]:
    """Entry points that failed to load (or whose ``sgd_backends`` raised), with the reason."""
    available_backends()
    state = _get_state()
    return list(state.failures) + list(state.backend_failures)


def _collect_backends(state: _State) -> None:
    backends: Dict[str, BackendSpec] = {}
    conflicts: Dict[str, List[str]] = {}
    state.backend_failures = []
    for impl in state.pm.hook.sgd_backends.get_hookimpls():
        try:
            specs: List[BackendSpec] = list(impl.function() or [])  # type: ignore[call-overload]
        except Exception as exc:
            state.backend_failures.append(
                PluginFailure(impl.plugin_name, plugin_distribution(impl.plugin_name), repr(exc))
            )
            continue
        for spec in specs:
            provider = spec.provider or plugin_distribution(impl.plugin_name) or impl.plugin_name
            if spec.name in backends:
                first = backends[spec.name].provider or "?"
                conflicts.setdefault(spec.name, [first]).append(provider)
                continue
            backends[spec.name] = BackendSpec(spec.name, spec.config_cls, provider)
    state.backends = backends
    state.backend_conflicts = conflicts


def available_backends() -> Dict[str, BackendSpec]:
    """Backend name → :class:`BackendSpec` for every installed backend."""
    state = _get_state()
    with _lock:
        if state.backends is None:
            _collect_backends(state)
        assert state.backends is not None
        return dict(state.backends)


def backend_conflicts() -> Dict[str, List[str]]:
    """Backend names declared by more than one plugin → the providers."""
    available_backends()
    return dict(_get_state().backend_conflicts)


def resolve_backend(name: str) -> BackendSpec:
    """The :class:`BackendSpec` registered under ``name``.

    :raises ValueError: the name is unknown (the message lists installed
        backends and the package that would provide it) or declared twice.
    """
    backends = available_backends()
    conflicts = backend_conflicts()
    if name in conflicts:
        raise ValueError(
            f"backend {name!r} is provided by more than one plugin ({', '.join(conflicts[name])}); "
            "uninstall one of them, or pass a BackendConfig instance instead of the name."
        )
    if name in backends:
        return backends[name]
    installed = ", ".join(sorted(backends)) or "none"
    package = KNOWN_PROVIDERS.get(name, f"sgd-{name}")
    hint = ""
    if _truthy(os.environ.get("SGD_DISABLE_PLUGIN_AUTOLOAD")):
        hint = " (plugin autoload is off: SGD_DISABLE_PLUGIN_AUTOLOAD is set)"
    raise ValueError(
        f"unknown backend {name!r}; installed: {installed}{hint}. "
        f"Install '{package}' (pip install {package}) or pass a BackendConfig instance."
    )
