"""Ray 2.60's ``python/ray/train/v2/tests/test_persistence.py`` on sgd (issue 53).

Ray's wheel does not ship its v2 tests, and Ray's repository text stays out of this one: the test
is written anew from Ray's (the same scenario, public calls and assertions), with the modules renamed
by issue 53's map (``ray.train`` → ``sgd``, ``ray.train.collective`` → ``sgd.collective``); a
``# sgd:`` comment marks every other difference.

The scenario: three workers report six checkpoints named ``checkpoint_epoch=<i>``
(``report(checkpoint_dir_name=...)``; rank 0 reports none), fail at iterations 2 and 4 and are
retried (``FailureConfig(max_failures=2)``: user exceptions retried), each attempt starting from the
latest checkpoint with ``get_all_reported_checkpoints()`` counting what came before; then the same
trainer is run again under the same name and resumes. Checked: the run folder is
``storage_path/name``, the checkpoints kept, every rank's shard in each.

Runtime: about 20 s per case on a 2-core machine.
"""

import os
import pickle
import re
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs
import pytest

import sgd
import sgd.collective  # sgd: was ray.train.collective
from sgd import Checkpoint, CheckpointConfig, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig


class TestConstants:
    NUM_ITERATIONS = 6  # == the number of checkpoints
    NUM_WORKERS = 3
    SCORE_KEY = "score"


@pytest.fixture(autouse=True)
def ray_start_4_cpus(ray_cluster):
    # sgd: the session's 4-CPU cluster instead of ray.init(num_cpus=4) / ray.shutdown() per module
    yield ray_cluster


@contextmanager
def dummy_context_manager(*args, **kwargs):
    yield "dummy value"


def _create_mock_custom_fs(root: Path) -> pyarrow.fs.FileSystem:
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    root.mkdir(parents=True, exist_ok=True)
    return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(DirFileSystem(path=str(root), fs=LocalFileSystem())))


def _resolve_storage_type(storage_path_type, tmp_path):
    # sgd: no "cloud" case (Ray's starts a mock S3 server)
    if storage_path_type == "nfs":
        return str(tmp_path / "fake_nfs"), None
    return "mock_bucket", _create_mock_custom_fs(tmp_path / "custom_fs")


def _download(fs, fs_path, local_path):  # sgd: was Ray's private storage._download_from_fs_path
    Path(local_path).mkdir(parents=True, exist_ok=True)
    pyarrow.fs.copy_files(fs_path, str(local_path), source_filesystem=fs,
                          destination_filesystem=pyarrow.fs.LocalFileSystem())


def _get_local_inspect_dir(root_local_path, storage_path, storage_filesystem):
    local_inspect_dir = root_local_path / "inspect"
    if storage_filesystem:
        fs, storage_fs_path = storage_filesystem, storage_path
    else:
        fs, storage_fs_path = pyarrow.fs.FileSystem.from_uri(storage_path)
    _download(fs, storage_fs_path, local_inspect_dir)
    return local_inspect_dir, storage_fs_path


def _get_checkpoint_epoch(name):
    match = re.search(r"checkpoint_epoch=(\d+)", name)
    assert match
    return int(match.group(1))


def _create_checkpoint_shard_filename(rank_str):
    return f"checkpoint_shard-rank={rank_str}.pkl"


def _get_checkpoint_shard_rank(name):
    match = re.search(_create_checkpoint_shard_filename(r"(\d+)"), name)
    assert match
    return int(match.group(1))


def train_fn(config):
    start = 0
    checkpoint = sgd.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            with open(os.path.join(checkpoint_dir, "checkpoint.pkl"), "rb") as f:
                state = pickle.load(f)
        start = state["iter"] + 1

    got = len(sgd.get_all_reported_checkpoints())
    expected = min(start, config.get("num_to_keep", float("inf")))
    assert got == expected, f"Expected {expected} checkpoints, got {got}"

    for i in range(start, config.get("num_iterations", 5)):
        # sgd: no time.sleep(time_per_iter): Ray's outlasts its controller's health-check interval
        metrics = {"iter": i, TestConstants.SCORE_KEY: i}
        rank = sgd.get_context().get_world_rank()
        if rank in config.get("no_checkpoint_ranks", []):
            sgd.report(metrics, checkpoint=None, checkpoint_dir_name=f"checkpoint_epoch={i}")
        else:
            with tempfile.TemporaryDirectory() as temp_dir:
                with open(os.path.join(temp_dir, "checkpoint.pkl"), "wb") as f:
                    pickle.dump({"iter": i}, f)
                with open(os.path.join(temp_dir, _create_checkpoint_shard_filename(str(rank))), "wb") as f:
                    pickle.dump({"iter": i}, f)
                sgd.report(metrics, checkpoint=Checkpoint.from_directory(temp_dir),
                           checkpoint_dir_name=f"checkpoint_epoch={i}")
                assert os.path.exists(temp_dir)  # report must not delete the caller's folder

        # Ray's workaround for its own race (a fast rank 0 failing before the others' checkpoints
        # were processed), kept: it also exercises barrier() between reports
        sgd.collective.barrier()

        if i in config.get("fail_iters", []):
            got = len(sgd.get_all_reported_checkpoints())
            expected = min(i + 1, config.get("num_to_keep", float("inf")))
            assert got == expected, f"Expected {expected} checkpoints, got {got}"
            raise RuntimeError(f"Failing on iter={i}!!")


