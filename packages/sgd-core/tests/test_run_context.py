"""A backend's context around every training function (sgd.backend.on_worker_run)."""

import contextlib
import threading
from pathlib import Path

import pytest

import sgd


def _note(folder, event):
    with open(Path(folder, f"rank_{sgd.world_rank()}"), "a") as f:
        f.write(f"{event}\n")


def _register(folder):
    from sgd.backend import on_worker_run, on_worker_run_error

    @contextlib.contextmanager
    def around():
        thread = threading.current_thread()
        thread.sgd_inside = True
        _note(folder, f"enter {thread.name}")
        try:
            yield
        except BaseException as exc:
            _note(folder, f"saw {type(exc).__name__}")
            raise
        finally:
            thread.sgd_inside = False
            _note(folder, f"exit {thread.name}")

    def error_hook():
        _note(folder, f"error-hook inside={getattr(threading.current_thread(), 'sgd_inside', None)}")

    on_worker_run(around)
    on_worker_run(around)  # twice: entered once
    on_worker_run_error(error_hook)
    import builtins

    builtins._sgd_test_around = around  # for _unregister


def _unregister():
    import builtins

    from sgd.backend import remove_worker_run

    remove_worker_run(builtins._sgd_test_around)
    remove_worker_run(builtins._sgd_test_around)  # not registered any more: nothing happens


def _inside_now():
    thread = threading.current_thread()
    return getattr(thread, "sgd_inside", False), thread.name


def test_every_run_is_inside_the_context_in_its_training_thread(ray_cluster, tmp_path):
    folder = str(tmp_path)

    class Around(sgd.BackendConfig):
        @property
        def backend_cls(self):
            def on_start(self, worker_group, backend_config):
                worker_group.execute(_register, folder)

            return type("AroundBackend", (sgd.Backend,), {"on_start": on_start})

    def events(rank):
        return Path(folder, f"rank_{rank}").read_text().splitlines()

    trainer = sgd.Trainer(backend=Around(), num_workers=2)
    trainer.start()
    try:
        assert trainer.run(_inside_now) == [(True, "sgd-train")] * 2
        assert events(0) == events(1) == ["enter sgd-train", "exit sgd-train"]

        def fails():
            if sgd.world_rank() == 1:
                raise KeyError("broken")

        with pytest.raises(KeyError):
            trainer.run(fails)
        # The context saw the error and exited before the run-error hooks ran (which run before
        # the driver hears of the error).
        assert events(1)[2:] == ["enter sgd-train", "saw KeyError", "exit sgd-train", "error-hook inside=False"]
        trainer.run(_unregister)
        assert trainer.run(_inside_now) == [(False, "sgd-train")] * 2
    finally:
        trainer.shutdown()
