"""Hugging Face trainers on 2 workers over gloo: TransformersTrainer (Ray Datasets, own
datasets, checkpoint and resume) and AccelerateTrainer (config file, DDP through accelerate).

Tiny models are built from config objects; nothing is downloaded.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Set before Ray starts its workers, which inherit the environment.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

pytest.importorskip("transformers", reason="needs transformers: pip install \"sgd-torch[huggingface]\"")
pytest.importorskip("accelerate", reason="needs accelerate: pip install \"sgd-torch[huggingface]\"")

import numpy as np
import torch

import sgd
from sgd import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

VOCAB = 32
SEQ = 16
CHECKPOINT_FILES = {"model.safetensors", "config.json", "trainer_state.json", "optimizer.pt", "scheduler.pt",
                    "training_args.bin", "rng_state_0.pth", "rng_state_1.pth"}


# --- shared by the worker functions (pickled by value with this module) -----------------


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=1, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def token_rows(n, first_idx=0):
    """Sequences counting up modulo VOCAB: the next token is learnable."""
    rows = []
    for i in range(n):
        start = (i * 7) % VOCAB
        ids = np.array([(start + j) % VOCAB for j in range(SEQ)], dtype=np.int64)
        rows.append({"idx": first_idx + i, "input_ids": ids, "labels": ids.copy()})
    return rows


def hf_args(output_dir, **overrides):
    from transformers import TrainingArguments

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    kwargs = dict(output_dir=output_dir, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                  learning_rate=5e-3, lr_scheduler_type="constant", logging_steps=2, report_to="none",
                  use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0, save_strategy="no",
                  ddp_find_unused_parameters=False)
    kwargs.update(overrides)
    return TrainingArguments(**kwargs)


def fit_quietly(trainer):
    return trainer.fit()  # raises on a failed run


def run_config(tmp_path, name, **kwargs):
    return RunConfig(name=name, storage_path=str(tmp_path / "runs"), verbose=0, **kwargs)


# --- TransformersTrainer ---------------------------------------------------------------------


def init_with_ray_datasets(train_dataset, eval_dataset, output_dir, seen_dir):
    """Records which rows each rank trained on, to check the shards are used as they are."""
    from transformers import Trainer, TrainerCallback, default_data_collator

    from sgd_torch.huggingface import RayShardDataset

    assert isinstance(train_dataset, RayShardDataset) and isinstance(eval_dataset, RayShardDataset)
    seen = []

    def collate(rows):
        seen.extend(int(row["idx"]) for row in rows)
        return default_data_collator([{k: v for k, v in row.items() if k != "idx"} for row in rows])

    class RecordRows(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            Path(seen_dir, f"rank_{sgd.world_rank()}.json").write_text(json.dumps(seen))

    # use_cpu=False: what makes HF join sgd's group on a CPU worker is the environment the worker got.
    args = hf_args(output_dir, max_steps=8, eval_strategy="steps", eval_steps=4, save_strategy="steps",
                   save_steps=4, remove_unused_columns=False, use_cpu=False)
    assert args.world_size == 2 and args.device.type == "cpu"
    return Trainer(model=tiny_gpt2(), args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                   data_collator=collate, callbacks=[RecordRows()])


def test_transformers_trainer_with_ray_datasets(ray_cluster, tmp_path):
    import ray

    from sgd_torch.huggingface import TransformersTrainer

    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    train = ray.data.from_items(token_rows(64))
    evaluation = ray.data.from_items(token_rows(16, first_idx=1000))
    trainer = TransformersTrainer(
        init_with_ray_datasets,
        trainer_init_config={"output_dir": str(tmp_path / "hf"), "seen_dir": str(seen_dir)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "ray_data", checkpoint_config=CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="eval_loss", checkpoint_score_order="min")),
        datasets={"train": train, "evaluation": evaluation},
    )
    result = fit_quietly(trainer)

    # Each rank trained on its own half of the rows, once (8 steps of 4 rows = one pass of 32).
    seen = [json.loads((seen_dir / f"rank_{r}.json").read_text()) for r in range(2)]
    trained = [sorted(i for i in s if i < 1000) for s in seen]
    assert [len(t) for t in trained] == [32, 32]
    assert sorted(trained[0] + trained[1]) == list(range(64))
    # ...and evaluated on its own half of the evaluation rows, at steps 4 and 8.
    evaluated = [sorted(i for i in s if i >= 1000) for s in seen]
    assert sorted(evaluated[0] + evaluated[1]) == sorted(list(range(1000, 1016)) * 2)

    df = result.metrics_dataframe
    # One report per logging step; the checkpoint reports at 4 and 8 carry that step's logs; one at the end.
    assert list(df["step"]) == [2, 4, 6, 8, 8]
    losses = list(df["loss"])
    assert losses[-1] < losses[0]
    assert list(df["eval_loss"].dropna())[-1] < list(df["eval_loss"].dropna())[0]
    final = result.metrics
    assert final["step"] == 8 and "train_loss" in final and "eval_loss" in final and "train_runtime" in final

    # HF's checkpoint-4 and checkpoint-8 became sgd checkpoints: HF's files, every rank's RNG state.
    assert [m["step"] for _, m in result.best_checkpoints] == [4, 8]
    with result.checkpoint.as_directory() as d:
        assert CHECKPOINT_FILES <= set(os.listdir(d))
        assert json.loads(Path(d, "trainer_state.json").read_text())["global_step"] == 8
    # Staging folders were removed from the output dir.
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["checkpoint-4", "checkpoint-8"]


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n):
        self.rows = [{k: torch.as_tensor(v) for k, v in row.items() if k != "idx"} for row in token_rows(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def init_with_own_dataset(train_dataset, eval_dataset, output_dir, epochs):
    from transformers import Trainer

    assert train_dataset is None and eval_dataset is None
    args = hf_args(output_dir, num_train_epochs=epochs, logging_steps=1, save_strategy="steps", save_steps=3)
    return Trainer(model=tiny_gpt2(), args=args, train_dataset=TokenDataset(48))


def test_transformers_trainer_own_dataset_checkpoint_and_resume(ray_cluster, tmp_path):
    from sgd_torch.huggingface import TransformersTrainer

    def make(epochs, output, resume=None):
        return TransformersTrainer(init_with_own_dataset,
                                   trainer_init_config={"output_dir": str(tmp_path / output), "epochs": epochs},
                                   scaling_config=ScalingConfig(num_workers=2),
                                   # a run of its own each: the same name would resume the first run (Ray 2.60)
                                   run_config=run_config(tmp_path, f"own-{output}"), resume_from_checkpoint=resume)

    first = fit_quietly(make(1, "hf1"))
    # HF sharded the 48 rows over sgd's 2 processes: 24 per rank, 6 steps of 4 (not 12).
    assert first.metrics["step"] == 6
    df1 = first.metrics_dataframe
    assert list(df1["step"].dropna())[:3] == [1, 2, 3]
    assert [m["step"] for _, m in first.best_checkpoints] == [3, 6]
    with first.checkpoint.as_directory() as d:
        assert CHECKPOINT_FILES <= set(os.listdir(d))
        assert json.loads(Path(d, "trainer_state.json").read_text())["global_step"] == 6

    # A new fit from that checkpoint continues at global step 7 and trains the second epoch.
    second = fit_quietly(make(2, "hf2", resume=first.checkpoint))
    df2 = second.metrics_dataframe
    assert int(df2["step"].min()) == 7 and second.metrics["step"] == 12
    assert list(df2["loss"].dropna())[0] < list(df1["loss"].dropna())[0]
    with second.checkpoint.as_directory() as d:
        assert json.loads(Path(d, "trainer_state.json").read_text())["global_step"] == 12
    assert sorted(p.name for p in (tmp_path / "hf2").iterdir()) == ["checkpoint-12", "checkpoint-9"]


def init_dying_once(train_dataset, eval_dataset, output_dir, marker):
    """Rank 1's process dies once, at step 6: after the checkpoint of step 4 was reported."""
    from transformers import Trainer, TrainerCallback

    class DieOnce(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 6 and sgd.world_rank() == 1 and not os.path.exists(marker):
                Path(marker).write_text(str(os.getpid()))
                os._exit(1)

    args = hf_args(output_dir, max_steps=8, logging_steps=1, save_strategy="steps", save_steps=4)
    return Trainer(model=tiny_gpt2(), args=args, train_dataset=TokenDataset(48), callbacks=[DieOnce()])


def test_transformers_trainer_restarts_from_its_latest_checkpoint(ray_cluster, tmp_path):
    from sgd_torch.huggingface import TransformersTrainer

    marker = tmp_path / "died"
    result = fit_quietly(TransformersTrainer(
        init_dying_once, trainer_init_config={"output_dir": str(tmp_path / "hf"), "marker": str(marker)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(tmp_path, "restart", failure_config=FailureConfig(max_failures=1))))
    assert marker.exists()
    # The restarted workers resumed HF from checkpoint-4: steps 5 and on are not repeated in the results.
    assert list(result.metrics_dataframe["step"]) == [1, 2, 3, 4, 5, 6, 7, 8, 8]
    assert [m["step"] for _, m in result.best_checkpoints] == [4, 8]
    with result.checkpoint.as_directory() as d:
        state = json.loads(Path(d, "trainer_state.json").read_text())
    assert state["global_step"] == 8
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2, 3, 4, 5, 6, 7, 8]


def returns_a_model(train_dataset, eval_dataset):
    return tiny_gpt2()


def test_transformers_trainer_worker_errors(ray_cluster, tmp_path):
    from sgd_torch.huggingface import TransformersTrainer

    with pytest.raises(TypeError, match="must return a transformers.Trainer, got GPT2LMHeadModel"):
        TransformersTrainer(returns_a_model, scaling_config=ScalingConfig(num_workers=2),
                            run_config=run_config(tmp_path, "bad_init")).fit()

    not_hf = tmp_path / "not_hf"
    not_hf.mkdir()
    (not_hf / "weights.pt").write_bytes(b"x")
    with pytest.raises(ValueError) as info:
        TransformersTrainer(init_with_own_dataset,
                            trainer_init_config={"output_dir": str(tmp_path / "hf"), "epochs": 1},
                            scaling_config=ScalingConfig(num_workers=2),
                            run_config=run_config(tmp_path, "bad_resume"),
                            resume_from_checkpoint=sgd.Checkpoint.from_directory(not_hf)).fit()
    assert "not a Hugging Face Trainer checkpoint: it has no trainer_state.json (files: weights.pt)" in str(
        info.value)


def test_transformers_trainer_restore_takes_a_new_trainer_init(ray_cluster, tmp_path):
    from sgd_torch.huggingface import TransformersTrainer

    with pytest.raises(TypeError) as info:
        TransformersTrainer(returns_a_model, scaling_config=ScalingConfig(num_workers=2),
                            run_config=run_config(tmp_path, "fixed_init")).fit()
    failed = info.value.result
    with pytest.raises(TypeError, match="trainer_init_per_worker= and trainer_init_config="):
        TransformersTrainer.restore(failed.path, train_loop_per_worker=accelerate_loop)
    with pytest.raises(TypeError, match="trainer_init_config keys"):  # returns_a_model takes no config
        TransformersTrainer.restore(failed.path, trainer_init_config={"epochs": 1}, trusted=True)
    with pytest.raises(sgd.UntrustedCheckpointError, match="trainer_init_per_worker=..."):
        TransformersTrainer.restore(failed.path, trainer_init_config={"epochs": 1})
    restored = TransformersTrainer.restore(
        failed.path, trainer_init_per_worker=init_with_own_dataset,
        trainer_init_config={"output_dir": str(tmp_path / "hf"), "epochs": 1})
    result = fit_quietly(restored)
    assert result.error is None and Path(result.path) == Path(failed.path)
    assert result.metrics["step"] == 6  # the new init's Trainer ran: 48 rows, 2 ranks, batch 4


def test_transformers_trainer_argument_errors():
    from sgd_torch.huggingface import TransformersTrainer

    def init(train_dataset, eval_dataset, lr=1.0):
        raise AssertionError("not called")

    with pytest.raises(TypeError, match="trainer_init_per_worker must be a function"):
        TransformersTrainer("not a function")
    with pytest.raises(TypeError, match=r"cannot be called as init\(train_dataset, eval_dataset, "):
        TransformersTrainer(init, trainer_init_config={"epochs": 2})
    with pytest.raises(TypeError, match="cannot be called"):
        TransformersTrainer(lambda train_dataset: None)
    with pytest.raises(TypeError, match="trainer_init_config must be a dict"):
        TransformersTrainer(init, trainer_init_config=[1])
    with pytest.raises(ValueError, match="datasets named 'train' and 'evaluation', got 'eval'"):
        TransformersTrainer(init, datasets={"train": [1], "eval": [2]})
    with pytest.raises(TypeError, match="datasets must be a dict"):
        TransformersTrainer(init, datasets=[1, 2])
    with pytest.raises(TypeError, match="torch_config must be a sgd_torch.TorchConfig"):
        TransformersTrainer(init, torch_config=sgd.BackendConfig())
    trainer = TransformersTrainer(init, trainer_init_config={"lr": 0.1})
    assert trainer.train_loop_config == {"lr": 0.1}  # the function is not in the (logged) config


# --- the pieces, in this process -------------------------------------------------------------


def test_ray_shard_dataset_and_prepare_trainer(ray_cluster, tmp_path):
    import ray
    from transformers import Trainer

    from sgd_torch.huggingface import RayShardDataset, SgdReportCallback, prepare_trainer

    rows = [{"ids": np.arange(3, dtype=np.int32) + i, "score": float(i), "label": i, "text": f"row {i}"}
            for i in range(10)]
    dataset = RayShardDataset(ray.data.from_items(rows).iterator())
    first = next(iter(dataset))
    assert first["ids"].dtype == torch.int32 and first["ids"].tolist() == [0, 1, 2]
    assert first["score"].dtype == torch.float32 and first["label"].dtype == torch.int64  # torch defaults
    assert first["text"] == "row 0"
    assert len(list(dataset)) == 10  # every pass is a new pass over the shard
    with pytest.raises(TypeError, match="RayShardDataset takes a Ray Dataset shard"):
        RayShardDataset([1, 2, 3])

    # The Trainer batches a shard with its collator and does not shard it again.

    train = RayShardDataset(ray.data.from_items(token_rows(10)).iterator())
    trainer = Trainer(model=tiny_gpt2(), args=hf_args(str(tmp_path), max_steps=1, per_device_train_batch_size=4),
                      train_dataset=train, eval_dataset={"a": train})
    assert prepare_trainer(prepare_trainer(trainer)) is trainer
    assert sum(isinstance(cb, SgdReportCallback) for cb in trainer.callback_handler.callbacks) == 1
    batches = list(trainer.get_train_dataloader())
    assert [b["input_ids"].shape for b in batches] == [(4, SEQ), (4, SEQ), (2, SEQ)]
    assert "idx" not in batches[0]  # dropped by the Trainer's collator: not a model input
    assert sum(len(b["input_ids"]) for b in trainer.get_eval_dataloader("a")) == 10
    with pytest.raises(TypeError, match="prepare_trainer takes a transformers.Trainer"):
        prepare_trainer(object())


def test_import_error_names_the_extra():
    # The package imports without accelerate (Ray's helpers need none); the trainers say what is missing.
    code = ("import sys; sys.modules['accelerate'] = None\n"
            "import sgd_torch.huggingface\n"
            "try:\n from sgd_torch.huggingface import TransformersTrainer\nexcept ImportError as e: print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == 'sgd_torch.huggingface needs accelerate, which is not installed: ' \
                          'pip install "sgd-torch[huggingface]"'


def test_importing_the_package_is_light():
    code = ("import sys, sgd_torch.huggingface\n"
            "print(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- AccelerateTrainer ---------------------------------------------------------------------


def accelerate_loop(config):
    import torch.nn.functional as F
    from accelerate import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(sgd.world_rank())  # different initial weights: DDP must broadcast rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(config["epochs"]):
        total, batches = torch.tensor(0.0), 0
        for xb, yb in loader:
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(xb).float(), yb)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            total += loss.detach().float()
            batches += 1
        params = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
        gathered = accelerator.gather(params.unsqueeze(0))
        sgd.report({
            "epoch": epoch,
            "loss": accelerator.reduce(total / batches, "mean").item(),
            "param_diff": (gathered - gathered[0]).abs().max().item(),
            "batches": batches,
            "num_processes": accelerator.num_processes,
            "process_index": accelerator.process_index,
            "distributed_type": accelerator.distributed_type.value,
            "mixed_precision": accelerator.mixed_precision,
            "grad_accum": accelerator.gradient_accumulation_steps,
            "threads": torch.get_num_threads(),
        })


ACCELERATE_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
enable_cpu_affinity: false
gpu_ids: all
machine_rank: 0
main_process_ip: 10.0.0.1
main_process_port: 1234
main_training_function: main
mixed_precision: bf16
num_machines: 3
num_processes: 12
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
gradient_accumulation_steps: 2
num_cpu_threads_per_process: 1
"""


def test_accelerate_trainer_with_config_file(ray_cluster, tmp_path):
    from sgd_torch.huggingface import AccelerateTrainer

    config_file = tmp_path / "accelerate.yaml"
    config_file.write_text(ACCELERATE_YAML)
    trainer = AccelerateTrainer(accelerate_loop, train_loop_config={"epochs": 4}, accelerate_config=config_file,
                                scaling_config=ScalingConfig(num_workers=2), run_config=run_config(tmp_path, "acc"))
    # Written on a GPU machine, run on CPU workers: the workers' own device decides (CPU, gloo).
    assert trainer.accelerate_env == {"ACCELERATE_MIXED_PRECISION": "bf16",
                                      "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "2", "OMP_NUM_THREADS": "1"}
    result = fit_quietly(trainer)
    rows = [json.loads(line) for line in Path(result.path, "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for ranks in rows:
        assert [r["process_index"] for r in ranks] == [0, 1]
        for r in ranks:
            # The launch keys (12 GPU processes on 3 machines) were sgd's: 2 CPU workers, its gloo group.
            assert r["num_processes"] == 2 and r["distributed_type"] == "MULTI_CPU"
            assert r["mixed_precision"] == "bf16" and r["grad_accum"] == 2 and r["threads"] == 1
            assert r["batches"] == 8  # 256 rows / 16 per batch / 2 processes
            assert r["param_diff"] == 0.0  # DDP kept both copies identical
    losses = [ranks[0]["loss"] for ranks in rows]
    assert losses[-1] < losses[0] * 0.5
    assert rows[-1][0]["loss"] == rows[-1][1]["loss"]  # reduced over both workers


def accelerate_fails(config):
    raise RuntimeError("the first loop fails")


def accelerate_env_loop(config):
    from accelerate import Accelerator

    sgd.report({"mixed_precision": Accelerator().mixed_precision, "tag": config["tag"]})


def test_accelerate_trainer_restore_runs_a_new_loop_under_the_saved_config(ray_cluster, tmp_path):
    from sgd_torch.huggingface import AccelerateTrainer

    with pytest.raises(RuntimeError, match="the first loop fails") as info:
        AccelerateTrainer(accelerate_fails, train_loop_config={"tag": "first"},
                          accelerate_config={"mixed_precision": "bf16"},
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=run_config(tmp_path, "acc")).fit()
    failed = info.value.result
    with pytest.raises(TypeError, match="cannot change accelerate_config"):
        AccelerateTrainer.restore(failed.path, accelerate_config={})
    result = fit_quietly(AccelerateTrainer.restore(failed.path, train_loop_per_worker=accelerate_env_loop,
                                                   train_loop_config={"tag": "second"}))
    assert result.error is None
    assert result.metrics["mixed_precision"] == "bf16" and result.metrics["tag"] == "second"


@pytest.mark.parametrize("config, error", [
    ({"mixed_precision": "fp32"}, "mixed_precision must be one of no, fp16, bf16, got 'fp32'"),
    ({"mixed_precision": "fp8"}, "mixed_precision fp8 needs an FP8 recipe"),
    ({"use_cpu": "yes"}, "use_cpu must be true or false, got 'yes'"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be an int >= 1, got 0"),
    ({"num_cpu_threads_per_process": 1.5}, "num_cpu_threads_per_process must be an int >= 1"),
    ({"mixed_precison": "bf16"}, r"unknown keys \['mixed_precison'\]. Honoured: mixed_precision"),
    ({"distributed_type": "FSDP"}, "distributed_type FSDP is not supported"),
    ({"distributed_type": "MULTI_TPU"}, "unknown distributed_type 'MULTI_TPU'"),
    ({"fsdp_config": {"fsdp_version": 2}}, "fsdp_config is set, but sgd's AccelerateTrainer does not set up FSDP"),
    ({"deepspeed_config": {"zero_stage": 2}}, "does not set up DeepSpeed"),
    ({"compute_environment": "AMAZON_SAGEMAKER"}, "compute_environment 'AMAZON_SAGEMAKER' is not supported"),
    ({"dynamo_config": {"dynamo_backend": "warp"}}, "dynamo_config.dynamo_backend must be one of NO, EAGER"),
    ({"dynamo_config": {"dynamo_mod": "default"}}, r"unknown dynamo_config keys \['dynamo_mod'\]"),
    ({"dynamo_config": {"dynamo_mode": "fast"}}, "dynamo_mode must be one of default, reduce-overhead"),
    ({"dynamo_backend": "eager", "dynamo_config": {"dynamo_mode": "default"}}, "not both"),
])
def test_accelerate_config_errors(config, error):
    from sgd_torch.huggingface import AccelerateTrainer

    with pytest.raises(ValueError, match=error):
        AccelerateTrainer(accelerate_loop, accelerate_config=config)


def test_accelerate_config_forms(tmp_path):
    from sgd_torch.huggingface import AccelerateTrainer

    def env(config, **kwargs):
        return AccelerateTrainer(accelerate_loop, accelerate_config=config, **kwargs).accelerate_env

    assert env(None) == {} and env({}) == {}
    json_file = tmp_path / "config.json"
    json_file.write_text(json.dumps({"distributed_type": "NO", "mixed_precision": "FP16", "debug": True,
                                     "fsdp_config": {}, "deepspeed_config": {},
                                     "dynamo_config": {"dynamo_backend": "inductor", "dynamo_mode": "max-autotune",
                                                       "dynamo_use_fullgraph": True}}))
    assert env(str(json_file)) == {
        "ACCELERATE_MIXED_PRECISION": "fp16", "ACCELERATE_DEBUG_MODE": "true",
        "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR", "ACCELERATE_DYNAMO_MODE": "max-autotune",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": "True"}
    unquoted = tmp_path / "unquoted.yaml"
    unquoted.write_text("mixed_precision: no\ndistributed_type: 'NO'\n")  # YAML: `no` is false
    assert env(unquoted) == {"ACCELERATE_MIXED_PRECISION": "no"}
    assert env({"dynamo_backend": "NO", "enable_cpu_affinity": True}) == {
        "ACCELERATE_DYNAMO_BACKEND": "NO", "ACCELERATE_CPU_AFFINITY": "1"}
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert env(empty) == {}

    with pytest.raises(FileNotFoundError, match="accelerate_config: no file at"):
        env(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("mixed_precision: [bf16\n")
    with pytest.raises(ValueError, match="is not valid YAML"):
        env(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- mixed_precision\n")
    with pytest.raises(ValueError, match="must hold a mapping of keys, got a list"):
        env(listing)
    with pytest.raises(TypeError, match="accelerate_config must be None, a dict or the path"):
        env(3)
    with pytest.raises(ValueError, match="use_cpu: true, but ScalingConfig\\(use_gpu=True\\)"):
        env({"use_cpu": True}, scaling_config=ScalingConfig(num_workers=1, use_gpu=True))
    with pytest.raises(ValueError, match="takes 2 required arguments"):
        AccelerateTrainer(lambda a, b: None)
