"""Every way to build, test, lint and benchmark sgd: ``nox -s <session>``.

Sessions install the packages in editable mode into their own virtualenv. The
CPU torch wheel is pinned through ``constraints.txt`` so that no dependency
drags in a CUDA build.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"
CONSTRAINTS = ("-c", "constraints.txt")
PACKAGES = ["packages/sgd-core", "packages/sgd-torch", "packages/sgd-testing", "packages/sgd-loggers"]
TEST_DEPS = ["pytest>=8", "pytest-timeout", "setuptools", "wheel", "numpy", "pyarrow", "fsspec", "ray[data]",
             "moto[server]"]  # moto: a real S3 server process for the s3:// storage tests
# The test session also installs the packages with heavy optional parts, with those parts.
TEST_PACKAGES = [
    "packages/sgd-loggers[mlflow,wandb,tensorboard,plot]",
    "packages/sgd-tune",
    "packages/sgd-tensorflow[legacy-keras]",
    "packages/sgd-horovod",
    "packages/sgd-torch[huggingface,lightning]",
]


def _install(session: nox.Session, *extra: str) -> None:
    # torch first, alone, so the pinned CPU wheel is what every later step sees.
    session.install(*CONSTRAINTS, "torch==2.13.0")
    session.install(*CONSTRAINTS, *[arg for p in PACKAGES for arg in ("-e", p)], *extra)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole test suite: each package's tests and the end-to-end tests in tests/."""
    _install(session, *TEST_DEPS, *[arg for p in TEST_PACKAGES for arg in ("-e", p)])
    # Horovod has no usable wheel on PyPI: build one against this session's torch, once per
    # (horovod, torch, python) version, cached in ~/.cache/sgd/wheels (docs/horovod.md).
    session.run("python", "scripts/build_horovod.py", "--install", *CONSTRAINTS)
    args = session.posargs or ["packages", "tests"]
    session.run("pytest", *args, env={"PYTHONUNBUFFERED": "1"})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff on everything, mypy on the sgd core."""
    _install(session, "ruff", "mypy")
    session.run("ruff", "check", ".")
    session.run("mypy", "packages/sgd-core/src/sgd")


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """Train a small network on scikit-learn's digits with 2 workers on a local Ray."""
    _install(session, "scikit-learn")
    session.run("python", "examples/digits.py", *session.posargs, env={"PYTHONUNBUFFERED": "1"})


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: core overhead, checkpoints and recovery, Ray Data, sgd side by side with Ray
    Train and torchrun (compare.md/.png), and a Tune grid with and without actor reuse (tune.md);
    JSON and markdown tables in benchmarks/results/.
    ``nox -s bench -- --quick`` runs fewer repetitions."""
    _install(session)
    env = {"PYTHONUNBUFFERED": "1"}
    session.run("python", "benchmarks/bench_core.py", *session.posargs, env=env)
    session.run("python", "benchmarks/bench_checkpoint.py", *session.posargs, env=env)
    # ray[data] for bench_data; ray[train] (Ray Train's TorchTrainer, the same ray as sgd's) and
    # matplotlib (compare.png) for bench_compare
    session.install(*CONSTRAINTS, "ray[data,train]", "matplotlib")
    session.run("python", "benchmarks/bench_data.py", *session.posargs, env=env)
    session.run("python", "benchmarks/bench_compare.py", *session.posargs, env=env)
    # an 8-trial Tune grid: sgd with and without actor reuse, and Ray Train (ray[tune] comes with ray[train])
    session.run("python", "benchmarks/bench_tune.py", *session.posargs, env=env)


@nox.session(python=PYTHON, venv_backend="none")
def clean(session: nox.Session) -> None:
    """Remove build leftovers (not the nox virtualenvs)."""
    for root, dirs, _files in os.walk("."):
        for d in list(dirs):
            if d in ("__pycache__", ".pytest_cache") or d.endswith(".egg-info"):
                session.run("rm", "-rf", os.path.join(root, d), external=True)
                dirs.remove(d)
