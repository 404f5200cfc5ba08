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

Re-exports only; the code is in the submodules, one concept each:

- ``manager``: :class:`PluginManager` and the errors it raises (:class:`PluginError`,
  :class:`PluginWrapperError`);
- ``calls``: the isolating calls (:func:`ask_each`, :func:`call_isolated`);
- ``registry``: the process-wide registry, entry-point discovery, :func:`plugin_manager_for`;
- ``backends``: backends by name (:func:`resolve_backend`), :func:`run_backend_teardown`.

The public classes keep ``sgd.plugins`` as their ``__module__`` (errors are pickled between processes).
"""

from sgd.plugins.backends import (
    KNOWN_PROVIDERS,
    available_backends,
    backend_conflicts,
    load_failures,
    resolve_backend,
    run_backend_teardown,
)
from sgd.plugins.calls import Answer, ask_each, call_isolated
from sgd.plugins.manager import PluginError, PluginManager, PluginWrapperError, manager_of, unknown_hook_message
from sgd.plugins.registry import (
    ENTRY_POINT_GROUP,
    PluginFailure,
    current_hook,
    get_plugin_manager,
    plugin_distribution,
    plugin_manager_for,
    register,
    registry_version,
    reset,
    using,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "KNOWN_PROVIDERS",
    "PluginFailure",
    "PluginError",
    "PluginWrapperError",
    "PluginManager",
    "unknown_hook_message",
    "manager_of",
    "Answer",
    "ask_each",
    "call_isolated",
    "get_plugin_manager",
    "registry_version",
    "using",
    "current_hook",
    "plugin_manager_for",
    "reset",
    "register",
    "run_backend_teardown",
    "plugin_distribution",
    "load_failures",
    "available_backends",
    "backend_conflicts",
    "resolve_backend",
]
