"""Hooks are called as pluggy documents them (wrappers, tryfirst/trylast, firstresult), a failing
plugin is isolated and named, bad plugins are refused with clear errors, and a trainer's own
plugins reach every hook it calls. No Ray: managers are built by hand, Trainers are not started."""

from __future__ import annotations

import importlib.metadata
import io
import json
import logging
import sys
import types
from pathlib import Path

import pluggy
import pytest

import sgd
from sgd import _builtin, cli, plugins
from sgd.checkpoint.codecs import SafeCodec, get_codec, registered_codecs
from sgd.checkpoint.format import Checkpoint, write_dict_dir
from sgd.checkpoint.storage import storage_for
from sgd.errors import CheckpointIntegrityError


@pytest.fixture
def fresh_plugins():
    plugins.reset()
    yield plugins
    plugins.reset()


def _plugin(name, **hooks):
    """A module-like plugin named ``name`` with these hook implementations (plain functions, or
    ``(function, hookimpl options)``)."""
    module = types.ModuleType(name)
    for hook_name, fn in hooks.items():
        fn, opts = fn if isinstance(fn, tuple) else (fn, {})
        setattr(module, hook_name, sgd.hookimpl(**opts)(fn))
    return module


class _Backend:
    """What sgd-core's own teardown calls: ``backend.on_shutdown``."""

    def __init__(self, calls):
        self.calls = calls

    def on_shutdown(self, worker_group, backend_config):
        self.calls.append("backend.on_shutdown")


def _manager(*plugins_and_names):
    pm = plugins.PluginManager(core=True)
    assert pm.get_plugin("sgd-core") is _builtin
    for plugin, name in plugins_and_names:
        pm.register(plugin, name=name)
    return pm


def _teardown(_pm, calls, **how):
    plugins.run_backend_teardown(["w0", "w1"], sgd.BackendConfig(), _Backend(calls), **how)


# --- call rules ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["pm", "hook"])
def test_a_wrapper_teardown_sees_the_call_and_its_result(how):
    calls = []

    def wrap(worker_group):
        calls.append(("wrapper before", len(worker_group)))
        result = yield
        calls.append(("wrapper after", result))
        return result

    def old_style(worker_group):
        outcome = yield
        calls.append(("hookwrapper", outcome.get_result()))

    pm = _manager(
        (_plugin("wrapping", sgd_backend_teardown=(wrap, {"wrapper": True})), "wrapping"),
        (_plugin("old", sgd_backend_teardown=(old_style, {"hookwrapper": True})), "old"),
        (_plugin("plain", sgd_backend_teardown=lambda: calls.append("plain") or "plain done"), "plain"),
    )
    _teardown(pm, calls, **({"pm": pm} if how == "pm" else {"hook": pm.hook}))
    # pluggy's order: the newest wrapper outermost ("old"), then the plain ones, sgd-core's own
    # (trylast) last; each wrapper sees the whole call's result.
    assert calls == [("wrapper before", 2), "plain", "backend.on_shutdown",
                     ("wrapper after", ["plain done"]), ("hookwrapper", ["plain done"])]


def test_tryfirst_and_trylast_order_the_calls():
    calls = []
    pm = _manager(
        (_plugin("last", sgd_backend_teardown=(lambda: calls.append("last"), {"trylast": True})), "last"),
        (_plugin("first", sgd_backend_teardown=(lambda: calls.append("first"), {"tryfirst": True})), "first"),
        (_plugin("middle", sgd_backend_teardown=lambda: calls.append("middle")), "middle"),
    )
    _teardown(pm, calls, pm=pm)
    # Both trylast: pluggy calls the one registered later (the plugin) after sgd-core's.
    assert calls == ["first", "middle", "backend.on_shutdown", "last"]


def test_firstresult_storage_hook_stops_at_the_first_answer_and_wrappers_may_replace_it():
    class Storage:
        def __init__(self, name):
            self.name = name

    asked = []

    def late(uri):
        asked.append("late")
        return Storage("late")

    def early(uri):
        asked.append("early")
        return Storage("early") if uri.startswith("mem://") else None

    pm = _manager((_plugin("late", sgd_checkpoint_storage=late), "late"),
                  (_plugin("early", sgd_checkpoint_storage=(early, {"tryfirst": True})), "early"))
    assert storage_for("mem://bucket/x", hook=pm).name == "early"
    assert asked == ["early"]  # firstresult: "late" never asked
    assert storage_for("other://bucket/x", hook=pm.hook).name == "late"

    def swap(uri):
        found = yield
        return Storage(f"wrapped {found.name}")

    pm.register(_plugin("swap", sgd_checkpoint_storage=(swap, {"wrapper": True})), name="swap")
    assert storage_for("mem://bucket/x", hook=pm).name == "wrapped early"


