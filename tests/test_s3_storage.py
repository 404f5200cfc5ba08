"""Checkpoints in S3, against a real S3-compatible server (moto's standalone server, the one
Ray's own tests use) reached over HTTP by pyarrow: checkpoints land in the bucket with their
checksums, and a driver with an empty local directory resumes from the URI alone."""

import json

import pytest

import sgd

moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (in the nox test dependencies)")
boto3 = pytest.importorskip("boto3")

BUCKET = "sgd-test"


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server on loopback; pyarrow finds it through AWS_ENDPOINT_URL, as it would MinIO."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    yield client
    server.stop()


def _objects(client, prefix):
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: o for page in pages for o in page.get("Contents", [])}


def _epochs(config):
    start = (sgd.load_checkpoint() or {}).get("epoch", 0)
    for epoch in range(start + 1, start + config.get("epochs", 3) + 1):
        sgd.report(epoch=epoch)
        sgd.save_checkpoint(epoch=epoch, weights=[float(epoch)] * 4)
    return start


def test_trainer_storage_path_round_trip_and_resume_from_the_uri_alone(s3, ray_cluster, tmp_path):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, logdir=tmp_path / "local" / "exp",
                          storage_path=f"s3://{BUCKET}/prefix")
    trainer.start()
    try:
        trainer.run(_epochs)
    finally:
        trainer.shutdown()
    checkpoints = f"prefix/exp/{trainer.latest_run_dir.name}/checkpoints"
    keys = _objects(s3, checkpoints)
    assert {k.split("/")[-2] for k in keys if "checkpoint_" in k} == {
        "checkpoint_000001", "checkpoint_000002", "checkpoint_000003"}
    meta = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{checkpoints}/checkpoint_000003/.sgd_checkpoint.json")
                      ["Body"].read())
    state_key = f"{checkpoints}/checkpoint_000003/{meta['state_file']}"
    assert keys[state_key]["Size"] == meta["files"][meta["state_file"]]["size"]
    assert len(meta["files"][meta["state_file"]]["sha256"]) == 64

    # A new driver: another local directory, nothing of the first run on its disk.
    uri = f"s3://{BUCKET}/{checkpoints}"
    assert sgd.Trainer.load_checkpoint_from_path(f"{uri}/checkpoint_000002")["epoch"] == 2
    newest = sgd.Checkpoint.newest_in(uri)
    assert newest.to_dict()["epoch"] == 3
    fresh = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, logdir=tmp_path / "elsewhere" / "exp2")
    fresh.start()
    try:
        assert fresh.run(_epochs, checkpoint=newest, config={"epochs": 2}) == [3, 3]
        assert fresh.latest_checkpoint["epoch"] == 5
    finally:
        fresh.shutdown()

    # A damaged object in the bucket is found, named, and skipped.
    s3.put_object(Bucket=BUCKET, Key=state_key, Body=b"garbage")
    with pytest.raises(sgd.checkpoint.CheckpointIntegrityError, match=meta["state_file"]):
        sgd.Trainer.load_checkpoint_from_path(f"{uri}/checkpoint_000003")
    assert sgd.Checkpoint.newest_in(uri).to_dict()["epoch"] == 2


def _air_loop(config):
    import tempfile

    start = 0
    checkpoint = sgd.get_checkpoint()
    if checkpoint is not None:
        start = checkpoint.to_dict()["epoch"]
    for epoch in range(start + 1, start + 3):
        sgd.report({"epoch": epoch}, checkpoint=sgd.Checkpoint.from_dict({"epoch": epoch}))
    del tempfile


def test_run_config_storage_path_in_s3(s3, ray_cluster, tmp_path, results_dir):
    from sgd import DataParallelTrainer, RunConfig, ScalingConfig

    trainer = DataParallelTrainer(_air_loop, scaling_config=ScalingConfig(num_workers=2),
                                  run_config=RunConfig(name="air_s3", storage_path=f"s3://{BUCKET}/air"))
    result = trainer.fit()
    assert result.error is None, result.error
    # The run's folder is local (under the results root), its checkpoints mirrored to
    # <storage_path>/<name>/checkpoints: Ray 2.60's layout, no run_NNN.
    assert result.path == str(results_dir / "air_s3")
    keys = _objects(s3, "air/air_s3/")
    assert any(k.startswith("air/air_s3/checkpoints/checkpoint_000002/") for k in keys)
    assert any(k.endswith("checkpoint_000002/.sgd_checkpoint.json") for k in keys)
    uri = f"s3://{BUCKET}/air/air_s3/checkpoints"
    resumed = DataParallelTrainer(_air_loop, scaling_config=ScalingConfig(num_workers=2),
                                  run_config=RunConfig(name="air_s3_resumed", storage_path=str(tmp_path)),
                                  resume_from_checkpoint=sgd.Checkpoint.newest_in(uri))
    result2 = resumed.fit()
    assert result2.error is None, result2.error
    assert result2.metrics["epoch"] == 4
