"""Backends through plugins: the table of installed backends (``sgd_backends``, each plugin
asked on its own), a backend name resolved with an install hint, and the teardown hook run so that
every plugin's teardown runs."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import pluggy

from sgd.backend import BackendSpec
from sgd.plugins.calls import ask_each, call_isolated, find_culprit
from sgd.plugins.manager import manager_of
from sgd.plugins.registry import (
    PluginFailure,
    get_plugin_manager,
    get_state,
    lock,
    plugin_distribution,
    raise_if_refused,
    truthy,
)

if TYPE_CHECKING:
    from sgd.backend import Backend, BackendConfig, Workers

logger = logging.getLogger("sgd")

# Packages that provide the backends users most often ask for by name.
KNOWN_PROVIDERS = {"torch": "sgd-torch", "tensorflow": "sgd-tensorflow", "horovod": "sgd-horovod",
                   "xgboost": "sgd-xgboost", "lightgbm": "sgd-xgboost"}


def load_failures() -> List[PluginFailure]:
    """Entry points that failed to load, were refused (they implement a hook that does not
    exist), or whose ``sgd_backends`` raised, with the reason."""
    available_backends()
    state = get_state()
    return list(state.failures) + list(state.refused) + list(state.backend_failures)


def _collect_backends(pm: pluggy.PluginManager) -> Tuple[Dict[str, BackendSpec], Dict[str, List[str]],
                                                          List[PluginFailure]]:
    backends: Dict[str, BackendSpec] = {}
    conflicts: Dict[str, List[str]] = {}
    failures: List[PluginFailure] = []
    for plugin_name, answers, error, failed in ask_each(pm, "sgd_backends"):
        if error is not None:
            failures.append(PluginFailure(failed, plugin_distribution(failed), repr(error)))
            continue
        for answer in answers:
            for spec in answer or []:
                provider = spec.provider or plugin_distribution(plugin_name) or plugin_name
                if spec.name in backends:
                    first = backends[spec.name].provider or "?"
                    conflicts.setdefault(spec.name, [first]).append(provider)
                    continue
                backends[spec.name] = BackendSpec(spec.name, spec.config_cls, provider)
    return backends, conflicts, failures


def _backend_table(pm: Optional[pluggy.PluginManager]) -> Tuple[Dict[str, BackendSpec], Dict[str, List[str]]]:
    state = get_state()
    if pm is not None and pm is not state.pm:  # a trainer's own manager: asked afresh
        backends, conflicts, _ = _collect_backends(pm)
        return backends, conflicts
    with lock:
        if state.backends is None or state.backends_at != state.pm.changes:
            state.backends, state.backend_conflicts, state.backend_failures = _collect_backends(state.pm)
            state.backends_at = state.pm.changes
        return dict(state.backends), dict(state.backend_conflicts)


def available_backends(pm: Optional[pluggy.PluginManager] = None) -> Dict[str, BackendSpec]:
    """Backend name → :class:`BackendSpec` for every installed backend.

    :param pm: the plugin manager to ask (a trainer's own); by default the process-wide one.
    """
    return _backend_table(pm)[0]


def backend_conflicts(pm: Optional[pluggy.PluginManager] = None) -> Dict[str, List[str]]:
    """Backend names declared by more than one plugin → the providers."""
    return _backend_table(pm)[1]


def resolve_backend(name: str, pm: Optional[pluggy.PluginManager] = None) -> BackendSpec:
    """The :class:`BackendSpec` registered under ``name``.

    :param pm: the plugin manager to ask (a trainer's own, so that a plugin passed as
        ``Trainer(plugins=[...])`` may declare the backend); by default the process-wide one.
    :raises ValueError: the name is unknown (the message lists installed
        backends and the package that would provide it) or declared twice.
    :raises PluginError: an installed plugin was refused (see :func:`plugin_manager_for`).
    """
    raise_if_refused(get_state())
    backends, conflicts = _backend_table(pm)
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
    if truthy(os.environ.get("SGD_DISABLE_PLUGIN_AUTOLOAD")):
        hint = " (plugin autoload is off: SGD_DISABLE_PLUGIN_AUTOLOAD is set)"
    raise ValueError(
        f"unknown backend {name!r}; installed: {installed}{hint}. "
        f"Install '{package}' (pip install {package}) or pass a BackendConfig instance."
    )


def run_backend_teardown(worker_group: Workers, backend_config: BackendConfig, backend: Backend,
                         hook: Optional[Any] = None, pm: Optional[pluggy.PluginManager] = None) -> None:
    """Call ``sgd_backend_teardown`` through pluggy (the backend's own implementation last),
    logging each implementation that fails, by plugin, instead of raising: the others still
    run, and the workers are released whatever happens (:func:`call_isolated`).

    :param hook: the hook relay of the plugin manager to use (a trainer's own,
        :func:`plugin_manager_for`); by default the process-wide one's.
    :param pm: the plugin manager itself (any ``pluggy.PluginManager`` with sgd's specs).
    """
    kwargs = {"worker_group": worker_group, "backend_config": backend_config, "backend": backend}
    manager = pm if pm is not None else manager_of(hook) if hook is not None else get_plugin_manager()
    if manager is not None or hook is None:
        call_isolated(manager or get_plugin_manager(), "sgd_backend_teardown", **kwargs)
        return
    # The relay of a manager sgd did not make: one call; a failure is logged, by plugin.
    caller = hook.sgd_backend_teardown
    try:
        caller(**kwargs)
    except Exception as exc:
        culprit = find_culprit(caller.get_hookimpls(), exc)
        logger.error("sgd_backend_teardown of plugin %r failed", getattr(culprit, "plugin_name", "?"), exc_info=exc)
