"""The torch backend on real gloo process groups."""

import os
import time

import pytest
import torch

import sgd
from sgd_torch import TorchConfig


def test_config_validation():
    assert TorchConfig().backend is None and TorchConfig().init_method == "env"
    with pytest.raises(ValueError, match="init_method"):
        TorchConfig(init_method="file")
    with pytest.raises(ValueError, match="gloo"):
        TorchConfig(backend="carrier-pigeon")
    with pytest.raises(ValueError, match="timeout_s"):
        TorchConfig(timeout_s=0)
    with pytest.raises(ValueError, match="keep_survivors must be True or False, got 'yes'"):
        TorchConfig(keep_survivors="yes")


class _Group:
    def __init__(self, gpus):
        self.num_gpus_per_worker = gpus


def test_which_groups_keep_survivors():
    from sgd_torch import TorchBackend

    keeps = TorchBackend().keeps_survivors
    assert keeps(_Group(0), TorchConfig())  # gloo on CPUs
    assert not keeps(_Group(0), TorchConfig(keep_survivors=False))
    assert not keeps(_Group(1), TorchConfig())  # NCCL with GPUs: every worker is replaced
    assert keeps(_Group(1), TorchConfig(backend="gloo"))


def _env_and_group():
    import torch.distributed as dist

    keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"]
    return {k: os.environ.get(k) for k in keys}, dist.get_backend(), dist.get_rank(), dist.get_world_size()


def test_process_group_and_torchrun_environment(trainer):
    (env0, backend0, r0, n0), (env1, _, r1, _) = trainer.run(_env_and_group)
    assert backend0 == "gloo"
    assert (r0, r1, n0) == (0, 1, 2)
    assert env0["RANK"] == "0" and env1["RANK"] == "1" and env0["WORLD_SIZE"] == "2"
    assert env0["LOCAL_RANK"] == "0" and env1["LOCAL_RANK"] == "1"
    assert env0["MASTER_PORT"] == env1["MASTER_PORT"] and env0["MASTER_ADDR"]


def test_tcp_init_method(ray_cluster):
    trainer = sgd.Trainer(backend=TorchConfig(init_method="tcp"), num_workers=2)
    trainer.start()
    try:
        assert [r[2] for r in trainer.run(_env_and_group)] == [0, 1]
    finally:
        trainer.shutdown()


