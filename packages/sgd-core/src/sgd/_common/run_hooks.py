"""What a worker runs around its training functions, and when one of them raised (a leaf
module: imports nothing of sgd). Backends register through :func:`sgd.backend.on_worker_run`
and :func:`sgd.backend.on_worker_run_error`; the session runs them (:mod:`sgd._worker.session`)."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from typing import Any, Callable, ContextManager, Dict, List, Optional

#: entered in the training thread, in order, around every training function
RUN_CONTEXTS: List[Callable[[], ContextManager[Any]]] = []
#: run in the training thread, in order, when a training function raised
RUN_ERROR_HOOKS: List[Callable[[], None]] = []
#: run on a worker (from a control thread, or the training thread that caught a peer's failure)
#: when its run in ``sgd.elastic.run`` must come to the reset barrier after a peer died
INTERRUPT_HOOKS: List[Callable[[], None]] = []
#: run in the training thread, in order, when a run in ``sgd.elastic.run`` goes on in a re-formed
#: group, before its state is tied to the new group
RESET_HOOKS: List[Callable[[], None]] = []
#: run in the training thread after a training function returned; what each returns (by its key)
#: reaches the driver with the run's end (``Workers.run_notes``)
RUN_END_HOOKS: Dict[str, Callable[[], Any]] = {}


def clear() -> None:
    """Forget every hook (a worker process parked for another group: sgd.worker_group.keep)."""
    RUN_CONTEXTS.clear()
    RUN_ERROR_HOOKS.clear()
    INTERRUPT_HOOKS.clear()
    RESET_HOOKS.clear()
    RUN_END_HOOKS.clear()


def run_end_hooks() -> Optional[Dict[str, Any]]:
    """What the run-end hooks say, by key (``None`` when none is registered); a hook that
    raises is logged and left out."""
    if not RUN_END_HOOKS:
        return None
    notes: Dict[str, Any] = {}
    for key, hook in list(RUN_END_HOOKS.items()):
        try:
            notes[key] = hook()
        except Exception:
            logging.getLogger("sgd").exception("a run-end hook (%r) raised", hook)
    return notes


def run_error_hooks() -> None:
    for hook in list(RUN_ERROR_HOOKS):
        try:
            hook()
        except Exception:  # the run's own error is what the driver reports
            logging.getLogger("sgd").exception("a run-error hook (%r) raised", hook)


def run_interrupt_hooks() -> None:
    for hook in list(INTERRUPT_HOOKS):
        try:
            hook()
        except Exception:  # an interrupt that fails leaves the collective to its timeout
            logging.getLogger("sgd").exception("an interrupt hook (%r) raised", hook)


def run_in_contexts(fn: Callable[[], Any]) -> Any:
    """``fn()`` inside every registered run context (the first registered is the outermost)."""
    if not RUN_CONTEXTS:
        return fn()
    if len(RUN_CONTEXTS) == 1:  # the common case (one backend's): no stack to make
        with RUN_CONTEXTS[0]():
            return fn()
    with ExitStack() as stack:
        for context in list(RUN_CONTEXTS):
            stack.enter_context(context())
        return fn()
