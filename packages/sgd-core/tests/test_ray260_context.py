"""get_context().get_storage() in a real run (issue 53)."""

from pathlib import Path

import pyarrow.fs

import sgd
from sgd import DataParallelTrainer, RunConfig, ScalingConfig


def loop():
    storage = sgd.get_context().get_storage()
    assert isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem)
    sgd.report({"experiment_fs_path": storage.experiment_fs_path, "name": storage.experiment_dir_name,
                "storage_fs_path": storage.storage_fs_path, "checkpoints": storage.checkpoint_fs_path,
                "sees_it": Path(storage.experiment_fs_path).is_dir()})


def test_get_storage_names_the_run_folder(ray_cluster, tmp_path):
    result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(name="where", storage_path=str(tmp_path))).fit()
    m = result.metrics
    assert m["experiment_fs_path"] == Path(result.path).as_posix()
    assert m["name"] == "where" and Path(m["storage_fs_path"]) == Path(result.path).parent
    assert m["checkpoints"] == (Path(result.path) / "checkpoints").as_posix()
    assert m["sees_it"]  # one host here: the driver's disk
