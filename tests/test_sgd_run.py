"""``sgd run`` on real torchrun-style scripts: DDP over gloo, failures, a killed worker.

The CLI runs in a subprocess, as a user runs it. The first test lets it start its own
Ray (the real thing); the others point it at this session's cluster with
``RAY_ADDRESS`` (ours, started by the ``ray_cluster`` fixture) to save a cluster start each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import sgd
from sgd_testing import wait_for
from sgd_torch import TorchConfig

SGD = [sys.executable, "-m", "sgd"]

HELPERS = '''
def shard(batch, rank, world):
    n = batch.shape[0] // world
    return batch[rank * n:(rank + 1) * n]
'''

# An ordinary torchrun script: reads its rank from the environment, creates its own
# process group, trains a DDP model. Reports to sgd only when it runs under sgd.
DDP_SCRIPT = '''
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers import shard  # next to the script: the script's folder is on sys.path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    assert (rank, world) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    assert os.environ["LOCAL_RANK"] == str(rank)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = torch.randn(args.steps, 8, 4, generator=torch.Generator().manual_seed(1234))
    for step in range(args.steps):
        x = shard(data[step], rank, world)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}")
        if "SGD_RUN_DIR" in os.environ:
            import sgd
            sgd.report(step=step + 1, loss=loss.item())
    if rank == 0:
        torch.save(model.module.state_dict(), args.out)
    print(f"done on rank {rank}", file=sys.stderr)
    # Both ranks leave the group together: a gloo rank that destroys its group while its peer
    # is still busy can abort at exit ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def _env(**extra: str) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def _run_dir(stderr: str) -> Path:
    lines = [line for line in stderr.splitlines() if line.startswith("sgd run:") and "run directory" in line]
    assert lines, f"no run directory in the output:\n{stderr}"
    return Path(lines[-1].rsplit("run directory ", 1)[1].strip())


def _results(run_dir: Path) -> list:
    path = run_dir / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_same_weights_as_torchrun(tmp_path):
    """The same script under ``sgd run -n 2`` and ``torchrun --nproc_per_node 2``."""
    project = tmp_path / "project"
    project.mkdir()
    _write(project, "helpers.py", HELPERS)
    script = _write(project, "train.py", DDP_SCRIPT)
    results = tmp_path / "results"
    sgd_run = subprocess.Popen(
        [*SGD, "run", "-n", "2", "--logdir", "exp", str(script), "--lr", "0.05", "--out", str(tmp_path / "sgd.pt")],
        cwd=tmp_path, env=_env(SGD_RESULTS_DIR=str(results)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
         "--lr", "0.05", "--out", str(tmp_path / "torchrun.pt")],
        cwd=tmp_path, env=_env(OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        out, err = sgd_run.communicate(timeout=240)
        t_out, t_err = torchrun.communicate(timeout=240)
    finally:
        for proc in (sgd_run, torchrun):
            if proc.poll() is None:
                proc.kill()
    assert torchrun.returncode == 0, t_err
    assert sgd_run.returncode == 0, err

    ours, theirs = torch.load(tmp_path / "sgd.pt"), torch.load(tmp_path / "torchrun.pt")
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), (key, ours[key], theirs[key])

    # Each line of a worker's output reaches the driver once, prefixed by its rank.
    for rank in (0, 1):
        steps = [line for line in out.splitlines() if line.startswith(f"[rank {rank}] step ")]
        assert len(steps) == 6, out
    assert "[rank 1] done on rank 1" in err.splitlines() and "[rank 0] done on rank 0" in err.splitlines()
    assert not [line for line in out.splitlines() if line and not line.startswith("[rank ")], out

    run_dir = _run_dir(err)
    assert run_dir == results / "exp" / "run_001"
    rounds = _results(run_dir)
    assert [r[0]["step"] for r in rounds] == [1, 2, 3, 4, 5, 6]
    first_loss = float(next(line for line in out.splitlines() if line.startswith("[rank 0] step 0")).split()[-1])
    assert rounds[0][0]["loss"] == pytest.approx(first_loss, abs=1e-4)

    shown = subprocess.run([*SGD, "runs", "show", str(run_dir), "--json"], capture_output=True, text=True,
                           check=True, env=_env())
    summary = json.loads(shown.stdout)
    assert summary["status"] == "FINISHED" and summary["backend"] == "torch" and summary["iterations"] == 6
    assert summary["backend_config"]["init_process_group"] is False


FAILING_SCRIPT = '''
import torch.distributed as dist


def check_batch(rank):
    if rank == 1:
        raise ValueError("bad batch on rank 1")


def main():
    dist.init_process_group("gloo")
    check_batch(dist.get_rank())
    dist.barrier()  # rank 0 waits here for a peer that never comes


if __name__ == "__main__":
    main()
'''


def test_exception_on_rank_1(ray_cluster, tmp_path):
    import ray

    script = _write(tmp_path, "fails.py", FAILING_SCRIPT)
    proc = subprocess.run(
        [*SGD, "run", "-n", "2", "--max-retries", "2", str(script)], cwd=tmp_path, capture_output=True,
        text=True, timeout=240, env=_env(RAY_ADDRESS=ray.get_runtime_context().gcs_address),
    )
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert "sgd run: failed: worker rank 1 " in err
    assert "ValueError: bad batch on rank 1" in err
    # The script's frames, not sgd's machinery.
    assert f'File "{script}", line 7, in check_batch' in err
    assert "session.py" not in err and "runpy" not in err
    assert "restarting the workers" not in err  # an exception is not retried; only a dead worker is
    assert len(_results(_run_dir(err))) == 0


RESTARTING_SCRIPT = '''
import os
import threading

import torch
import torch.distributed as dist

import sgd

dist.init_process_group("gloo")
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
state = sgd.load_checkpoint() or {"step": 0, "total": 0.0}
step, total = state["step"], state["total"]
print(f"starting at step {step} (restart {restart})")
while step < 6:
    t = torch.tensor([float(step + 1)])
    dist.all_reduce(t)
    total += t.item()
    step += 1
    sgd.report(step=step, total=total, pid=os.getpid(), restart=restart)
    sgd.save_checkpoint(step=step, total=total)
    if step == 3 and restart == 0:
        threading.Event().wait()  # until the test kills a worker
print(f"finished with total {total}")
'''


def _run_killing_rank_1_at_step_3(tmp_path: Path, script: Path, after_kill=lambda: None):
    """``sgd run -n 2`` of ``script`` on this session's cluster; rank 1's process is SIGKILLed
    once step 3 is reported. Returns the process, its output, and every round reported."""
    import ray

    proc = subprocess.Popen(
        [*SGD, "run", "-n", "2", "--max-retries", "1", "--logdir", str(tmp_path / "exp"), str(script)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(RAY_ADDRESS=ray.get_runtime_context().gcs_address),
    )
    run_dir = tmp_path / "exp" / "run_001"
    try:
        rounds = wait_for(lambda: [r for r in _results(run_dir) if r[0]["step"] == 3], timeout=180,
                          message="the script never reported step 3")
        os.kill(rounds[0][1]["pid"], signal.SIGKILL)  # rank 1
        after_kill()
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc, out, err, _results(run_dir)


def test_killed_worker_restarts_the_script(ray_cluster, tmp_path):
    script = _write(tmp_path, "restarts.py", RESTARTING_SCRIPT)
    proc, out, err, rounds = _run_killing_rank_1_at_step_3(tmp_path, script)
    assert proc.returncode == 0, err
    assert [r[0]["step"] for r in rounds] == [1, 2, 3, 4, 5, 6]
    assert [r[0]["restart"] for r in rounds] == [0, 0, 0, 1, 1, 1]
    assert rounds[-1][0]["total"] == sum(2 * s for s in range(1, 7))
    assert rounds[3][1]["pid"] != rounds[0][1]["pid"]  # a new process for rank 1
    lines = out.splitlines()
    assert "[rank 0] starting at step 0 (restart 0)" in lines
    assert "[rank 0] starting at step 3 (restart 1)" in lines  # from the latest checkpoint
    assert "[rank 1] finished with total 42.0" in lines
    assert "sgd run: finished after 1 restart(s)" in err


# A torchrun script in sgd.elastic.run: it creates its process group itself; a lost worker is
# replaced and the survivor goes on in its own process, from its last commit.
IN_PLACE_SCRIPT = '''
import os

import torch
import torch.distributed as dist

import sgd
from sgd import elastic

dist.init_process_group("gloo")
state = elastic.ObjectState(step=0, total=0.0)


@elastic.run
def train(state):
    while state.step < 6:
        t = torch.tensor([float(state.step + 1)])
        dist.all_reduce(t)  # the group the script made, built again at a reset
        state.total += t.item()
        state.step += 1
        state.commit()
        sgd.report(step=state.step, total=state.total, pid=os.getpid(),
                   restart=int(os.environ["TORCHELASTIC_RESTART_COUNT"]))
        if state.step == 3:
            # hold step 3 until the test killed rank 1 (rank 0's next all_reduce then fails)
            while os.path.exists("hold"):
                pass


train(state)
print(f"finished with total {state.total}")
'''


def test_a_killed_worker_is_replaced_in_place_and_the_survivor_keeps_its_process(ray_cluster, tmp_path):
    script = _write(tmp_path, "in_place.py", IN_PLACE_SCRIPT)
    (tmp_path / "hold").write_text("")
    proc, out, err, rounds = _run_killing_rank_1_at_step_3(tmp_path, script,
                                                           after_kill=lambda: (tmp_path / "hold").unlink())
    assert proc.returncode == 0, err
    assert [r[0]["step"] for r in rounds] == [1, 2, 3, 4, 5, 6]
    assert {r[0]["pid"] for r in rounds} == {rounds[0][0]["pid"]}, "rank 0 kept its process"
    assert rounds[-1][1]["pid"] != rounds[0][1]["pid"], "a new process for rank 1"
    assert [r[0]["restart"] for r in rounds] == [0] * 6, "no restart: recovered in place"
    assert rounds[-1][0]["total"] == sum(2 * s for s in range(1, 7))
    assert "finished with total 42.0" in out


# --- TorchConfig(init_process_group=False), what sgd run builds on --------------------------


def _own_group(config):
    import torch.distributed as dist

    was_initialised = dist.is_initialized()
    env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    dist.init_process_group("gloo")  # as a torchrun script does; left for sgd to clean up
    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    return was_initialised, env, t.item()


def test_torch_config_without_process_group(ray_cluster):
    with pytest.raises(ValueError, match="init_process_group"):
        TorchConfig(init_process_group="no")
    assert TorchConfig().init_process_group is True
    trainer = sgd.Trainer(backend=TorchConfig(init_process_group=False), num_workers=2)
    trainer.start()
    try:
        first = trainer.run(_own_group)
        # The group the first run left behind is destroyed before the next run.
        second = trainer.run(_own_group)
    finally:
        trainer.shutdown()
    for results in (first, second):
        assert [r[0] for r in results] == [False, False]
        assert [r[1]["RANK"] for r in results] == ["0", "1"] and results[0][1]["WORLD_SIZE"] == "2"
        assert results[0][1]["MASTER_PORT"] == results[1][1]["MASTER_PORT"]
        assert [r[2] for r in results] == [3.0, 3.0]


GPU_SCRIPT = '''
import os
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
print(f"allreduce on {torch.cuda.get_device_name()}: {t.item()}")
dist.destroy_process_group()
'''


@pytest.mark.gpu
def test_nccl_script_on_a_gpu(tmp_path):
    script = _write(tmp_path, "gpu.py", GPU_SCRIPT)
    n = torch.cuda.device_count()
    proc = subprocess.run([*SGD, "run", "-n", str(n), "--use-gpu", str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env=_env(SGD_RESULTS_DIR=str(tmp_path / "results")))
    assert proc.returncode == 0, proc.stderr
    assert "[rank 0] allreduce on " in proc.stdout and proc.stdout.rstrip().endswith(f": {float(n)}")