# --- isolation -------------------------------------------------------------------------------


def test_a_failing_teardown_does_not_stop_the_others_and_is_named(caplog):
    calls = []

    def broken():
        calls.append("broken")
        raise RuntimeError("plugin teardown broke")

    def wrap():
        outcomes.append((yield))

    outcomes = []
    pm = _manager(
        (_plugin("after", sgd_backend_teardown=lambda: calls.append("after")), "after"),
        (_plugin("broken", sgd_backend_teardown=broken), "broken"),
        (_plugin("before", sgd_backend_teardown=lambda: calls.append("before")), "before"),
        (_plugin("watch", sgd_backend_teardown=(wrap, {"hookwrapper": True})), "watch"),
    )
    with caplog.at_level(logging.ERROR, logger="sgd"):
        _teardown(pm, calls, hook=pm.hook)
    # Each implementation ran exactly once, in pluggy's order, although one raised.
    assert calls == ["before", "broken", "after", "backend.on_shutdown"]
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failed) == 1
    assert "sgd_backend_teardown of plugin 'broken' failed" in failed[0].getMessage()
    assert "plugin teardown broke" in str(failed[0].exc_info[1])
    # The wrapper saw the call that failed, then the call of the rest.
    assert [type(o.exception).__name__ if o.exception else o.get_result() for o in outcomes] == [
        "RuntimeError", []]


@pytest.mark.parametrize("where", ["before its yield", "after its yield"])
def test_a_failing_teardown_wrapper_is_named_and_every_teardown_runs_once(where, caplog):
    calls = []

    def wrap():
        if where == "before its yield":
            raise RuntimeError("wrapper broke")
        yield
        raise RuntimeError("wrapper broke")

    pm = _manager(
        (_plugin("plain", sgd_backend_teardown=lambda: calls.append("plain")), "plain"),
        (_plugin("bad-wrapper", sgd_backend_teardown=(wrap, {"wrapper": True})), "bad-wrapper"),
    )
    with caplog.at_level(logging.ERROR, logger="sgd"):
        _teardown(pm, calls, pm=pm)
    assert calls == ["plain", "backend.on_shutdown"]
    assert [r.getMessage().split(";")[0] for r in caplog.records if r.levelno == logging.ERROR] == [
        "sgd_backend_teardown of plugin 'bad-wrapper' failed"]


def test_a_plugin_failing_in_discovery_is_isolated_and_named(fresh_plugins):
    class MyConfig(sgd.BackendConfig):
        pass

    def broken():
        raise RuntimeError("cannot declare")

    fresh_plugins.register(_plugin("fine", sgd_backends=lambda: [sgd.BackendSpec("fine", MyConfig, "sgd-fine")]),
                           name="fine")
    fresh_plugins.register(_plugin("broken", sgd_backends=broken), name="broken")
    assert {"fine", "base"} <= set(fresh_plugins.available_backends())
    failures = fresh_plugins.load_failures()
    assert [(f.name, "cannot declare" in f.reason) for f in failures] == [("broken", True)]


def test_discovery_asks_each_plugin_through_pluggy_so_wrappers_see_each_answer():
    class MyConfig(sgd.BackendConfig):
        pass

    seen = []

    def hide_experimental():
        answer = yield
        seen.append([spec.name for specs in answer for spec in specs])
        return [[spec for spec in specs if not spec.name.startswith("exp-")] for specs in answer]

    pm = _manager(
        (_plugin("a", sgd_backends=lambda: [sgd.BackendSpec("exp-a", MyConfig), sgd.BackendSpec("a", MyConfig)]),
         "a"),
        (_plugin("filter", sgd_backends=(hide_experimental, {"wrapper": True})), "filter"),
    )
    assert sorted(plugins.available_backends(pm)) == ["a", "base"]
    assert sorted(seen) == [["base"], ["exp-a", "a"]]  # one call per plugin, each answer attributed
    assert plugins.available_backends(pm)["a"].provider == "a"  # no provider given: the plugin's name


