"""Run an example that Ray Train 2.60 ships in its wheel on sgd, with its imports renamed.

Mirrors Ray Train 2.60's shipped examples (``ray/train/examples``): the example is read from the
installed Ray, its imports renamed by issue 53's map (``ray.train`` → ``sgd``, ``ray.train.torch`` →
``sgd_torch``, ``ray.train.tensorflow`` → ``sgd_tensorflow``...) and run; the few edits an example
needs beyond that (no download, a smaller run) are listed, each with its reason, in
``sgd_testing.ray_examples.EDITS`` and printed by ``--show``::

    python examples/ray260/run_ray_example.py --list
    python examples/ray260/run_ray_example.py pytorch/torch_linear_example.py --smoke-test
    python examples/ray260/run_ray_example.py tf/tensorflow_quick_start.py
    python examples/ray260/run_ray_example.py --show pytorch/torch_quick_start.py   # the renamed text

Arguments after the example's name go to the example. tests/test_ray260_examples.py runs each.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from sgd_testing import ray_examples


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("example", nargs="?", help="a path under ray/train/examples")
    parser.add_argument("--list", action="store_true", help="the examples that run, with their edits")
    parser.add_argument("--show", action="store_true", help="print the renamed, edited text instead of running it")
    args, rest = parser.parse_known_args(argv)
    if args.list or not args.example:
        for name, edits in ray_examples.EDITS.items():
            print(name)
            for edit in edits:
                print(f"    edit: {edit.why}")
        return 0
    if args.show:
        print(ray_examples.renamed_source(args.example))
        return 0
    import ray

    if not ray.is_initialized():
        ray.init()
    ray_examples.load(args.example, run_main=True, argv=rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
