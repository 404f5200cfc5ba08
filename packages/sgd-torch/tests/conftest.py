import pytest

import sgd


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A started 2-worker torch trainer shared by one test module's tests."""
    import sgd_testing.fixtures as f

    f._start_local_ray()
    trainer = sgd.Trainer(backend="torch", num_workers=2, logdir=tmp_path_factory.mktemp("torch"))
    trainer.start()
    yield trainer
    trainer.shutdown()
