"""One framework's driver on the three-host cluster that ``bench_cluster.py`` started.

    python _cluster_drivers.py sgd|sgd-inplace|ray start|loss WORKDIR

It joins the cluster at ``RAY_ADDRESS`` from the head's address (``SGD_BENCH_HEAD_IP``), runs one
case and writes ``WORKDIR/driver.json``. The workload is the same under both frameworks: 4 torch
workers over gloo (elastic 2..4 for ``loss``), each step an ``all_reduce`` and a short sleep, a
report per step with the worker's clock and world size, a small checkpoint every 5 steps.

- ``start``: from the trainer's construction to the first report (cold start on the cluster).
- ``loss``: rank 0 writes ``WORKDIR/kill_now`` when it reaches step 10; bench_cluster.py then
  SIGKILLs every process of one worker host and notes the time. Training goes on to step 25;
  the driver writes every report (step, world size, worker clock, each worker's host and pid).

``sgd`` recovers by restarting every worker from the latest checkpoint; ``sgd-inplace`` runs the
same loop under ``sgd.elastic.run`` (the step in an ``ObjectState``, committed every step), so
the survivors keep their processes and the group re-forms around them.

Ray Train needs storage every host can read for its checkpoints: ``WORKDIR`` is on the shared
disk (not the worker hosts' private ``/tmp``). sgd needs none: checkpoints travel to the driver.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

STEPS = 25
KILL_AT = 10
CKPT_EVERY = 5


def _step_work() -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.05)


def _where() -> Dict[str, Any]:
    import ray

    return {"pid": os.getpid(), "ip": ray.util.get_node_ip_address()}


def _sgd_train(config: Dict[str, Any]) -> None:
    import sgd

    state = sgd.load_checkpoint() or {"step": 0}
    step = state["step"]
    while step < config["steps"]:
        step += 1
        _step_work()
        sgd.report(step=step, world_size=sgd.world_size(), t=time.time(), **_where())
        if step % CKPT_EVERY == 0:
            sgd.save_checkpoint(step=step)
        if step == config.get("kill_at") and sgd.world_rank() == 0 and config.get("marker"):
            Path(config["marker"]).write_text(str(time.time()))
            while step == config["kill_at"] and not Path(config["marker"] + ".done").exists():
                time.sleep(0.01)  # the host goes while the job runs on


def _sgd_inplace_train(config: Dict[str, Any]) -> None:
    import sgd
    from sgd import elastic

    state = elastic.ObjectState(step=0)

    @elastic.run
    def train(state: Any) -> None:
        while state.step < config["steps"]:
            _step_work()
            state.step += 1
            state.commit()
            sgd.report(step=state.step, world_size=sgd.world_size(), t=time.time(), **_where())
            if state.step == config.get("kill_at") and sgd.world_rank() == 0 and config.get("marker"):
                Path(config["marker"]).write_text(str(time.time()))
                while not Path(config["marker"] + ".done").exists():
                    time.sleep(0.01)

    train(state)


def _ray_train(config: Dict[str, Any]) -> None:
    import ray.train as train

    ckpt = train.get_checkpoint()
    step = 0
    if ckpt is not None:
        with ckpt.as_directory() as d:
            step = json.loads((Path(d) / "state.json").read_text())["step"]
    ctx = train.get_context()
    while step < config["steps"]:
        step += 1
        _step_work()
        metrics = {"step": step, "world_size": ctx.get_world_size(), "t": time.time()}
        if ctx.get_world_rank() == 0:  # Ray Train keeps only the metrics of checkpoints: log them all
            with open(config["log"], "a") as f:
                f.write(json.dumps(metrics) + "\n")
        if step % CKPT_EVERY == 0:
            with tempfile.TemporaryDirectory() as d:
                if ctx.get_world_rank() == 0:
                    (Path(d) / "state.json").write_text(json.dumps({"step": step}))
                    train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))
                else:
                    train.report(metrics)
        else:
            train.report(metrics)
        if step == config.get("kill_at") and ctx.get_world_rank() == 0 and config.get("marker"):
            Path(config["marker"]).write_text(str(time.time()))
            while not Path(config["marker"] + ".done").exists():
                time.sleep(0.01)


def run_sgd(case: str, work: Path, in_place: bool = False) -> Dict[str, Any]:
    import sgd

    rounds: List[Dict[str, Any]] = []

    class Keep(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            rounds.append({"step": results[0]["step"], "world_size": results[0]["world_size"],
                           "t": results[0]["t"], "arrived": time.time(),
                           "workers": [[r["ip"], r["pid"]] for r in results]})

    begun = time.time()
    if case == "start":
        trainer = sgd.Trainer(backend="torch", num_workers=4, logdir=str(work / "sgd_start"))
        trainer.start()
        trainer.run(_sgd_train, config={"steps": 1}, callbacks=[Keep()])
        trainer.shutdown()
        return {"begun": begun, "rounds": rounds}
    trainer = sgd.Trainer(backend="torch", num_workers=(2, 4), max_retries=3, logdir=str(work / "sgd_loss"))
    trainer.start()
    trainer.run(_sgd_inplace_train if in_place else _sgd_train,
                config={"steps": STEPS, "kill_at": KILL_AT, "marker": str(work / "kill_now")}, callbacks=[Keep()])
    trainer.shutdown()
    return {"begun": begun, "rounds": rounds}


def run_ray(case: str, work: Path) -> Dict[str, Any]:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    begun = time.time()
    if case == "start":
        trainer = TorchTrainer(_ray_train, train_loop_config={"steps": 1, "log": str(work / "reports.jsonl")},
                               scaling_config=ScalingConfig(num_workers=4),
                               run_config=RunConfig(storage_path=str(work / "ray"), name="start"))
    else:
        trainer = TorchTrainer(
            _ray_train, train_loop_config={"steps": STEPS, "kill_at": KILL_AT, "marker": str(work / "kill_now"),
                                           "log": str(work / "reports.jsonl")},
            scaling_config=ScalingConfig(num_workers=(2, 4)),
            run_config=RunConfig(storage_path=str(work / "ray"), name="loss",
                                 failure_config=FailureConfig(max_failures=3)),
        )
    trainer.fit()  # raises if training failed
    lines = (work / "reports.jsonl").read_text().splitlines()
    rounds = [json.loads(line) for line in lines if line.strip()]
    return {"begun": begun, "rounds": rounds}


def main() -> None:
    framework, case, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if os.environ.get("SGD_BENCH_KEEP") == "1":
        import logging

        logging.basicConfig(level=logging.INFO, format="%(created).3f %(name)s %(message)s")
    import ray

    ray.init(address=os.environ["RAY_ADDRESS"], _node_ip_address=os.environ["SGD_BENCH_HEAD_IP"],
             log_to_driver=False)
    if framework == "ray":
        out = run_ray(case, work)
    else:
        out = run_sgd(case, work, in_place=framework == "sgd-inplace")
    (work / "driver.json").write_text(json.dumps(out))
    ray.shutdown()


if __name__ == "__main__":
    main()