def _train_linear(config):
    import torch.distributed as dist

    from sgd_torch import enable_reproducibility, prepare_data_loader, prepare_model

    enable_reproducibility(config.get("seed", 0))
    x = torch.randn(256, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    loader = prepare_data_loader(loader)
    model = prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = []
    for epoch in range(config["epochs"]):
        total = 0.0
        for xb, yb in loader:
            seen.append(len(xb))
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        sgd.report(epoch=epoch, loss=total / len(loader), weight=model.module.weight.detach().clone())
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    assert dist.get_world_size() == 2
    return model


def test_ddp_training_converges_and_stays_in_sync(trainer):
    rounds = []

    class Keep(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            rounds.append(results)

    models = trainer.run(_train_linear, config={"epochs": 8}, callbacks=[Keep()])
    assert rounds[-1][0]["loss"] < rounds[0][0]["loss"] / 10
    # DDP keeps replicas identical; returned models arrive unwrapped, on the CPU.
    for m in models:
        assert type(m) is torch.nn.Linear
        assert m.weight.device.type == "cpu"
    assert torch.equal(models[0].weight, models[1].weight)
    assert torch.allclose(models[0].weight, torch.tensor([[1.0, -2.0, 0.5, 3.0]]), atol=0.1)
    # Reported tensors arrive as CPU tensors.
    assert isinstance(rounds[-1][0]["weight"], torch.Tensor)
    assert torch.equal(rounds[-1][0]["weight"], rounds[-1][1]["weight"])


def test_reproducible_with_a_seed(trainer):
    a = trainer.run(_train_linear, config={"epochs": 2, "seed": 3})[0]
    b = trainer.run(_train_linear, config={"epochs": 2, "seed": 3})[0]
    c = trainer.run(_train_linear, config={"epochs": 2, "seed": 4})[0]
    assert torch.equal(a.weight, b.weight)
    assert not torch.equal(a.weight, c.weight)


def _shards(config):
    from sgd_torch import prepare_data_loader

    ds = torch.utils.data.TensorDataset(torch.arange(20))
    loader = prepare_data_loader(torch.utils.data.DataLoader(ds, batch_size=4, shuffle=config["shuffle"]))
    epochs = []
    for _ in range(2):
        epochs.append([int(v) for (batch,) in loader for v in batch])
    return epochs


def test_prepare_data_loader_shards_the_dataset(trainer):
    (a0, a1), (b0, b1) = trainer.run(_shards, config={"shuffle": False})
    assert sorted(a0 + b0) == list(range(20)) and not set(a0) & set(b0)
    assert a0 == a1  # no shuffle: the same shard every epoch
    (s0, s1), (t0, t1) = trainer.run(_shards, config={"shuffle": True})
    assert sorted(s0 + t0) == list(range(20)) and sorted(s1 + t1) == list(range(20))
    assert s0 != s1  # set_epoch reshuffles each pass


def _epoch_orders(config):
    from sgd_torch import prepare_data_loader

    ds = torch.utils.data.TensorDataset(torch.arange(40))
    loader = prepare_data_loader(torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True))
    if config["how"] == "wrapper":
        loader.set_epoch(config["start"])
    elif config["how"] == "sampler":  # Ray Train's way
        loader.sampler.set_epoch(config["start"])
    return [[int(v) for (batch,) in loader for v in batch] for _ in range(config["passes"])]


def test_a_resumed_loader_shuffles_as_the_lost_one_would_have(trainer):
    """A restarted training function is a new process: its loader counts epochs from 0
    unless told where it resumes, with either set_epoch."""
    uninterrupted = trainer.run(_epoch_orders, config={"how": None, "start": 0, "passes": 4})
    for how in ("wrapper", "sampler"):
        resumed = trainer.run(_epoch_orders, config={"how": how, "start": 2, "passes": 2})
        assert [r for r in resumed] == [u[2:] for u in uninterrupted], how
    fresh = trainer.run(_epoch_orders, config={"how": None, "start": 0, "passes": 2})
    assert fresh[0][0] != uninterrupted[0][2]  # without it, epoch 2 would repeat epoch 0's order


def _sampler_epoch_each_pass(config):
    from sgd_torch import prepare_data_loader

    ds = torch.utils.data.TensorDataset(torch.arange(8))
    loader = prepare_data_loader(torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True))
    seen = []
    for epoch in config["set"]:
        if epoch is not None:
            loader.sampler.set_epoch(epoch)
        list(loader)
        seen.append(loader.sampler.epoch)
    return seen


def test_the_epoch_set_on_the_sampler_wins_and_counting_goes_on_from_it(trainer):
    seen = trainer.run(_sampler_epoch_each_pass, config={"set": [None, 7, None, 3, 3, None]})[0]
    assert seen == [0, 7, 8, 3, 3, 4]


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def _fsdp_regression(config):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from sgd_torch import prepare_model

    torch.manual_seed(0)
    model = _mlp()
    full = sum(p.numel() for p in model.parameters())
    model = prepare_model(model, parallel_strategy=config.get("strategy", "fsdp"))
    local = sum(getattr(p, "_local_tensor", p).numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(sgd.world_rank())
    x = torch.randn(64, 8, generator=g)
    y = x.sum(1, keepdim=True)
    losses = []
    for _ in range(40):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if config.get("strategy") == "fsdp1":
        state = model.state_dict()  # FSDP1: every worker calls it, it gathers the shards
    else:  # FSDP2: every worker calls it, rank 0 gets the whole state (on the CPU), the others {}
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    sgd.save_checkpoint(model=state)
    return type(model).__name__, full, local, losses, state


def _plain_run(steps=40):
    """The same training in one process on the two workers' batches: what data parallelism
    must reproduce (gradients averaged over the workers)."""
    torch.manual_seed(0)
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    xs = [torch.randn(64, 8, generator=torch.Generator().manual_seed(r)) for r in (0, 1)]
    for _ in range(steps):
        optimizer.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)) for x in xs) / 2
        loss.backward()
        optimizer.step()
    return model.state_dict()


