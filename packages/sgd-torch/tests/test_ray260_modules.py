"""``sgd_torch``, ``sgd_torch.lightning`` and ``sgd_torch.huggingface.transformers`` carry Ray Train
2.60's ``ray.train.torch``, ``ray.train.lightning`` and ``ray.train.huggingface.transformers``
(issue 53): every name of their ``__all__`` (read from the installed Ray wheel), with compatible
signatures; ``prepare_data_loader(auto_transfer=)``, ``RayDeepSpeedStrategy`` without DeepSpeed,
and Hugging Face's ``RayTrainReportCallback`` / ``prepare_trainer`` as Ray's."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import sgd
from sgd_testing.ray_api import compare_in_subprocess

#: Ray's names that are its backend machinery, not a user's API.
NOT_USER_API = {"TorchConfig.train_func_context: no such property in sgd",
                "TorchConfig.framework: no such property in sgd"}
#: Listed differences (docs/migration: "coming from Ray Train 2.x"), each with its reason.
KNOWN = {
    # sgd's contract (API.md section 8) put wrap_ddp / ddp_kwargs second and third first; Ray's
    # parallel_strategy / parallel_strategy_kwargs are keyword arguments in sgd.
    "prepare_model(): 'parallel_strategy' is positional #2 in Ray, not in sgd",
    "prepare_model(): 'parallel_strategy_kwargs' is positional #3 in Ray, not in sgd",
    # sgd's TorchCheckpoint stores its dict with sgd's codec, not a model.pt file.
    "TorchCheckpoint.MODEL_FILENAME: no such attribute in sgd",
}


def test_every_ray_name_with_a_compatible_signature():
    pytest.importorskip("lightning")
    found = compare_in_subprocess(("ray.train.torch", "sgd_torch"), ("ray.train.lightning", "sgd_torch.lightning"),
                                  ("ray.train.huggingface.transformers", "sgd_torch.huggingface.transformers"))
    assert "prepare_data_loader" in found["sgd_torch"]["names"]
    assert "RayDeepSpeedStrategy" in found["sgd_torch.lightning"]["names"]
    assert found["sgd_torch.huggingface.transformers"]["names"] == ["RayTrainReportCallback", "prepare_trainer"]
    for module, result in found.items():
        assert result["missing"] == [], module
        assert [d for d in result["differences"] if d not in NOT_USER_API | KNOWN] == [], module


# --- prepare_data_loader(auto_transfer=) --------------------------------------------------------


def _loader():
    data = torch.utils.data.TensorDataset(torch.arange(12, dtype=torch.float32).reshape(6, 2), torch.arange(6))
    return torch.utils.data.DataLoader(data, batch_size=2, pin_memory=torch.cuda.is_available())


@pytest.mark.parametrize("auto_transfer", [True, False])
def test_device_loader_on_the_cpu_yields_the_batches_as_they_are(auto_transfer):
    from sgd_torch.loaders import DeviceLoader

    batches = list(DeviceLoader(_loader(), None, auto_transfer=auto_transfer))
    assert [b[1].tolist() for b in batches] == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.gpu
@pytest.mark.parametrize("auto_transfer", [True, False])
def test_device_loader_copies_to_the_gpu_with_and_without_a_side_stream(auto_transfer):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from sgd_torch.loaders import DeviceLoader

    device = torch.device("cuda", 0)
    total = torch.zeros((), device=device)
    rows = []
    for features, labels in DeviceLoader(_loader(), device, auto_transfer=auto_transfer):
        assert features.device == device and labels.device == device
        total += (features * 2).sum()  # work on the current stream while the next batch copies
        rows += labels.tolist()
    assert rows == list(range(6)) and total.item() == 2 * sum(range(12))


def test_prepare_data_loader_takes_auto_transfer(ray_cluster):
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainer.start()
    try:
        def train_func():
            from sgd_torch import prepare_data_loader

            loader = prepare_data_loader(_loader(), auto_transfer=False)
            return [b[1].tolist() for b in loader]

        first, second = trainer.run(train_func)
        assert sorted(sum(first + second, [])) == list(range(6)) and first and second  # split, each row once
    finally:
        trainer.shutdown()


# --- sgd_torch.lightning.RayDeepSpeedStrategy -----------------------------------------------------


def test_deepspeed_strategy_names_the_missing_package():
    pytest.importorskip("lightning")
    code = ("import sys; sys.modules['deepspeed'] = None\n"
            "from sgd_torch.lightning import RayDeepSpeedStrategy, prepare_trainer\n"
            "try:\n RayDeepSpeedStrategy()\nexcept ImportError as e: print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == ("SgdDeepSpeedStrategy (Ray Train's RayDeepSpeedStrategy) needs "
                                                   "DeepSpeed, which is not installed: pip install deepspeed")


# --- sgd_torch.huggingface.transformers ----------------------------------------------------------

# Hides accelerate as if it were not installed: every finder answers "no such module" for it
# (importlib.util.find_spec too, which transformers asks).
HIDE_ACCELERATE = """
import sys
class Hide:
    def __init__(self, inner): self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'accelerate': return None
        find = getattr(self.inner, 'find_spec', None)
        return find(name, path, target) if find else None
    def __getattr__(self, attr): return getattr(self.inner, attr)
sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
"""


def test_transformers_module_imports_without_accelerate():
    pytest.importorskip("transformers")
    code = HIDE_ACCELERATE + (
        "from sgd_torch.huggingface.transformers import RayTrainReportCallback, prepare_trainer\n"
        "import transformers\n"
        "assert isinstance(RayTrainReportCallback(), transformers.TrainerCallback)\n"
        "assert 'accelerate' not in sys.modules\n"
        "try:\n from sgd_torch.huggingface import TransformersTrainer\nexcept ImportError as e: print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == ('sgd_torch.huggingface needs accelerate, which is not installed: '
                                                   'pip install "sgd-torch[huggingface]"')


VOCAB, SEQ = 32, 16


def _hf_loop(config):
    """Ray's documented pattern: a Trainer over a Ray Data shard's batches, the report callback,
    prepare_trainer."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from sgd_torch.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2))
    batches = sgd.get_dataset_shard("train").iter_torch_batches(batch_size=4)
    args = TrainingArguments(output_dir=config["output_dir"], max_steps=4, save_strategy="steps", save_steps=2,
                             logging_steps=1, learning_rate=5e-3, report_to="none", use_cpu=True, disable_tqdm=True,
                             dataloader_num_workers=0)
    assert args.world_size == 2
    trainer = Trainer(model=model, args=args, train_dataset=batches)
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    assert type(trainer).__name__ == "RayTrainer" and isinstance(trainer, Trainer)
    trainer.train()


def test_transformers_report_callback_and_prepare_trainer(ray_cluster, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import ray

    from sgd_torch import TorchTrainer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = [{"input_ids": np.array([(i * 7 + j) % VOCAB for j in range(SEQ)], dtype=np.int64)} for i in range(32)]
    rows = [{**r, "labels": r["input_ids"].copy()} for r in rows]
    result = TorchTrainer(_hf_loop, train_loop_config={"output_dir": str(tmp_path / "hf")},
                          datasets={"train": ray.data.from_items(rows)},
                          scaling_config=sgd.ScalingConfig(num_workers=2),
                          run_config=sgd.RunConfig(storage_path=str(tmp_path / "runs"), verbose=0)).fit()
    # One report per save (steps 2 and 4), with the logs so far and HF's folder under "checkpoint".
    frame = result.metrics_dataframe
    assert list(frame["step"]) == [2, 4] and len(result.best_checkpoints) == 2
    assert "loss" in result.metrics and "learning_rate" in result.metrics
    folder = os.path.join(result.checkpoint.path, "checkpoint")
    files = set(os.listdir(folder))
    assert {"model.safetensors", "config.json", "trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"} <= files
    from transformers import GPT2LMHeadModel

    assert GPT2LMHeadModel.from_pretrained(folder).config.vocab_size == VOCAB
