"""The preload race (issue 18): the TensorFlow backend starts importing TensorFlow in the
background once the group is set up; a training function that refers to a class deep inside
TensorFlow imports it again while it is unpickled. Both imports at once used to leave one of
them with a partially initialised module (``ImportError: cannot import name 'ServerDef' from
partially initialized module``). Each test starts fresh workers and runs with no pause."""

import pytest

import sgd

# Pickled by reference with the training functions below: unpickling them imports these
# modules. (Found with plain threads: importing either of these while another thread imports
# ``tensorflow`` trips Python's import-deadlock detection in one of the two threads.)
strategy_module = pytest.importorskip("tensorflow.python.distribute.collective_all_reduce_strategy")
CollectiveAllReduceStrategy = strategy_module.CollectiveAllReduceStrategy
ServerDef = pytest.importorskip("tensorflow.core.protobuf.tensorflow_server_pb2").ServerDef


def uses_a_deep_tensorflow_class():
    import tensorflow as tf

    server_def = ServerDef(job_name="worker", task_index=sgd.world_rank())
    # TensorFlow itself must be whole afterwards (a preload that lost the race would leave it half-imported).
    return (CollectiveAllReduceStrategy.__module__, server_def.task_index,
            int(tf.add(tf.constant(1), tf.constant(2)).numpy()))


@pytest.mark.parametrize("attempt", [1, 2])
def test_training_function_unpickled_while_tensorflow_preloads(ray_cluster, attempt):
    trainer = sgd.Trainer(backend="tensorflow", num_workers=2)
    trainer.start()
    try:
        results = trainer.run(uses_a_deep_tensorflow_class)  # no pause after start()
    finally:
        trainer.shutdown()
    assert results == [(strategy_module.__name__, 0, 3), (strategy_module.__name__, 1, 3)]


@pytest.mark.parametrize("attempt", [1, 2])
def test_execute_while_tensorflow_preloads(ray_cluster, attempt):
    """The same race through the class-level API: ``execute`` right after the group is set up."""
    trainer = sgd.Trainer(backend="tensorflow", num_workers=2)
    wg = trainer.to_worker_group(dict)
    try:
        assert wg.execute(lambda: (CollectiveAllReduceStrategy.__name__, ServerDef(job_name="w").job_name)) == [
            ("CollectiveAllReduceStrategy", "w")] * 2
    finally:
        wg.shutdown()