# --- refused plugins ---------------------------------------------------------------------------


def test_a_misspelt_hookimpl_is_refused_naming_plugin_and_hook(fresh_plugins):
    typo = _plugin("typo", sgd_backend_stup=lambda worker_group: None)
    pm = plugins.PluginManager()
    pm.register(typo, name="typo")
    with pytest.raises(pluggy.PluginValidationError) as raised:
        pm.check_pending()
    message = str(raised.value)
    assert "'typo'" in message and "'sgd_backend_stup'" in message and "did you mean 'sgd_backend_setup'" in message
    assert isinstance(raised.value, plugins.PluginError) and raised.value.hook_name == "sgd_backend_stup"

    with pytest.raises(plugins.PluginError, match="'typo' implements 'sgd_backend_stup'"):
        fresh_plugins.register(typo, name="typo")
    assert not fresh_plugins.get_plugin_manager().is_registered(typo)  # refused, not half-registered
    fresh_plugins.get_plugin_manager().check_pending()

    class Typo:
        @sgd.hookimpl
        def sgd_handle_results(self, results):
            pass

    with pytest.raises(plugins.PluginError, match=r"Typo@0x[0-9a-f]+' implements 'sgd_handle_results'"):
        sgd.Trainer(backend="base", plugins=[Typo()])


def test_an_optionalhook_may_name_a_hook_this_sgd_lacks(fresh_plugins):
    later = _plugin("later", sgd_future_hook=(lambda: None, {"optionalhook": True}))
    fresh_plugins.register(later, name="later")
    fresh_plugins.plugin_manager_for().check_pending()


@pytest.fixture
def entry_points(monkeypatch, fresh_plugins):
    """Installed entry points, faked: each ``(name, module)`` is loaded as ``sgd``'s would be."""

    def install(*named):
        eps = []
        for name, module in named:
            monkeypatch.setitem(sys.modules, module.__name__, module)
            eps.append(importlib.metadata.EntryPoint(name=name, value=module.__name__, group="sgd"))
        monkeypatch.setattr(plugins.registry, "_entry_points", lambda: eps)
        monkeypatch.delenv("SGD_DISABLE_PLUGIN_AUTOLOAD", raising=False)
        monkeypatch.delenv("SGD_PLUGINS", raising=False)
        fresh_plugins.reset()

    return install