def test_fsdp_is_fsdp2_per_layer_and_trains_as_one_process_would(trainer):
    """parallel_strategy="fsdp" is FSDP2 (fully_shard on each layer, then the model): each
    worker holds about half of every layer, training matches one process on both batches, and
    the whole state gathered on rank 0 loads into the plain model."""
    (name, full, local0, losses0, state0), (_, _, local1, losses1, state1) = trainer.run(_fsdp_regression)
    assert name == "FSDPSequential"
    assert local0 + local1 == full and max(local0, local1) < full  # every parameter split in two
    assert losses0[-1] < losses0[0] / 4 and losses1[-1] < losses1[0] / 4
    assert state1 == {}  # cpu_offload with a full state dict: rank 0 holds it
    expected = _plain_run()
    assert state0.keys() == expected.keys()
    assert all(torch.allclose(state0[k], expected[k], atol=1e-5) for k in expected)
    plain = _mlp()
    plain.load_state_dict(trainer.latest_checkpoint["model"])  # strict: the keys of the plain model
    assert all(torch.equal(plain.state_dict()[k], state0[k]) for k in state0)


def test_fsdp1_stays_reachable(trainer):
    (name, full, local0, losses0, state0), (_, _, local1, _, state1) = trainer.run(
        _fsdp_regression, config={"strategy": "fsdp1"})
    assert name == "FullyShardedDataParallel"
    assert local0 + local1 <= full + 2 and max(local0, local1) < full  # each holds about half
    assert losses0[-1] < losses0[0] / 4
    assert all(torch.equal(state0[k], state1[k]) for k in state0)
    plain = _mlp()
    plain.load_state_dict(trainer.latest_checkpoint["model"])


def test_shard_units_are_the_layers():
    from sgd_torch.train_loop_utils import shard_units

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.mlp = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
            self.head = torch.nn.Linear(4, 2)

    net = Net()
    assert shard_units(net) == list(net.blocks)  # transformer-style: one unit per block
    mlp = _mlp()
    assert shard_units(mlp) == [mlp[0], mlp[2]]  # a Sequential: its layers with parameters
    flat = torch.nn.Module()
    flat.a, flat.b = torch.nn.Linear(2, 2), torch.nn.ReLU()
    assert shard_units(flat) == [flat.a]  # no container: the children that hold parameters


def _checkpoints_the_fsdp_module(config):
    from sgd_torch import prepare_model

    model = prepare_model(_mlp(), parallel_strategy=config["strategy"])
    sgd.save_checkpoint(model=model if config["what"] == "module" else model.state_dict())


@pytest.mark.parametrize("strategy,what,match", [
    ("fsdp1", "module", r"model.state_dict\(\)"),
    ("fsdp", "module", r"DTensor shards of an FSDP2 model.*get_model_state_dict"),
    ("fsdp", "state_dict", r"DTensor shards of an FSDP2 model.*full_state_dict=True"),
])
def test_a_sharded_model_in_a_checkpoint_is_refused_with_the_way_out(trainer, strategy, what, match):
    with pytest.raises(TypeError, match=match):
        trainer.run(_checkpoints_the_fsdp_module, config={"strategy": strategy, "what": what})
    assert trainer.run(lambda: sgd.world_rank()) == [0, 1]  # the trainer is still usable


def _wrapper_of(config):
    from sgd_torch import prepare_model

    return type(prepare_model(_mlp(), **config)).__name__


def test_parallel_strategy_names(trainer):
    assert trainer.run(_wrapper_of, config={})[0] == "DistributedDataParallel"
    assert trainer.run(_wrapper_of, config={"parallel_strategy": None})[0] == "Sequential"
    assert trainer.run(_wrapper_of, config={"wrap_ddp": False})[0] == "Sequential"
    assert trainer.run(_wrapper_of, config={"parallel_strategy": "fsdp"})[0] == "FSDPSequential"
    with pytest.raises(ValueError, match="'ddp', 'fsdp', 'fsdp1' or None"):
        trainer.run(_wrapper_of, config={"parallel_strategy": "zero3"})


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        import sgd

        return iter(range(sgd.world_rank() * 100, sgd.world_rank() * 100 + 6))  # sharded by the user


