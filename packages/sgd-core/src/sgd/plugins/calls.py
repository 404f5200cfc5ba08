"""Hook calls that isolate a failing plugin instead of letting it end the call: :func:`ask_each`
(each plugin asked on its own, an error kept as its answer) and :func:`call_isolated` (one call;
the implementations after one that raised run in a further call)."""

from __future__ import annotations

import inspect
import logging
from typing import Any, List, NamedTuple, Optional, Sequence, Set

import pluggy

from sgd._common.public import public_module
from sgd.plugins.manager import PluginWrapperError, code_of, display_name, is_wrapper

logger = logging.getLogger("sgd")


def find_culprit(impls: Sequence[Any], exc: BaseException) -> Any:
    """The implementation that raised ``exc`` (or the first exception of its chain): the
    innermost frame of the traceback that is one of ``impls``' functions, else ``None``."""
    codes = {}
    for impl in impls:
        for function in (impl.function, inspect.unwrap(getattr(impl.function, "__func__", impl.function))):
            code = code_of(function)
            if code is not None:
                codes[code] = impl
    chain: List[BaseException] = []
    current: Optional[BaseException] = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    for error in reversed(chain):  # the first failure first: a wrapper may have replaced it
        if isinstance(error, PluginWrapperError):  # pluggy's own error: no frame of the plugin
            return next((impl for impl in impls if impl.plugin_name == error.plugin and is_wrapper(impl)), None)
        found = None
        tb = error.__traceback__
        while tb is not None:
            found = codes.get(tb.tb_frame.f_code, found)
            tb = tb.tb_next
        if found is not None:
            return found
    return None


@public_module("sgd.plugins")
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
        if not is_wrapper(impl) and all(impl.plugin is not p for p in answering):
            answering.append(impl.plugin)
    out: List[Answer] = []
    for plugin in answering:
        name = pm.get_name(plugin) or display_name(plugin)
        one = pm.subset_hook_caller(hook_name, [p for p in answering if p is not plugin])
        try:
            answer = one(**kwargs)
        except Exception as exc:
            culprit = find_culprit(impls, exc)
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
        order = [impl for impl in reversed(impls) if not is_wrapper(impl)]
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
            culprit = find_culprit(impls, exc)
            if culprit is None:
                logger.error("%s failed, and no plugin could be named from the traceback", hook_name, exc_info=exc)
                return results
            logger.error("%s of plugin %r failed; the other plugins' %s still run", hook_name, culprit.plugin_name,
                         hook_name, exc_info=exc)
            if not is_wrapper(culprit):
                ran = order[: order.index(culprit) + 1]
            else:
                ran = [culprit, *(order if probe.reached else [])]
            for impl in ran:
                if id(impl.plugin) not in done:
                    done.add(id(impl.plugin))
                    removed.append(impl.plugin)
