"""sgd's pluggy plugin manager: :class:`PluginManager` (sgd's hook specs, errors that name the
plugin, ``check_pending`` with a hint), the errors it raises, and the lookup from a hook relay
back to its manager."""

from __future__ import annotations

import difflib
import weakref
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import pluggy

from sgd import _builtin as builtin
from sgd import hookspecs
from sgd._common.public import public_module
from sgd.errors import PicklableError


@public_module("sgd.plugins")
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


@public_module("sgd.plugins")
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


def is_wrapper(impl: Any) -> bool:
    return bool(impl.wrapper or impl.hookwrapper)


def core_only(caller: Any) -> Optional[Callable[..., Any]]:
    """sgd-core's own implementation of the hook ``caller`` when it is the hook's only one (no
    plugin implements it, no wrapper), else ``None``. Calling it is what calling the hook does,
    without pluggy's machinery around the call: for the hooks called once per report round."""
    impls = caller.get_hookimpls()
    if len(impls) == 1 and impls[0].plugin is builtin and not is_wrapper(impls[0]):
        return impls[0].function  # type: ignore[no-any-return]
    return None


def display_name(plugin: object) -> str:
    return getattr(plugin, "__name__", None) or f"{type(plugin).__qualname__}@{id(plugin):#x}"


#: id(manager.hook) -> manager, so that a caller holding only a hook relay (``pm.hook``)
#: can still make subset calls; the relay's hook callers keep their manager alive.
_MANAGERS: weakref.WeakValueDictionary[int, PluginManager] = weakref.WeakValueDictionary()

@public_module("sgd.plugins")
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
        return display_name(plugin)

    def register(self, plugin: object, name: Optional[str] = None) -> Optional[str]:
        """Register ``plugin`` (under ``name``, default its canonical name).

        :raises PluginError: it is registered already, the name is taken, or one of its
            implementations breaks pluggy's rules (a wrapper that is not a generator, an
            argument the hook does not have).
        """
        plugin_name = name or self.get_canonical_name(plugin)
        if self.is_registered(plugin):
            raise PluginError(
                f"plugin {display_name(plugin)} is registered already (as {self.get_name(plugin)!r}); "
                "register each plugin once (an installed plugin is registered through its entry point: "
                "do not pass it again)", self.get_name(plugin) or plugin_name)
        if self.has_plugin(plugin_name):
            raise PluginError(
                f"a plugin named {plugin_name!r} is registered already ({self.get_plugin(plugin_name)!r}); "
                f"register {display_name(plugin)} under another name", plugin_name)
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
        code = code_of(impl.function)
        if is_wrapper(impl) and code is not None and f" {code.co_filename}:{code.co_firstlineno} " in str(exc):
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


def code_of(function: Any) -> Any:
    return getattr(getattr(function, "__func__", function), "__code__", None)