def _iterable_loader(config):
    from sgd_torch import prepare_data_loader

    loader = prepare_data_loader(torch.utils.data.DataLoader(_Stream(), batch_size=4))
    return [int(v) for batch in loader for v in batch]


def test_prepare_data_loader_leaves_an_iterable_dataset_to_its_own_sharding(trainer):
    assert trainer.run(_iterable_loader) == [list(range(6)), list(range(100, 106))]


def test_single_worker_is_not_wrapped(ray_cluster):
    trainer = sgd.Trainer(backend="torch", num_workers=1)
    trainer.start()
    try:
        def train_func():
            from sgd_torch import get_device, prepare_model

            return type(prepare_model(torch.nn.Linear(2, 2))).__name__, str(get_device())

        assert trainer.run(train_func) == [("Linear", "cpu")]
    finally:
        trainer.shutdown()


def test_error_while_peer_is_in_all_reduce(trainer):
    """Rank 1 raises while rank 0 waits in all_reduce: the driver re-raises quickly,
    and the next run gets a working process group again."""

    def train_func():
        import torch.distributed as dist

        if sgd.world_rank() == 1:
            raise RuntimeError("rank 1 broke before the all_reduce")
        dist.all_reduce(torch.ones(1))

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 broke") as info:
        trainer.run(train_func)
    assert time.monotonic() - start < 15
    assert info.value.sgd_world_rank == 1

    def all_reduce():
        import torch.distributed as dist

        t = torch.ones(1) * (sgd.world_rank() + 1)
        dist.all_reduce(t)
        return t.item()

    assert trainer.run(all_reduce) == [3.0, 3.0]


def test_after_an_error_mid_collective_the_next_run_has_the_same_processes_and_a_new_process_group(
        trainer, monkeypatch):
    """The failure ends the peer's all_reduce, so every run ends and no process is replaced; the
    next run's process group is a new one that works. (The patience is generous: a loaded
    machine wakes the peer late, and this is about what happens, not how fast.)"""
    from sgd.group import actors

    monkeypatch.setattr(actors, "FAILED_RUN_PATIENCE_S", 60.0)

    def pid_and_all_reduce():
        import torch.distributed as dist

        t = torch.ones(1) * (sgd.world_rank() + 1)
        dist.all_reduce(t)
        return os.getpid(), t.item()

    def fails_in_the_collective():
        import torch.distributed as dist

        if sgd.world_rank() == 1:
            raise RuntimeError("rank 1 broke before the all_reduce")
        dist.all_reduce(torch.ones(1))

    before = trainer.run(pid_and_all_reduce)
    with pytest.raises(RuntimeError, match="rank 1 broke"):
        trainer.run(fails_in_the_collective)
    assert trainer.run(pid_and_all_reduce) == before == [(before[0][0], 3.0), (before[1][0], 3.0)]


def test_a_failed_run_releases_its_peers_also_while_something_still_holds_the_process_group(
        trainer, monkeypatch):
    """The group's connections are shut down on a failure, not left to close when the group is
    freed: here both ranks keep the group referenced (as an FSDP model's cached device mesh
    does), and rank 0's all_reduce still fails at once, so the processes are kept."""
    from sgd.group import actors

    monkeypatch.setattr(actors, "FAILED_RUN_PATIENCE_S", 30.0)

    def pid():
        return os.getpid()

    def holds_the_group_and_fails():
        import torch.distributed as dist

        torch._held_by_an_sgd_test = dist.group.WORLD  # a reference that outlives the run
        if sgd.world_rank() == 1:
            raise RuntimeError("rank 1 broke while holding the group")
        dist.all_reduce(torch.ones(1))

    before = trainer.run(pid)
    with pytest.raises(RuntimeError, match="rank 1 broke"):
        trainer.run(holds_the_group_and_fails)
    assert trainer.run(pid) == before


