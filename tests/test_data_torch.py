"""A Parquet dataset written here, read with Ray Data, trains a 2-worker torch regression."""

import pytest
import torch

import sgd

ray_data = pytest.importorskip("ray.data")
pq = pytest.importorskip("pyarrow.parquet")


def _train(config):
    from sgd_torch import prepare_model

    model = prepare_model(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    shard = sgd.get_dataset_shard("train")
    for epoch in range(config["epochs"]):
        total, n = 0.0, 0
        for batch in shard.iter_torch_batches(batch_size=32, dtypes=torch.float32):
            x = torch.stack([batch["a"], batch["b"], batch["c"]], dim=1)
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), batch["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + loss.item() * len(x), n + len(x)
        sgd.report(epoch=epoch, loss=total / n, rows=n)


def test_parquet_regression(ray_cluster, tmp_path):
    import pyarrow as pa

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 3, generator=g)
    y = x @ torch.tensor([2.0, -1.0, 0.5]) + 0.3
    for part in range(4):  # several files, as a real dataset has
        rows = slice(part * 128, (part + 1) * 128)
        table = pa.table({"a": x[rows, 0].numpy(), "b": x[rows, 1].numpy(), "c": x[rows, 2].numpy(),
                          "y": y[rows].numpy()})
        pq.write_table(table, tmp_path / f"part-{part}.parquet")

    rounds = []

    class Keep(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            rounds.append(results)

    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainer.start()
    try:
        trainer.run(_train, config={"epochs": 5}, dataset={"train": ray_data.read_parquet(str(tmp_path))},
                    callbacks=[Keep()])
    finally:
        trainer.shutdown()
    assert all(sum(r["rows"] for r in results) == 512 for results in rounds)  # each epoch: all rows once
    first, last = rounds[0][0]["loss"], rounds[-1][0]["loss"]
    assert last < first / 5, (first, last)
