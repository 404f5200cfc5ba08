"""Plugin discovery and the hooks core calls, with plugins registered in-process."""

import json
import os
import subprocess
import sys
import types

import pytest

import sgd
from sgd import plugins


@pytest.fixture
def fresh_plugins():
    plugins.reset()
    yield plugins
    plugins.reset()


def _plugin(name, **hooks):
    module = types.ModuleType(name)
    for hook_name, fn in hooks.items():
        setattr(module, hook_name, sgd.hookimpl(fn))
    return module


def test_hookspecs_are_all_documented():
    from sgd import hookspecs

    names = [n for n in dir(hookspecs) if n.startswith("sgd_")]
    assert len(names) >= 10
    for name in names:
        doc = getattr(hookspecs, name).__doc__ or ""
        assert len(doc.strip().splitlines()) >= 3, f"{name} needs a full docstring"


def test_check_pending_catches_nothing_misspelled(fresh_plugins):
    fresh_plugins.get_plugin_manager().check_pending()


def test_misspelled_hook_is_caught(fresh_plugins):
    import pluggy

    # Refused when registered (check_pending on the one plugin), named with its hook.
    with pytest.raises(pluggy.PluginValidationError, match="'typo' implements 'sgd_backend_stup'"):
        fresh_plugins.register(_plugin("typo", sgd_backend_stup=lambda worker_group: None))
    fresh_plugins.get_plugin_manager().check_pending()


def test_registered_backend_is_usable_by_name(fresh_plugins):
    class MyConfig(sgd.BackendConfig):
        @property
        def name(self):
            return "mine"

    fresh_plugins.register(_plugin("mine", sgd_backends=lambda: [sgd.BackendSpec("mine", MyConfig, "sgd-mine")]))
    trainer = sgd.Trainer(backend="mine")
    assert isinstance(trainer.backend_config, MyConfig)
    assert fresh_plugins.available_backends()["mine"].provider == "sgd-mine"


def test_duplicate_backend_names_are_reported(fresh_plugins):
    spec = sgd.BackendSpec("twin", sgd.BackendConfig, None)
    fresh_plugins.register(_plugin("a", sgd_backends=lambda: [spec]), name="first")
    fresh_plugins.register(_plugin("b", sgd_backends=lambda: [spec]), name="second")
    assert fresh_plugins.backend_conflicts() == {"twin": ["second", "first"]} or set(
        fresh_plugins.backend_conflicts()["twin"]) == {"first", "second"}
    with pytest.raises(ValueError, match="more than one plugin"):
        sgd.Trainer(backend="twin")


def test_hooks_see_setup_rounds_and_add_callbacks(fresh_plugins, ray_cluster):
    seen = {"setup": 0, "teardown": 0, "rounds": []}

    class Extra(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            seen.setdefault("extra", []).append(results[0]["i"])

    fresh_plugins.register(_plugin(
        "observer",
        sgd_backend_setup=lambda worker_group: seen.__setitem__("setup", seen["setup"] + len(worker_group)),
        sgd_backend_teardown=lambda worker_group: seen.__setitem__("teardown", seen["teardown"] + 1),
        sgd_handle_result=lambda results, run_info: seen["rounds"].append((results[0]["i"], run_info["run_dir"])),
        sgd_default_callbacks=lambda trainer: [Extra()],
    ))
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2)
    trainer.start()
    try:
        def train_func():
            for i in range(3):
                sgd.report(i=i)

        trainer.run(train_func)
        assert seen["setup"] == 2
        assert [r[0] for r in seen["rounds"]] == [0, 1, 2]
        assert seen["rounds"][0][1] == str(trainer.latest_run_dir)
        assert seen["extra"] == [0, 1, 2]
    finally:
        trainer.shutdown()
    assert seen["teardown"] == 1


