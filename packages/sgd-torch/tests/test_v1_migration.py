"""A ``TrainingOperator`` outside the v1 trainer: in a v2 ``train_func`` (the migration guide's
"continue to use TrainingOperator" example, with ``import sgd``) and in a plain process."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import sgd
from sgd_torch.v1 import TrainingOperator

W = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


class MyTrainingOperator(TrainingOperator):
    def setup(self, config):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-2))
        loss = torch.nn.MSELoss()
        self.model, self.optimizer, self.criterion = self.register(models=model, optimizers=optimizer,
                                                                   criterion=loss)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 4, generator=g)
        dataset = TensorDataset(x, x @ W)
        self.register_data(train_loader=DataLoader(dataset, batch_size=16, shuffle=True),
                           validation_loader=DataLoader(dataset, batch_size=64))


# --- the migration guide's v2 example, as it runs on sgd ---------------------------------------


def train_func(config):
    device = torch.device(f"cuda:{sgd.local_rank()}" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        torch.cuda.set_device(device)

    # Set the args to whatever values you want.
    training_operator = MyTrainingOperator(
        config=config,
        world_rank=sgd.world_rank(),
        local_rank=sgd.local_rank(),
        is_distributed=True,
        device=device,
        use_gpu=torch.cuda.is_available(),
        wrap_ddp=True,
        add_dist_sampler=True,
    )
    training_operator.setup(config)

    for idx in range(config["num_epochs"]):
        train_loader = training_operator._get_train_loader()
        # If using DistributedSampler, set the epoch here.
        train_loader.set_epoch(idx)
        train_stats = training_operator.train_epoch(iter(train_loader), info={"epoch_idx": idx})

        validation_loader = training_operator._get_validation_loader()
        val_stats = training_operator.validate(iter(validation_loader))
        sgd.report(epoch=idx, train_loss=train_stats["train_loss"], train_samples=train_stats["num_samples"],
                   val_loss=val_stats["val_loss"])

    if sgd.world_rank() == 0:
        return training_operator._get_original_models()
    else:
        return None


# --- the same operator, the short way: its state as sgd checkpoints ---------------------------------


def train_func_short(config):
    operator = MyTrainingOperator(config)  # rank, device and DDP from the process group sgd set up
    state = sgd.load_checkpoint()
    if state is not None:
        operator.load_full_state_dict(state)
    while operator.epoch < config["num_epochs"]:
        stats = operator.run_train_epoch()  # shuffles for operator.epoch, then counts it
        sgd.report({**stats, **operator.run_validation()})
        sgd.save_checkpoint(**operator.full_state_dict())
    return type(operator.model).__name__


def test_migration_guide_operator_in_a_v2_train_func(trainer):
    rounds = []

    class Keep(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            rounds.append(results)

    results = trainer.run(train_func, config={"num_epochs": 4, "lr": 0.05}, callbacks=[Keep()])
    final_model = results[0]
    assert results[1] is None
    assert type(final_model) is torch.nn.Linear  # the original model, not the DDP wrapper
    assert [r[0]["epoch"] for r in rounds] == [0, 1, 2, 3]
    assert rounds[-1][0]["val_loss"] < rounds[0][0]["val_loss"] / 4
    assert rounds[0][0]["train_samples"] == 128  # each worker trains its own half
    assert torch.allclose(final_model.weight, W.T, atol=0.5)


def test_operator_state_through_sgd_checkpoints(trainer):
    assert trainer.run(train_func_short, config={"num_epochs": 2, "lr": 0.05}) == ["DistributedDataParallel"] * 2
    state = trainer.latest_checkpoint
    assert state["epoch"] == 2 and state["format"] == "sgd_torch.v1/1"
    assert list(state["models"][0]) == ["weight", "bias"]  # unwrapped: no "module." prefix
    # Resume from it: two more epochs, not four.
    trainer.run(train_func_short, config={"num_epochs": 4, "lr": 0.05}, checkpoint=state)
    assert trainer.latest_checkpoint["epoch"] == 4


# --- no sgd, no Ray: a single-process operator -------------------------------------------------------


def test_operator_standalone_without_a_process_group():
    operator = MyTrainingOperator({"lr": 0.05})
    assert operator.world_rank == 0 and operator.world_size == 1 and operator.device.type in ("cpu", "cuda")
    first = operator.run_train_epoch()
    second = operator.run_train_epoch(num_steps=3)
    assert first["epoch"] == 1 and second["epoch"] == 2
    assert first["num_samples"] == 256 and second["batch_count"] == 3
    assert isinstance(operator.model, torch.nn.Linear)  # no DDP in a single process
    val = operator.run_validation()
    assert val["num_samples"] == 256 and val["val_loss"] < first["train_loss"]

    copy = MyTrainingOperator({"lr": 0.05})
    copy.load_full_state_dict(operator.full_state_dict())
    assert copy.epoch == 2 and copy.global_step == operator.global_step
    assert torch.equal(copy.model.weight, operator.model.weight)


def test_operator_errors_say_what_to_do():
    class NoRegister(TrainingOperator):
        def setup(self, config):
            pass

    with pytest.raises(RuntimeError, match="did not call self.register"):
        NoRegister().run_train_epoch()
    with pytest.raises(NotImplementedError, match="override it"):
        TrainingOperator().run_train_epoch()

    class TwoModels(TrainingOperator):
        def setup(self, config):
            a, b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
            self.register(models=[a, b], optimizers=[torch.optim.SGD(a.parameters(), lr=0.1)],
                          criterion=torch.nn.MSELoss())
            self.register_data(train_loader=[(torch.ones(2, 1), torch.ones(2, 1))])

    with pytest.raises(RuntimeError, match="Override train_batch"):
        TwoModels().run_train_epoch()
    with pytest.raises(RuntimeError, match="no validation data"):
        TwoModels().run_validation()
    with pytest.raises(TypeError, match="torch.nn.Module"):
        TwoModels().register(models="model", optimizers=[])
    with pytest.raises(ValueError, match="scheduler_step_freq"):
        TrainingOperator(scheduler_step_freq="hourly")


def test_from_creators_builds_an_operator_class():
    def model_creator(config):
        return torch.nn.Linear(1, 1)

    def optimizer_creator(model, config):
        return torch.optim.SGD(model.parameters(), lr=config["lr"])

    def scheduler_creator(optimizer, config):
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    def data_creator(config):
        x = torch.randn(32, 1)
        return DataLoader(TensorDataset(x, 2 * x), batch_size=8)

    cls = TrainingOperator.from_creators(model_creator, optimizer_creator, data_creator,
                                         loss_creator=torch.nn.MSELoss, scheduler_creator=scheduler_creator)
    assert issubclass(cls, TrainingOperator)
    operator = cls({"lr": 0.1})
    stats = operator.run_train_epoch()
    assert stats["batch_count"] == 4 and stats["epoch"] == 1
    assert operator.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 4)  # "batch" by default
    with pytest.raises(ValueError, match="needs optimizer_creator"):
        TrainingOperator.from_creators(model_creator, None)
