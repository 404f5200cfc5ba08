"""The process-wide registry of installed plugins: discovery through the entry-point group
``sgd`` (``SGD_DISABLE_PLUGIN_AUTOLOAD``, ``SGD_PLUGINS``), plugins registered by hand, a
trainer's own manager made from it (:func:`plugin_manager_for`), and the manager that calls made
without one go through (:func:`using`, :func:`current_hook`)."""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from sgd._common.public import public_module
from sgd.backend import BackendSpec
from sgd.plugins.manager import PluginError, PluginManager, unknown_hook_message

ENTRY_POINT_GROUP = "sgd"


@public_module("sgd.plugins")
@dataclass
class PluginFailure:
    """An entry point that could not be loaded or registered."""

    name: str
    distribution: Optional[str]
    reason: str


@dataclass
class _State:
    pm: PluginManager
    failures: List[PluginFailure] = field(default_factory=list)
    #: Installed entry points refused because they implement hooks that do not exist.
    refused: List[PluginFailure] = field(default_factory=list)
    backends: Optional[Dict[str, BackendSpec]] = None
    #: ``pm.changes`` when :attr:`backends` was collected (a registration since makes it stale).
    backends_at: int = -1
    backend_conflicts: Dict[str, List[str]] = field(default_factory=dict)
    backend_failures: List[PluginFailure] = field(default_factory=list)


lock = threading.RLock()
_state: Optional[_State] = None
_version = 0
_DIST_OF_PLUGIN: Dict[str, Optional[str]] = {}


def truthy(value: Optional[str]) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _entry_points() -> Sequence[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _load_entry_points(state: _State) -> None:
    pm = state.pm
    only = os.environ.get("SGD_PLUGINS")
    wanted = {n.strip() for n in only.split(",") if n.strip()} if only else None
    seen: Dict[str, str] = {}
    for ep in _entry_points():
        dist = ep.dist.name if ep.dist is not None else None
        if wanted is not None and ep.name not in wanted:
            continue
        if ep.name in seen:
            # pluggy would silently skip the second one; say so instead.
            state.failures.append(
                PluginFailure(ep.name, dist, f"entry point name {ep.name!r} already provided by {seen[ep.name]}")
            )
            continue
        seen[ep.name] = dist or "?"
        try:
            module = ep.load()
            pm.register(module, name=ep.name)
        except Exception as exc:  # a broken plugin must not break sgd
            state.failures.append(PluginFailure(ep.name, dist, f"{type(exc).__name__}: {exc}"))
            continue
        unknown = pm.unknown_hooks(module)
        if unknown:  # check_pending, one plugin at a time: refuse this one, keep the others
            pm.unregister(module)
            reason = "; ".join(unknown_hook_message(p, h) for p, h in unknown)
            state.refused.append(PluginFailure(ep.name, dist, reason))
            continue
        _DIST_OF_PLUGIN[ep.name] = dist
    pm.check_pending()


def _build() -> _State:
    pm = PluginManager(core=True)
    _DIST_OF_PLUGIN["sgd-core"] = "sgd-core"
    state = _State(pm=pm)
    if not truthy(os.environ.get("SGD_DISABLE_PLUGIN_AUTOLOAD")):
        _load_entry_points(state)
    return state


def get_state() -> _State:
    global _state
    with lock:
        if _state is None:
            _state = _build()
        return _state


def get_plugin_manager() -> PluginManager:
    """The process-wide registry (built on first use): sgd-core's own plugin and the installed
    entry points, for what runs outside any trainer (``sgd plugins``, loading a checkpoint by
    path). A trainer calls hooks through its own manager (:func:`plugin_manager_for`,
    ``Trainer.plugin_manager``)."""
    return get_state().pm


def registry_version() -> Tuple[int, int]:
    """A value that changes whenever the process-wide registry does (a plugin registered or
    unregistered, :func:`reset`): a manager made from it before is out of date."""
    with lock:
        return _version, get_state().pm.changes


#: The hook relay that calls made without one go through (see :func:`using`).
_ACTIVE: contextvars.ContextVar[Optional[Any]] = contextvars.ContextVar("sgd_active_hook", default=None)


@contextlib.contextmanager
def using(pm: Any) -> Iterator[None]:
    """Inside this block, hook calls that are given no plugin manager (checkpoint codecs and
    storage: :func:`sgd.codecs.registered_codecs`, :func:`sgd.checkpoint.storage.storage_for`)
    go through ``pm`` (a plugin manager or its ``.hook``), in this thread or task only.
    A trainer reads its own checkpoints this way, so that its own plugins' codecs apply.
    ``pm=None`` changes nothing."""
    if pm is None:
        yield
        return
    token = _ACTIVE.set(getattr(pm, "hook", pm))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def current_hook(hook: Optional[Any] = None) -> Any:
    """The hook relay to call through: ``hook`` (a relay or a plugin manager) when given, else
    the one :func:`using` made active, else the process-wide registry's."""
    if hook is not None:
        return getattr(hook, "hook", hook)
    active = _ACTIVE.get()
    return active if active is not None else get_plugin_manager().hook


def raise_if_refused(state: _State) -> None:
    if state.refused:
        what = "; ".join(f"{f.name} ({f.distribution or '?'}): {f.reason}" for f in state.refused)
        first = state.refused[0]
        raise PluginError(
            f"installed sgd plugins were refused: {what}. Fix or uninstall them, or load only the plugins you "
            "want with SGD_PLUGINS=name,name (`sgd plugins` lists them)", first.name)


def plugin_manager_for(extra: Sequence[object] = ()) -> PluginManager:
    """A plugin manager of its own, for one trainer (or one ``sgd run`` launch), as pytest
    keeps one per session: every plugin the process-wide registry holds (sgd-core's own, the
    installed entry points, any registered by hand), in the same order, plus ``extra``, which
    only this manager sees. Hooks called through it reach exactly these plugins.

    :raises PluginError: an installed plugin was refused (it implements a hook that does not
        exist), or one of ``extra`` is: registered already, or implementing such a hook.
    """
    state = get_state()
    raise_if_refused(state)
    pm = PluginManager()
    with lock:
        shared = [(name, plugin) for name, plugin in state.pm.list_name_plugin() if plugin is not None]
    for name, plugin in shared:
        pm.register(plugin, name=name)
    for plugin in extra:
        pm.register(plugin)
    pm.check_pending()
    return pm


def reset() -> None:
    """Forget loaded plugins; the next use discovers them again (after an install, in tests)."""
    global _state, _version
    with lock:
        _state = None
        _version += 1
        _DIST_OF_PLUGIN.clear()
        importlib.invalidate_caches()


def register(plugin: object, name: Optional[str] = None) -> None:
    """Register a plugin object (a module or instance with ``@sgd.hookimpl`` functions) by hand,
    process-wide.

    :raises PluginError: it is registered already, ``name`` is taken, or it implements a hook
        that does not exist (then it is not registered).
    """
    state = get_state()
    with lock:
        state.pm.register(plugin, name=name)
        unknown = state.pm.unknown_hooks(plugin)
        if unknown:
            state.pm.unregister(plugin)
            raise PluginError(unknown_hook_message(*unknown[0]), *unknown[0])


def plugin_distribution(plugin_name: str) -> Optional[str]:
    return _DIST_OF_PLUGIN.get(plugin_name)