def _assert_storage_contents(local_inspect_dir, exp_name, checkpoint_config, no_checkpoint_ranks=()):
    storage_path_ls = list(local_inspect_dir.glob("*"))
    assert len(storage_path_ls) == 1, storage_path_ls  # only the experiment folder
    exp_dir = storage_path_ls[0]
    assert exp_dir.name == exp_name

    expected_num_checkpoints = checkpoint_config.num_to_keep or TestConstants.NUM_ITERATIONS
    # sgd: the checkpoints sit in the run folder's checkpoints/ (Ray: in the run folder itself)
    checkpoint_dirs = list(exp_dir.joinpath("checkpoints").glob("checkpoint_epoch=*"))
    assert len(checkpoint_dirs) == expected_num_checkpoints
    assert sorted(_get_checkpoint_epoch(d.name) for d in checkpoint_dirs) == list(
        range(TestConstants.NUM_ITERATIONS - expected_num_checkpoints, TestConstants.NUM_ITERATIONS)
    )
    for checkpoint_dir in checkpoint_dirs:
        assert len(list(checkpoint_dir.glob("checkpoint.pkl"))) == 1  # shared by the workers
        ranks = {_get_checkpoint_shard_rank(p.name) for p in checkpoint_dir.glob("checkpoint_shard-*.pkl")}
        assert ranks == {i for i in range(TestConstants.NUM_WORKERS) if i not in no_checkpoint_ranks}


@pytest.mark.parametrize(
    "storage_path_type, checkpoint_config",
    [  # sgd: three of Ray's six cases (no "cloud": a mock S3 server), for a short suite
        ("nfs", CheckpointConfig()),
        ("nfs", CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=TestConstants.SCORE_KEY,
                                 checkpoint_score_order="max")),
        pytest.param("custom_fs", CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=TestConstants.SCORE_KEY,
                                                   checkpoint_score_order="max"),
                     marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
                         "sgd keeps a run's folder (results, Result.path) on the driver's disk and mirrors its "
                         "checkpoints to RunConfig(storage_filesystem=..., storage_path=...); Ray's run folder is on "
                         "that filesystem, so Ray's `result.path.startswith(storage_path)` fails (training, retries "
                         "and the resumed re-run pass)"))),
    ],
    ids=["nfs-all", "nfs-keep1", "custom_fs-keep1"],
)
def test_trainer(tmp_path, storage_path_type, checkpoint_config):
    exp_name = f"trainer_persistence_test-{uuid.uuid4().hex}"
    no_checkpoint_ranks = [0]  # rank 0 need not checkpoint
    num_to_keep = checkpoint_config.num_to_keep or float("inf")
    storage_path, storage_filesystem = _resolve_storage_type(storage_path_type, tmp_path)
    run_config = RunConfig(
        storage_path=storage_path,
        storage_filesystem=storage_filesystem,
        name=exp_name,
        checkpoint_config=checkpoint_config,
        failure_config=FailureConfig(max_failures=2),
    )
    train_loop_config = {
        "num_iterations": TestConstants.NUM_ITERATIONS,
        "fail_iters": [2, 4],
        "no_checkpoint_ranks": no_checkpoint_ranks,
        "num_to_keep": num_to_keep,
    }

    def make_trainer():
        return DataParallelTrainer(train_fn, train_loop_config=train_loop_config,
                                   scaling_config=ScalingConfig(num_workers=TestConstants.NUM_WORKERS),
                                   run_config=run_config)

    make_trainer().fit()
    result = make_trainer().fit()  # the same name again: resumes from the latest checkpoint

    local_inspect_dir, storage_fs_path = _get_local_inspect_dir(tmp_path, run_config.storage_path, storage_filesystem)
    run_path = result.path
    assert run_path.startswith(storage_fs_path)
    for checkpoint, _ in result.best_checkpoints:
        assert checkpoint.path.startswith(run_path)
    _assert_storage_contents(local_inspect_dir, exp_name, checkpoint_config, no_checkpoint_ranks=no_checkpoint_ranks)
