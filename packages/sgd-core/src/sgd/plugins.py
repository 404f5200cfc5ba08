"""Plugin discovery: entry-point group ``sgd``, managed by pluggy.

``SGD_DISABLE_PLUGIN_AUTOLOAD=1`` turns entry-point discovery off (only the
built-in plugin and plugins registered by hand remain). ``SGD_PLUGINS=a,b``
loads only the named entry points.

Every hook is called through pluggy (``pm.hook.<name>(...)``, or a subset caller), so
wrappers, ``tryfirst``/``trylast`` and ``firstresult`` behave as pluggy documents. Two kinds
of call isolate a failing plugin instead of letting it end the call:

- discovery (``sgd_backends``, and what ``sgd plugins`` lists) asks each plugin on its own
  (:func:`ask_each`): an answer belongs to the plugin that gave it, and a plugin that raises
  is recorded as a failure, by name;
- teardown (:func:`run_backend_teardown`) makes one call (:func:`call_isolated`); when an
  implementation raises, it is logged by plugin name and the implementations after it are
  called in a further call, so every plugin's teardown runs.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import importlib.metadata
import inspect
import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

import pluggy

from sgd import _builtin as builtin
from sgd import hookspecs
from sgd.backend import BackendSpec
from sgd.errors import PicklableError

if TYPE_CHECKING:
    from sgd.backend import Backend, BackendConfig, Workers

logger = logging.getLogger("sgd")

ENTRY_POINT_GROUP = "sgd"

# Packages that provide the backends users most often ask for by name.
KNOWN_PROVIDERS = {"torch": "sgd-torch", "tensorflow": "sgd-tensorflow", "horovod": "sgd-horovod",
                   "xgboost": "sgd-xgboost", "lightgbm": "sgd-xgboost"}


@dataclass
class PluginFailure:
    """An entry point that could not be loaded or registered."""

    name: str
    distribution: Optional[str]
    reason: str


class PluginError(PicklableError, pluggy.PluginValidationError, ValueError):
    """A plugin sgd refuses: it implements a hook that does not exist, it is registered twice,
    or a wrapper of it breaks pluggy's rules. A ``pluggy.PluginValidationError`` and a
    ``ValueError`` (what pluggy raises for a duplicate), so either ``except`` catches it.

    :ivar plugin: the plugin's name (pluggy's own error holds the object; a name pickles).
    :ivar hook_name: the hook concerned, or ``""``.
    """

    def __init__(self, message: str, plugin: str = "", hook_name: str = ""):
        pluggy.PluginValidationError.__init__(self, plugin, message)
        self.hook_name = hook_name


class PluginWrapperError(PicklableError, RuntimeError):
    """A plugin's ``wrapper=True`` (or ``hookwrapper=True``) implementation did not yield, or
    yielded twice, during a hook call (pluggy's ``RuntimeError``, with the plugin named).

    :ivar plugin: the plugin's name.
    :ivar hook_name: the hook that was called.
    """

    def __init__(self, message: str, plugin: str = "", hook_name: str = ""):
        super().__init__(message)
        self.plugin = plugin
        self.hook_name = hook_name


def _is_wrapper(impl: Any) -> bool:
    return bool(impl.wrapper or impl.hookwrapper)


def _display_name(plugin: object) -> str:
    return getattr(plugin, "__name__", None) or f"{type(plugin).__qualname__}@{id(plugin):#x}"


# --- the manager ---------------------------------------------------------------------

#: id(manager.hook) -> manager, so that a caller holding only a hook relay (``pm.hook``)
#: can still make subset calls; the relay's hook callers keep their manager alive.
_MANAGERS: weakref.WeakValueDictionary[int, PluginManager] = weakref.WeakValueDictionary()


class PluginManager(pluggy.PluginManager):
    """pluggy's plugin manager with sgd's hook specs, and errors that name the plugin.

    - :meth:`register` refuses a plugin registered twice (or a second plugin under a taken
      name) with a :class:`PluginError` saying which;
    - :meth:`check_pending` refuses an implementation whose name matches no hook spec,
      naming the plugin and the hook (and the hook it probably meant);
    - a ``wrapper=True`` (or ``hookwrapper=True``) implementation that does not yield, or
      yields twice, fails its hook call with a ``RuntimeError`` naming its plugin.

    Build one by hand (``sgd.plugins.PluginManager(core=True)``, then ``register``) to test a
    plugin without the installed ones.

    :param core: also register sgd-core's own plugin as ``"sgd-core"`` (the ``"base"``
        backend, the dispatch of the lifecycle hooks to :class:`sgd.Backend` methods, the
        delivery of results to callbacks).
    """

    def __init__(self, core: bool = False) -> None:
        super().__init__("sgd")
        #: Counts registrations and removals, so that what was made from this manager can tell
        #: it is out of date (:func:`registry_version`).
        self.changes = 0
        self.add_hookspecs(hookspecs)
        self.add_hookcall_monitoring(_nothing_before, _name_broken_wrappers)
        _MANAGERS[id(self.hook)] = self
        if core:
            self.register(builtin, name="sgd-core")

    def get_canonical_name(self, plugin: object) -> str:
        """A module's name, else the class name and the object's id (pluggy: the id only)."""
        return _display_name(plugin)

    def register(self, plugin: object, name: Optional[str] = None) -> Optional[str]:
        """Register ``plugin`` (under ``name``, default its canonical name).

        :raises PluginError: it is registered already, the name is taken, or one of its
            implementations breaks pluggy's rules (a wrapper that is not a generator, an
            argument the hook does not have).
        """
        plugin_name = name or self.get_canonical_name(plugin)
        if self.is_registered(plugin):
            raise PluginError(
                f"plugin {_display_name(plugin)} is registered already (as {self.get_name(plugin)!r}); "
                "register each plugin once (an installed plugin is registered through its entry point: "
                "do not pass it again)", self.get_name(plugin) or plugin_name)
        if self.has_plugin(plugin_name):
            raise PluginError(
                f"a plugin named {plugin_name!r} is registered already ({self.get_plugin(plugin_name)!r}); "
                f"register {_display_name(plugin)} under another name", plugin_name)
        try:
            registered = super().register(plugin, name=plugin_name)
            self.changes += 1
            return registered
        except PluginError:
            raise
        except pluggy.PluginValidationError as exc:
            # pluggy's message is several lines ("Plugin 'x' for hook 'y' / hookimpl definition /
            # what is wrong"): keep them, on one line.
            detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise PluginError(f"plugin {plugin_name!r} refused: {detail}", plugin_name) from exc

    def unregister(self, plugin: Optional[object] = None, name: Optional[str] = None) -> Any:
        """pluggy's ``unregister``, counted in :attr:`changes`."""
        self.changes += 1
        return super().unregister(plugin, name)

    def unknown_hooks(self, plugin: Optional[object] = None) -> List[Tuple[str, str]]:
        """``(plugin name, hook name)`` of every implementation (of ``plugin``, or of any
        plugin) whose name matches no hook spec and that is not marked ``optionalhook``."""
        found = []
        for hook_name, caller in list(vars(self.hook).items()):
            if hook_name.startswith("_") or caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                if not impl.optionalhook and (plugin is None or impl.plugin is plugin):
                    found.append((impl.plugin_name, hook_name))
        return found

    def check_pending(self) -> None:
        """pluggy's check: every implementation matches a hook spec (or is ``optionalhook``).

        :raises PluginError: the first one that does not, naming the plugin and the hook.
        """
        for plugin_name, hook_name in self.unknown_hooks():
            raise PluginError(unknown_hook_message(plugin_name, hook_name), plugin_name, hook_name)


