"""What in-place recovery costs while nothing fails: ``state.commit()`` per step of DDP.

    python benchmarks/bench_elastic.py [--quick] [--mb 100]

Two torch workers (gloo) train a ~100 MB model (one ``Linear``, float32) with SGD and momentum
(the optimizer state is as large as the model), under ``sgd_torch.elastic.TorchState``. Each
step is timed with and without a ``commit()`` after it, alternating, on the same workers; the
cost of a commit is the difference of the medians, as a share of a step without it. Target
(issue 36): <= 5%. Results: ``benchmarks/results/elastic.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict

sys.path.insert(0, str(Path(__file__).parent))

from _results import RESULTS, loadavg, machine, save


def _train(config: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    import sgd
    from sgd_torch import elastic, prepare_model

    side = config["side"]
    model = prepare_model(torch.nn.Linear(side, side, bias=False))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
    state = elastic.TorchState(model=model, optimizer=opt, step=0)
    x = torch.randn(config["batch"], side)
    times: Dict[str, list] = {"step": [], "step_and_commit": [], "commit": []}

    @elastic.run
    def train(state: Any) -> None:
        for i in range(config["steps"]):
            begun = time.perf_counter()
            loss = state.model(x).square().mean()
            state.optimizer.zero_grad()
            loss.backward()
            state.optimizer.step()
            stepped = time.perf_counter()
            if i % 2:
                state.commit()
                done = time.perf_counter()
                if i > 2:  # the first commits allocate their buffers
                    times["step_and_commit"].append(done - begun)
                    times["commit"].append(done - stepped)
            elif i > 2:
                times["step"].append(stepped - begun)
            state.step += 1
        sgd.report(rank=sgd.world_rank())

    train(state)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mb", type=float, default=100.0, help="the model's size in MB (float32)")
    args, _ = parser.parse_known_args()
    import math

    import ray

    import sgd

    side = int(math.sqrt(args.mb * 1e6 / 4))
    steps = 12 if args.quick else 30
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainer.start()
    cases = []
    try:
        # A batch of 8: a step is mostly the gradients' all_reduce (the commit's worst case);
        # 128: about 2 GFLOP per worker more, closer to a model that computes per parameter.
        for batch in (8, 128):
            out = trainer.run(_train, config={"side": side, "steps": steps, "batch": batch})
            step = statistics.median(t for w in out for t in w["step"])
            commit = statistics.median(t for w in out for t in w["commit"])
            cases.append({"batch": batch, "step_s": step, "commit_s": commit, "commit_share_of_step": commit / step,
                          "step_and_commit_s": statistics.median(t for w in out for t in w["step_and_commit"])})
    finally:
        trainer.shutdown()
        ray.shutdown()
    model_mb = side * side * 4 / 1e6
    data = {"machine": machine(loadavg=loadavg()), "model_mb": model_mb, "optimizer": "SGD(momentum=0.9)",
            "workers": 2, "steps": steps, "cases": cases}
    lines = [
        "# In-place recovery: what a commit costs", "",
        f"2 torch workers (gloo, CPU, one thread each), a {model_mb:.0f} MB model (one Linear, float32), SGD "
        f"with momentum (state as large again: a commit copies {2 * model_mb:.0f} MB); medians over {steps} "
        f"steps; load average at the end {data['machine']['loadavg']}.",
        "",
        "| batch per worker | DDP step (s) | `state.commit()` (s) | commit / step | target |",
        "|---|---|---|---|---|",
    ]
    for c in cases:
        lines.append(f"| {c['batch']} | {c['step_s']:.3f} | {c['commit_s']:.4f} | {c['commit_share_of_step']:.1%} "
                     "| <= 5% |")
    markdown = "\n".join(lines) + "\n"
    save("elastic", data, markdown, RESULTS)
    print(markdown)


if __name__ == "__main__":
    main()