def test_teardown_destroys_process_group(ray_cluster):
    from sgd_torch import TorchBackend

    trainer = sgd.Trainer(backend="torch", num_workers=2)
    wg = trainer.to_worker_group(_Probe)
    try:
        assert wg.execute(_is_initialized) == [True, True]
        TorchBackend().on_shutdown(wg, trainer.backend_config)
        assert wg.execute(_is_initialized) == [False, False]
    finally:
        wg.shutdown()


class _Probe:
    pass


def _is_initialized():
    import torch.distributed as dist

    return dist.is_initialized()


def test_encode_data_leaves_plain_values_alone():
    from sgd_torch import TorchBackend

    data = {"a": 1, "b": [1.5, "x"], "t": (torch.ones(2, requires_grad=True),)}
    out = TorchBackend.encode_data(data)
    assert out["a"] == 1 and out["b"] == [1.5, "x"]
    assert not out["t"][0].requires_grad


def test_a_report_of_plain_values_is_not_walked_and_one_with_a_tensor_is():
    """The common report (numbers and strings) is handed on as it is, with no copy: a check
    of each value's type, in C. One tensor among the values makes it a walked copy."""
    from sgd_torch import TorchBackend

    plain = {"loss": 0.5, "step": 3, "name": "x", "done": False, "none": None}
    assert TorchBackend.encode_data(plain) is plain
    holding = {"loss": 0.5, "w": torch.ones(2, requires_grad=True)}
    out = TorchBackend.encode_data(holding)
    assert out is not holding and not out["w"].requires_grad and holding["w"].requires_grad
    subclass = {"flag": _Flag(1)}  # an int subclass could be anything: walked, kept as it is
    assert TorchBackend.encode_data(subclass) is not subclass and TorchBackend.encode_data(subclass) == subclass


class _Flag(int):
    pass


def test_get_devices_on_cpu_is_the_cpu(trainer):
    def train_func():
        from sgd_torch import get_device, get_devices

        return [str(d) for d in get_devices()], str(get_device())

    assert trainer.run(train_func) == [(["cpu"], "cpu")] * 2


@pytest.mark.gpu
def test_two_gpus_per_worker_are_both_its_devices(ray_cluster):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    trainer = sgd.Trainer(backend="torch", num_workers=1, use_gpu=True, resources_per_worker={"GPU": 2})
    trainer.start()
    try:
        def train_func():
            from sgd_torch import get_device, get_devices

            return [str(d) for d in get_devices()], str(get_device())

        assert trainer.run(train_func) == [(["cuda:0", "cuda:1"], "cuda:0")]
    finally:
        trainer.shutdown()


@pytest.mark.gpu
def test_gpu_workers_share_devices_and_use_nccl(ray_cluster):
    n = torch.cuda.device_count()
    trainer = sgd.Trainer(backend="torch", num_workers=min(2, n), use_gpu=True)
    trainer.start()
    try:
        def train_func():
            import torch.distributed as dist

            from sgd_torch import get_device, prepare_model

            model = prepare_model(torch.nn.Linear(2, 2))
            t = torch.ones(1, device=get_device())
            dist.all_reduce(t)
            return dist.get_backend(), str(get_device()), next(model.parameters()).device.type, t.item(), model

        results = trainer.run(train_func)
        assert all(r[0] == "nccl" and r[2] == "cuda" for r in results)
        assert len({r[1] for r in results}) == len(results)  # each worker its own GPU
        assert results[0][3] == len(results)
        assert results[0][4].weight.device.type == "cpu"  # arrives on the CPU driver side
    finally:
        trainer.shutdown()