def unknown_hook_message(plugin_name: str, hook_name: str) -> str:
    """What to tell the author of a plugin that implements ``hook_name``, which is no hook."""
    close = difflib.get_close_matches(hook_name, [n for n in dir(hookspecs) if n.startswith("sgd_")], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"plugin {plugin_name!r} implements {hook_name!r}, which is not an sgd hook{hint}; rename it to "
            "a hook of sgd.hookspecs (docs/hooks.md), or mark it @sgd.hookimpl(optionalhook=True) if it is "
            "meant for a hook that only some versions of sgd have")


def _nothing_before(hook_name: str, hook_impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    return None


def _name_broken_wrappers(outcome: Any, hook_name: str, hook_impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """pluggy says ``wrap_controller at 'fn' file:line did not yield``; say which plugin's."""
    exc = outcome.exception
    if not isinstance(exc, RuntimeError) or not str(exc).startswith("wrap_controller at "):
        return
    for impl in hook_impls:
        code = _code_of(impl.function)
        if _is_wrapper(impl) and code is not None and f" {code.co_filename}:{code.co_firstlineno} " in str(exc):
            what = str(exc).rsplit(f":{code.co_firstlineno} ", 1)[-1]
            named = PluginWrapperError(
                f"the {hook_name} wrapper of plugin {impl.plugin_name!r} ({code.co_name}, "
                f"{code.co_filename}:{code.co_firstlineno}) {what}: a wrapper=True or hookwrapper=True "
                "implementation must yield exactly once", impl.plugin_name, hook_name)
            named.__cause__ = exc
            outcome.force_exception(named)
            return


def manager_of(hook: Any) -> Optional[pluggy.PluginManager]:
    """The :class:`PluginManager` whose hook relay is ``hook`` (``None`` for another pluggy manager's)."""
    pm = _MANAGERS.get(id(hook))
    return pm if pm is not None and pm.hook is hook else None


# --- calls that isolate a failing plugin -------------------------------------------------


def _code_of(function: Any) -> Any:
    return getattr(getattr(function, "__func__", function), "__code__", None)


def _culprit(impls: Sequence[Any], exc: BaseException) -> Any:
    """The implementation that raised ``exc`` (or the first exception of its chain): the
    innermost frame of the traceback that is one of ``impls``' functions, else ``None``."""
    codes = {}
    for impl in impls:
        for function in (impl.function, inspect.unwrap(getattr(impl.function, "__func__", impl.function))):
            code = _code_of(function)
            if code is not None:
                codes[code] = impl
    chain: List[BaseException] = []
    current: Optional[BaseException] = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    for error in reversed(chain):  # the first failure first: a wrapper may have replaced it
        if isinstance(error, PluginWrapperError):  # pluggy's own error: no frame of the plugin
            return next((impl for impl in impls if impl.plugin_name == error.plugin and _is_wrapper(impl)), None)
        found = None
        tb = error.__traceback__
        while tb is not None:
            found = codes.get(tb.tb_frame.f_code, found)
            tb = tb.tb_next
        if found is not None:
            return found
    return None


class Answer(NamedTuple):
    """One plugin's answer to a hook it was asked on its own (:func:`ask_each`)."""

    #: The name of the plugin asked.
    plugin: str
    #: Its implementation's return value, in a list (empty when it returned ``None`` or failed).
    values: List[Any]
    #: What it raised, else ``None``.
    error: Optional[Exception] = None
    #: The plugin the error is put on: the one asked, or a wrapper's plugin that raised.
    failed: str = ""


def ask_each(pm: pluggy.PluginManager, hook_name: str, **kwargs: Any) -> List[Answer]:
    """Ask every plugin that implements ``hook_name`` on its own, in pluggy's call order.

    Each question is a pluggy call (``pm.subset_hook_caller`` leaving out the other plugins'
    implementations), so wrappers wrap every plugin's answer and ``firstresult`` holds. A
    plugin that raises gets an :class:`Answer` with the error instead of stopping the others;
    an error a wrapper raised is put on the wrapper's plugin.
    """
    caller = getattr(pm.hook, hook_name)
    impls = caller.get_hookimpls()
    firstresult = bool(caller.spec is not None and caller.spec.opts.get("firstresult"))
    answering: List[object] = []
    for impl in reversed(impls):
        if not _is_wrapper(impl) and all(impl.plugin is not p for p in answering):
            answering.append(impl.plugin)
    out: List[Answer] = []
    for plugin in answering:
        name = pm.get_name(plugin) or _display_name(plugin)
        one = pm.subset_hook_caller(hook_name, [p for p in answering if p is not plugin])
        try:
            answer = one(**kwargs)
        except Exception as exc:
            culprit = _culprit(impls, exc)
            out.append(Answer(name, [], exc, culprit.plugin_name if culprit is not None else name))
            continue
        out.append(Answer(name, [] if answer is None else [answer] if firstresult else list(answer)))
    return out


class _Probe:
    """An implementation added to one call (``call_extra``) to learn how far the call got."""

    def __init__(self) -> None:
        self.reached = False

    def mark(self) -> None:
        self.reached = True


def call_isolated(pm: pluggy.PluginManager, hook_name: str, **kwargs: Any) -> List[Any]:
    """Call ``hook_name`` through pluggy; an implementation that raises is logged with its
    plugin's name and does not stop the others: the ones after it run in a further call.

    When nothing raises this is exactly ``pm.hook.<hook_name>(**kwargs)``. When a plain
    implementation raises, the wrappers see that call end with its error, then a second call
    of the implementations not yet called. A wrapper that raises is left out of the calls
    after it. :returns: the answers of every call, in order.
    """
    results: List[Any] = []
    done: Set[int] = set()  # ids of plugins whose implementation ran, or that failed
    removed: List[object] = []
    first = True
    while True:
        caller = pm.subset_hook_caller(hook_name, removed) if removed else getattr(pm.hook, hook_name)
        impls = caller.get_hookimpls()
        order = [impl for impl in reversed(impls) if not _is_wrapper(impl)]
        if not first and not order:
            return results
        first = False
        probe = _Probe()
        try:
            # The probe runs after every wrapper's code before its yield (and after the tryfirst
            # implementations): if a wrapper fails and the probe ran, the implementations ran too.
            results.extend(caller.call_extra([probe.mark], kwargs))
            return results
        except Exception as exc:
            culprit = _culprit(impls, exc)
            if culprit is None:
                logger.error("%s failed, and no plugin could be named from the traceback", hook_name, exc_info=exc)
                return results
            logger.error("%s of plugin %r failed; the other plugins' %s still run", hook_name, culprit.plugin_name,
                         hook_name, exc_info=exc)
            if not _is_wrapper(culprit):
                ran = order[: order.index(culprit) + 1]
            else:
                ran = [culprit, *(order if probe.reached else [])]
            for impl in ran:
                if id(impl.plugin) not in done:
                    done.add(id(impl.plugin))
                    removed.append(impl.plugin)


# --- the process-wide registry ---------------------------------------------------------


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


_lock = threading.RLock()
_state: Optional[_State] = None
_version = 0
_DIST_OF_PLUGIN: Dict[str, Optional[str]] = {}


def _truthy(value: Optional[str]) -> bool:
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
    if not _truthy(os.environ.get("SGD_DISABLE_PLUGIN_AUTOLOAD")):
        _load_entry_points(state)
    return state


def _get_state() -> _State:
    global _state
    with _lock:
        if _state is None:
            _state = _build()
        return _state


def get_plugin_manager() -> PluginManager:
    """The process-wide registry (built on first use): sgd-core's own plugin and the installed
    entry points, for what runs outside any trainer (``sgd plugins``, loading a checkpoint by
    path). A trainer calls hooks through its own manager (:func:`plugin_manager_for`,
    ``Trainer.plugin_manager``)."""
    return _get_state().pm


def registry_version() -> Tuple[int, int]:
    """A value that changes whenever the process-wide registry does (a plugin registered or
    unregistered, :func:`reset`): a manager made from it before is out of date."""
    with _lock:
        return _version, _get_state().pm.changes


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


def _raise_if_refused(state: _State) -> None:
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
    state = _get_state()
    _raise_if_refused(state)
    pm = PluginManager()
    with _lock:
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
    with _lock:
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
    state = _get_state()
    with _lock:
        state.pm.register(plugin, name=name)
        unknown = state.pm.unknown_hooks(plugin)
        if unknown:
            state.pm.unregister(plugin)
            raise PluginError(unknown_hook_message(*unknown[0]), *unknown[0])


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
        culprit = _culprit(caller.get_hookimpls(), exc)
        logger.error("sgd_backend_teardown of plugin %r failed", getattr(culprit, "plugin_name", "?"), exc_info=exc)


def plugin_distribution(plugin_name: str) -> Optional[str]:
    return _DIST_OF_PLUGIN.get(plugin_name)


def load_failures() -> List[PluginFailure]:
    """Entry points that failed to load, were refused (they implement a hook that does not
    exist), or whose ``sgd_backends`` raised, with the reason."""
    available_backends()
    state = _get_state()
    return list(state.failures) + list(state.refused) + list(state.backend_failures)


# --- backends ----------------------------------------------------------------------------


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
    state = _get_state()
    if pm is not None and pm is not state.pm:  # a trainer's own manager: asked afresh
        backends, conflicts, _ = _collect_backends(pm)
        return backends, conflicts
    with _lock:
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
    _raise_if_refused(_get_state())
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
    if _truthy(os.environ.get("SGD_DISABLE_PLUGIN_AUTOLOAD")):
        hint = " (plugin autoload is off: SGD_DISABLE_PLUGIN_AUTOLOAD is set)"
    raise ValueError(
        f"unknown backend {name!r}; installed: {installed}{hint}. "
        f"Install '{package}' (pip install {package}) or pass a BackendConfig instance."
    )