def test_an_installed_plugin_with_a_misspelt_hook_is_a_failure_at_listing_and_at_first_use(entry_points, capsys):
    class GoodConfig(sgd.BackendConfig):
        pass

    entry_points(("good", _plugin("sgd_test_good", sgd_backends=lambda: [sgd.BackendSpec("good", GoodConfig)])),
                 ("typo", _plugin("sgd_test_typo", sgd_backend_teardwon=lambda: None,
                                  sgd_backends=lambda: [sgd.BackendSpec("typo", GoodConfig)])))
    pm = plugins.get_plugin_manager()  # loading does not raise: the plugin is left out
    assert [name for name, _ in pm.list_name_plugin()] == ["sgd-core", "good"]
    pm.check_pending()
    assert "typo" not in plugins.available_backends()

    assert cli.main(["plugins", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in listed["plugins"]] == ["sgd-core", "good"]
    (failed,) = listed["failed"]
    assert failed["name"] == "typo" and "'sgd_backend_teardwon'" in failed["reason"]
    assert "did you mean 'sgd_backend_teardown'" in failed["reason"]

    with pytest.raises(plugins.PluginError, match=r"typo \(\?\): plugin 'typo' implements 'sgd_backend_teardwon'"):
        sgd.Trainer(backend="good")
    with pytest.raises(plugins.PluginError, match="SGD_PLUGINS"):
        sgd.Trainer(backend=sgd.BackendConfig())


def test_a_plugin_registered_twice_is_a_clear_error(fresh_plugins):
    class Mine:
        @sgd.hookimpl
        def sgd_handle_result(self, results):
            pass

    mine = Mine()
    pm = plugins.PluginManager()
    pm.register(mine, name="mine")
    with pytest.raises(plugins.PluginError, match=r"Mine@0x[0-9a-f]+ is registered already \(as 'mine'\)"):
        pm.register(mine)
    with pytest.raises(ValueError, match="a plugin named 'mine' is registered already"):
        pm.register(Mine(), name="mine")

    fresh_plugins.register(mine, name="mine")
    with pytest.raises(plugins.PluginError, match="registered already"):
        fresh_plugins.register(mine, name="again")
    with pytest.raises(plugins.PluginError, match=r"is registered already \(as 'mine'\)"):
        sgd.Trainer(backend="base", plugins=[mine])  # process-wide already: not again per trainer
    other = Mine()
    with pytest.raises(plugins.PluginError, match="registered already"):
        sgd.Trainer(backend="base", plugins=[other, other])


def test_a_wrapper_that_does_not_yield_is_refused_naming_its_plugin(caplog):
    def not_a_generator(worker_group):
        return None

    with pytest.raises(plugins.PluginError, match="plugin 'lazy' refused: .*not a generator function"):
        plugins.PluginManager().register(
            _plugin("lazy", sgd_backend_teardown=(not_a_generator, {"wrapper": True})), name="lazy")

    def never_yields(worker_group):
        if False:
            yield
        return None

    calls = []
    pm = _manager((_plugin("plain", sgd_backend_teardown=lambda: calls.append("plain")), "plain"),
                  (_plugin("silent", sgd_backend_setup=(never_yields, {"wrapper": True}),
                           sgd_backend_teardown=(never_yields, {"wrapper": True})), "silent"))
    with pytest.raises(RuntimeError, match=r"the sgd_backend_setup wrapper of plugin 'silent' \(never_yields, .*"
                                           r"did not yield: a wrapper=True or hookwrapper=True"):
        pm.hook.sgd_backend_setup(worker_group=[], backend_config=None, backend=None)
    with caplog.at_level(logging.ERROR, logger="sgd"):
        _teardown(pm, calls, pm=pm)
    assert calls == ["plain", "backend.on_shutdown"]
    assert any("plugin 'silent' failed" in r.getMessage() for r in caplog.records)


# --- a trainer's own plugins reach every hook it calls --------------------------------------------


class _TagCodec(SafeCodec):
    """The safe format, written behind a tag that only this codec reads."""

    name = "tagged"
    suffix = "tagged"
    aliases = ()

    def save(self, obj, f):
        f.write(b"TAG:")
        return super().save(obj, f)

    def load(self, f, trusted, where):
        assert f.read(4) == b"TAG:"
        return super().load(f, trusted, where)


class _MemoryStorage:
    def __init__(self):
        self.uploaded = []

    def upload_dir(self, local_dir, uri):
        self.uploaded.append(uri)


class _TrainerPlugin:
    def __init__(self):
        self.storage = _MemoryStorage()

    @sgd.hookimpl
    def sgd_checkpoint_codecs(self):
        return [_TagCodec()]

    @sgd.hookimpl
    def sgd_checkpoint_storage(self, uri):
        return self.storage if uri.startswith("mine://") else None

    @sgd.hookimpl
    def sgd_backends(self):
        return [sgd.BackendSpec("mine", sgd.BackendConfig, provider="sgd-mine")]

    @sgd.hookimpl(tryfirst=True)
    def sgd_tune_trainable(self, trainer, train_func):
        return ("my trainable", train_func)


def test_codec_and_storage_lookups_see_a_per_trainer_plugin(fresh_plugins, tmp_path):
    mine = _TrainerPlugin()
    trainer = sgd.Trainer(backend="base", plugins=[mine], storage_path="mine://bucket")  # its storage: accepted
    with pytest.raises(ValueError, match="no checkpoint storage for mine://"):
        sgd.Trainer(backend="base", storage_path="mine://bucket")
    assert storage_for("mine://bucket/x", hook=trainer.plugin_manager) is mine.storage
    with pytest.raises(ValueError):
        storage_for("mine://bucket/x")  # the process-wide registry never saw it

    assert isinstance(registered_codecs(hook=trainer.plugin_manager)["tagged"], _TagCodec)
    assert "tagged" not in registered_codecs()
    write_dict_dir({"step": 3}, tmp_path / "ckpt", "tagged", hook=trainer.plugin_manager)
    assert (tmp_path / "ckpt" / "state.tagged").read_bytes().startswith(b"TAG:")
    with pytest.raises(CheckpointIntegrityError, match="names codec 'tagged'"):
        Checkpoint.from_directory(tmp_path / "ckpt").to_dict()
    with plugins.using(trainer.plugin_manager):
        assert Checkpoint.from_directory(tmp_path / "ckpt").to_dict() == {"step": 3}
        assert get_codec("tagged").name == "tagged"


def test_the_checkpoint_manager_writes_and_mirrors_through_the_trainers_plugins(fresh_plugins, tmp_path):
    from sgd._common.protocol import CheckpointTarget
    from sgd.storage.manager import CheckpointManager
    from sgd.storage.staging import stage_state

    mine = _TrainerPlugin()
    trainer = sgd.Trainer(backend="base", plugins=[mine])
    manager = CheckpointManager(tmp_path / "checkpoints", sgd.CheckpointStrategy(), "tagged",
                                mirror="mine://bucket/run", hook=trainer.plugin_manager)
    target = CheckpointTarget(str(manager.checkpoint_dir), "tagged", "_timestamp")
    # As a worker in local mode writes it: with the trainer's codecs.
    written = stage_state(target, {"step": 1}, hook=trainer.plugin_manager.hook)
    path = manager.register(Path(written.path), {}, 1)
    assert (path / "state.tagged").read_bytes().startswith(b"TAG:")
    assert mine.storage.uploaded == [f"mine://bucket/run/{path.name}"]
    with plugins.using(trainer.plugin_manager):
        assert manager.latest() == {"step": 1}
    with pytest.raises(ValueError, match="unknown checkpoint codec 'tagged'"):
        stage_state(CheckpointTarget(str(tmp_path / "other"), "tagged", "_timestamp"), {"step": 1})


def test_backend_lookup_and_tune_see_a_per_trainer_plugin(fresh_plugins):
    mine = _TrainerPlugin()
    trainer = sgd.Trainer(backend="mine", plugins=[mine])
    assert type(trainer.backend_config) is sgd.BackendConfig
    with pytest.raises(ValueError, match="unknown backend 'mine'"):
        sgd.Trainer(backend="mine")

    def train_func():
        pass

    # sgd-tune's implementation is installed; this trainer's tryfirst one answers first.
    assert trainer.to_tune_trainable(train_func) == ("my trainable", train_func)
    assert trainer.settings()["plugins"] == [mine]  # each Tune trial's trainer is made with them
    assert "plugins" not in json.loads(json.dumps(trainer._settings_json()))


def test_a_trainers_manager_follows_the_process_wide_registry(fresh_plugins):
    trainer = sgd.Trainer(backend="base")
    before = trainer.plugin_manager
    assert trainer.plugin_manager is before  # one per trainer while nothing changes
    later = _plugin("later", sgd_checkpoint_codecs=lambda: [_TagCodec()])
    fresh_plugins.register(later, name="later")
    assert trainer.plugin_manager is not before and trainer.plugin_manager.is_registered(later)
    assert not before.is_registered(later)


def test_plugin_manager_for_keeps_the_registry_order_and_adds_the_extra_last(fresh_plugins):
    extra = _plugin("extra", sgd_checkpoint_codecs=lambda: [])
    pm = fresh_plugins.plugin_manager_for([extra])
    names = [name for name, _ in pm.list_name_plugin()]
    shared = [name for name, _ in fresh_plugins.get_plugin_manager().list_name_plugin()]
    assert names == [*shared, "extra"]
    assert plugins.manager_of(pm.hook) is pm and plugins.manager_of(object()) is None


def test_plugin_error_pickles_with_its_names():
    import pickle

    error = plugins.PluginError("plugin 'x' implements 'sgd_nope'", "x", "sgd_nope")
    back = pickle.loads(pickle.dumps(error))
    assert (str(back), back.plugin, back.hook_name) == (str(error), "x", "sgd_nope")
    assert isinstance(back, ValueError) and isinstance(back, pluggy.PluginValidationError)


def test_the_codec_table_is_read_through_a_relay_or_a_manager(fresh_plugins):
    pm = plugins.plugin_manager_for([_plugin("codec", sgd_checkpoint_codecs=lambda: [_TagCodec()])])
    assert "tagged" in registered_codecs(hook=pm) and "tagged" in registered_codecs(hook=pm.hook)
    buffer = io.BytesIO()
    registered_codecs(hook=pm)["tagged"].save({"a": 1}, buffer)
    assert buffer.getvalue().startswith(b"TAG:")