def test_a_trainers_own_plugins_reach_its_hooks_only(fresh_plugins, ray_cluster):
    """Trainer(plugins=[...]): a plugin manager per trainer. Its plugin sees that trainer's
    setup and rounds, before the callbacks; another trainer in the process and the
    process-wide registry never see it."""
    order = []

    class Mine:
        @sgd.hookimpl
        def sgd_backend_training_start(self, worker_group):
            order.append(("training_start", len(worker_group)))

        @sgd.hookimpl
        def sgd_handle_result(self, results, run_info):
            assert type(run_info["callbacks"][0]).__name__ == "Seen"  # yours first, then the defaults
            order.append(("plugin", results[0]["i"]))

    class Seen(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            order.append(("callback", results[0]["i"]))

    def train_func():
        for i in range(2):
            sgd.report(i=i)

    mine = Mine()
    own = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, plugins=[mine])
    other = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=1)
    own.start()
    other.start()
    try:
        own.run(train_func, callbacks=[Seen()])
        assert order == [("training_start", 2), ("plugin", 0), ("callback", 0), ("plugin", 1), ("callback", 1)]
        order.clear()
        other.run(train_func, callbacks=[Seen()])
        assert order == [("callback", 0), ("callback", 1)]
    finally:
        own.shutdown()
        other.shutdown()
    assert not fresh_plugins.get_plugin_manager().is_registered(mine)


def test_core_delivers_results_to_callbacks_through_sgd_handle_result(fresh_plugins):
    from sgd import _builtin

    pm = fresh_plugins.plugin_manager_for()
    impls = pm.hook.sgd_handle_result.get_hookimpls()
    assert impls[0].plugin is _builtin  # trylast: called after every other plugin's
    got = []

    class Cb(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            got.append(results)

    pm.hook.sgd_handle_result(results=[{"a": 1}], run_info={"callbacks": [Cb(), Cb()]})
    assert got == [[{"a": 1}], [{"a": 1}]]


def _run_sgd(*args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "sgd", *args], capture_output=True, text=True, env=env, check=True)


def test_autoload_switch_in_a_fresh_process():
    on = json.loads(_run_sgd("plugins", "--json").stdout)
    off = json.loads(_run_sgd("plugins", "--json", env_extra={"SGD_DISABLE_PLUGIN_AUTOLOAD": "1"}).stdout)
    assert [p["name"] for p in off["plugins"]] == ["sgd-core"]
    assert len(on["plugins"]) >= len(off["plugins"])
    code = "import sgd\ntry:\n    sgd.Trainer(backend='torch')\nexcept ValueError as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, SGD_DISABLE_PLUGIN_AUTOLOAD="1")).stdout
    assert "autoload is off" in out and "sgd-torch" in out


def test_cli_table_lists_core():
    out = _run_sgd("plugins").stdout
    header, *rows = out.splitlines()
    assert header.split()[:2] == ["plugin", "version"]
    assert any(r.startswith("sgd-core") for r in rows)


def test_plugins_add_cli_commands(fresh_plugins, capsys):
    from sgd import cli

    def add(subparsers):
        p = subparsers.add_parser("hello")
        p.add_argument("name")
        p.set_defaults(func=lambda args: print(f"hello {args.name}") or 7)

    fresh_plugins.register(_plugin("greeter", sgd_cli_commands=add))
    assert cli.main(["hello", "sgd"]) == 7
    assert capsys.readouterr().out == "hello sgd\n"


def test_failing_plugin_teardown_does_not_skip_backend_shutdown(fresh_plugins, ray_cluster):
    calls = []

    class Recording(sgd.Backend):
        def on_start(self, worker_group, backend_config):
            calls.append("on_start")

        def on_shutdown(self, worker_group, backend_config):
            calls.append("on_shutdown")

    class Config(sgd.BackendConfig):
        @property
        def backend_cls(self):
            return Recording

    def broken_teardown(worker_group):
        raise RuntimeError("plugin teardown broke")

    fresh_plugins.register(_plugin(
        "broken",
        sgd_backend_setup=lambda worker_group: calls.append("plugin_setup"),
        sgd_backend_teardown=broken_teardown,
    ))
    trainer = sgd.Trainer(backend=Config(), num_workers=1)
    trainer.start()
    trainer.shutdown()
    # The backend's own setup runs before other plugins' setup; its teardown still runs.
    assert calls == ["on_start", "plugin_setup", "on_shutdown"]