def test_accelerate_helpers_without_amp_are_plain_torch(trainer):
    def train_func():
        from sgd_torch import accelerate, backward, prepare_model, prepare_optimizer

        accelerate(amp=False)
        model = prepare_model(torch.nn.Linear(3, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        wrapped = prepare_optimizer(opt)
        before = model.module.weight.detach().clone()
        loss = model(torch.ones(4, 3)).sum()
        backward(loss)
        wrapped.step()
        return wrapped is opt, bool(torch.equal(before, model.module.weight.detach()))

    assert trainer.run(train_func) == [(True, False), (True, False)]


def _amp_forward(config):
    from sgd_torch import accelerate, prepare_model

    if config["amp"]:
        accelerate(amp=True)
    model = prepare_model(torch.nn.Linear(3, 1))
    return str(model(torch.ones(2, 3)).dtype)


def test_accelerate_amp_on_cpu_runs_the_forward_in_bfloat16_for_that_run_only(trainer):
    assert trainer.run(_amp_forward, config={"amp": True}) == ["torch.bfloat16"] * 2
    # The workers outlive the run; the next training function starts without mixed precision.
    assert trainer.run(_amp_forward, config={"amp": False}) == ["torch.float32"] * 2


def test_torch_checkpoints_are_torch_files_loaded_safely(trainer, tmp_path):
    def train_func():
        model = torch.nn.Linear(2, 1)
        sgd.save_checkpoint(weights=model.state_dict(), step=3)
        sgd.save_checkpoint(module=model, step=4)  # a whole module needs the full unpickler

    trainer.run(train_func)
    first = trainer.latest_checkpoint_dir / "checkpoint_000001"
    assert (first / "state.pt").exists()
    state = torch.load(first / "state.pt", weights_only=True)  # plain tensors: safe loading works
    assert state["step"] == 3 and state["weights"]["weight"].shape == (1, 2)
    # A whole module needs the full unpickler: only with the caller's opt-in (issue 17).
    with pytest.raises(sgd.checkpoint.UntrustedCheckpointError, match="torch.nn.modules.linear.Linear"):
        sgd.Trainer.load_checkpoint_from_path(trainer.latest_checkpoint_dir / "checkpoint_000002", trusted=False)
    loaded = sgd.Trainer.load_checkpoint_from_path(trainer.latest_checkpoint_dir / "checkpoint_000002", trusted=True)
    assert isinstance(loaded["module"], torch.nn.Linear)


def test_checkpoint_sent_to_the_driver_keeps_tensors(trainer):
    """With nothing persisted the state travels to the driver (as numpy, zero-copy) and
    comes back as ordinary, writable CPU tensors."""

    def train_func():
        sgd.save_checkpoint(w=torch.arange(6.0).reshape(2, 3), b=torch.ones(2, dtype=torch.bfloat16),
                            meta={"step": 1})

    trainer.run(train_func, checkpoint_strategy=sgd.CheckpointStrategy(num_to_keep=0))
    state = trainer.latest_checkpoint
    assert not trainer.latest_checkpoint_dir.exists()
    assert torch.equal(state["w"], torch.arange(6.0).reshape(2, 3))
    assert state["b"].dtype == torch.bfloat16 and state["meta"] == {"step": 1}
    state["w"].add_(1)  # writable: not a view of Ray's read-only object store


def _unseeded_weights(config):
    import torch.distributed as dist

    if config.get("destroy"):
        dist.destroy_process_group()  # as a script written for torchrun ends
        return None
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item(), torch.nn.Linear(2, 2).weight.flatten().tolist()  # torch's default generator


def test_a_run_after_a_clean_one_sends_the_workers_nothing_but_its_start(ray_cluster, actor_calls):
    """Each worker notes at a run's end that its process group is still there (a run-end
    hook), and a trainer's first run follows the setup that made the groups, so neither needs
    the backend's per-run call to every worker; each run
    still starts from a fresh process's torch state. A run that destroyed the group makes the
    next one check and build it again."""
    calls = actor_calls
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainer.start()
    try:
        calls.clear()
        first = trainer.run(_unseeded_weights)  # the group start() made: nothing to ask either
        assert calls["_sgd_execute"] == 0 and calls["_sgd_start_training"] == 2
        calls.clear()
        assert trainer.run(_unseeded_weights) == first  # the same weights: a fresh generator
        assert calls["_sgd_execute"] == 0 and calls["_sgd_start_training"] == 2
        trainer.run(_unseeded_weights, config={"destroy": True})
        calls.clear()
        assert trainer.run(_unseeded_weights) == first  # a new group (all_reduce of 2 ranks)
        assert calls["_sgd_execute"] >= 2  # asked, and the group built again
    finally:
        trainer.shutdown()
