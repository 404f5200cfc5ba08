"""Every way to build, test, lint and benchmark sgd: ``nox -s <session>``.

Sessions install the packages in editable mode into their own virtualenv. The
CPU torch wheel is pinned through ``constraints.txt`` so that no dependency
drags in a CUDA build.
"""

from __future__ import annotations

import os
from typing import List

import nox
import nox.command

nox.options.sessions = ["unit", "lint", "tests", "docs"]
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"
CONSTRAINTS = ("-c", "constraints.txt")
PACKAGES = ["packages/sgd-core", "packages/sgd-torch", "packages/sgd-testing", "packages/sgd-loggers"]
TEST_DEPS = ["pytest>=8", "pytest-timeout", "pytest-xdist",  # pytest-xdist: the suite on several workers
             "setuptools", "wheel", "numpy", "pyarrow", "fsspec", "ray[data]",
             "moto[server]",  # moto: a real S3 server process for the s3:// storage tests
             "torch-tb-profiler",  # TensorBoard's PyTorch Profiler plugin parses the traces sgd writes
             "import-linter",  # tests/test_layers.py runs the import contracts
             "hypothesis",  # property-based tests: failure positions and report/checkpoint orders
             "coverage>=7.4",  # nox -s coverage; a test checks that a parked kept process saves its measurement
             "nbclient", "ipykernel", "nbformat",  # tests/test_notebook.py runs the quickstart notebook in a kernel
             "scikit-learn",  # sgd-xgboost's tests train on scikit-learn's bundled datasets
             "playwright"]  # drives Debian's headless Chromium in the dashboard's browser tests (not its own)
# The test session also installs the packages with heavy optional parts, with those parts.
TEST_PACKAGES = [
    "packages/sgd-loggers[mlflow,wandb,tensorboard,plot]",
    "packages/sgd-tune",
    "packages/sgd-tensorflow[legacy-keras]",
    "packages/sgd-horovod",
    "packages/sgd-torch[huggingface,lightning]",
    "packages/sgd-xgboost",  # xgboost and lightgbm (neither pulls torch; xgboost pulls NVIDIA's NCCL library)
    "packages/sgd-dashboard[test]",  # starlette, uvicorn; httpx for Starlette's test client
]

# mypy checks each package's import package, so a user's mypy (which reads the py.typed
# markers) sees the same hints type-checked.
MYPY_TARGETS = [
    "packages/sgd-core/src/sgd",
    "packages/sgd-torch/src/sgd_torch",
    "packages/sgd-tensorflow/src/sgd_tensorflow",
    "packages/sgd-horovod/src/sgd_horovod",
    "packages/sgd-loggers/src/sgd_loggers",
    "packages/sgd-tune/src/sgd_tune",
    "packages/sgd-testing/src/sgd_testing",
    "packages/sgd-xgboost/src/sgd_xgboost",
    "packages/sgd-dashboard/src/sgd_dashboard",
]
# mkdocs-material prints a banner about MkDocs 2 on every build; the build log stays readable without it.
DOCS_ENV = {"NO_MKDOCS_2_WARNING": "1"}
# ruff formats the signatures mkdocstrings renders.
DOCS_DEPS = ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=0.29", "ruff"]


def _install(session: nox.Session, *extra: str) -> None:
    # torch first, alone, so the pinned CPU wheel is what every later step sees.
    session.install(*CONSTRAINTS, "torch==2.13.0")
    session.install(*CONSTRAINTS, *[arg for p in PACKAGES for arg in ("-e", p)], *extra)
    # The editable packages' bytecode, compiled once (pip does it for what it installs): every
    # Ray worker process a test or benchmark starts imports sgd, and where PYTHONDONTWRITEBYTECODE
    # is set none of them keeps what it compiled (importing sgd's worker side took a worker 0.12-0.14 s
    # of CPU from source, 0.04-0.07 s from bytecode: docs/scaling.md).
    session.run("python", "-m", "compileall", "-q", "packages", silent=True)


#: ``SGD_TEST_WORKERS=N`` (N > 0) runs the suite in two parts: every test not marked ``serial`` on
#: N pytest-xdist workers, each with its own local Ray cluster (one test file stays on one worker,
#: so its module-scoped fixtures are made once), then the ``serial`` tests in one process, alone on
#: the machine: the three-host tests (fixed addresses, host heartbeats) and those whose timing a
#: loaded machine breaks (docs/contributing.md). ``0`` runs everything in one process. The default,
#: 2 on this 2-core machine: 29 minutes of pytest against 34 in one process (2026-11-27).
_WORKERS = os.environ.get("SGD_TEST_WORKERS", "2")
WHOLE_SUITE = ["packages", "tests"]


def _suite_parts(workers: str) -> List[List[str]]:
    """The pytest runs of the whole suite on ``workers`` xdist workers (``SGD_TEST_WORKERS``)."""
    if workers in ("", "0"):
        return [WHOLE_SUITE]
    return [["-n", workers, "--dist", "loadgroup", "--no-loadscope-reorder", "-m", "not serial", *WHOLE_SUITE],
            ["-m", "serial", *WHOLE_SUITE]]


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole test suite: each package's tests and the end-to-end tests in tests/ (which run
    every Python block of README.md and docs/), then the docs site build (``docs``)."""
    # Queued, not called: the site build runs after the tests (even when they fail), in its own
    # light virtualenv, so that `nox -s tests` (the README's test command and CI's) also fails on
    # a broken doc page. A narrowed run (`nox -s tests -- PATH`) leaves it out.
    if not session.posargs:
        session.notify("docs")
    _install_tests(session)
    env = {"PYTHONUNBUFFERED": "1"}
    if session.posargs:
        session.run("pytest", *session.posargs, env=env)
        return
    # Every part runs, also after one failed, so that one run reports every failure.
    failed = []
    for args in _suite_parts(_WORKERS):
        try:
            session.run("pytest", *args, env=env)
        except nox.command.CommandFailed:
            failed.append(args)
    if failed:
        session.error("tests failed in: " + "; ".join(" ".join(a[:-2]) or "pytest" for a in failed))


def _install_tests(session: nox.Session, *extra: str) -> None:
    _install(session, *TEST_DEPS, *extra, *[arg for p in TEST_PACKAGES for arg in ("-e", p)])
    # Horovod has no usable wheel on PyPI: build one against this session's torch, once per
    # (horovod, torch, python) version, cached in ~/.cache/sgd/wheels (docs/horovod.md).
    session.run("python", "scripts/build_horovod.py", "--install", *CONSTRAINTS)


@nox.session(python=PYTHON)
def coverage(session: nox.Session) -> None:
    """Line and branch coverage of every package over the suite (``nox -s tests``' tests, in its
    parts, or the paths given), Ray's worker processes, xdist's workers and spawned drivers
    included: a table per package in
    ``build/coverage/coverage-by-package.md`` (docs/contributing.md)."""
    _install_tests(session)
    out = os.path.abspath("build/coverage")
    session.run("rm", "-rf", out, external=True)
    os.makedirs(out)
    # Every Python process of this virtualenv measures itself when COVERAGE_PROCESS_START is set.
    site = session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                       silent=True).strip()
    with open(os.path.join(site, "sgd_coverage.pth"), "w") as f:
        f.write("import coverage; coverage.process_startup()\n")
    env = {"PYTHONUNBUFFERED": "1", "COVERAGE_PROCESS_START": os.path.abspath("pyproject.toml"),
           "COVERAGE_FILE": os.path.join(out, ".coverage")}
    try:
        # The same parts as ``nox -s tests`` (a failing test still leaves its measurement).
        for args in [session.posargs] if session.posargs else _suite_parts(_WORKERS):
            session.run("pytest", *args, env=env, success_codes=[0, 1])
    finally:
        os.remove(os.path.join(site, "sgd_coverage.pth"))
    session.run("coverage", "combine", "--rcfile=pyproject.toml", "--keep", "-q", env=env)
    session.run("python", "scripts/coverage_report.py", os.path.join(out, ".coverage"))


@nox.session(python=PYTHON)
def suite_cost(session: nox.Session) -> None:
    """Where the suite's time goes: each test's wall time and the CPU time of every process it
    started (in a cgroup of its own, so the figures hold on a busy machine), summed per package
    and file, in ``build/suite-cost/suite-cost.md`` (docs/contributing.md). Arguments after
    ``--`` are pytest's (default: the whole suite, as ``nox -s tests`` runs it)."""
    _install_tests(session)
    session.run("python", "scripts/suite_cost.py", "--", *(session.posargs or WHOLE_SUITE))


#: The fast tier: tests that need no Ray cluster and start no process (a conftest refuses both).
UNIT_TESTS = ["packages/sgd-core/tests/unit"]


@nox.session(python=PYTHON)
def unit(session: nox.Session) -> None:
    """The fast tier, in seconds: the run controller stepped through every state and policy
    decision over sgd_testing's FakeGroup, the policies, the wire protocol; no Ray cluster, no
    subprocess, no torch. ``nox -s tests`` runs these too."""
    # pyarrow/fsspec/pandas/requests: the storage tests take a pyarrow.fs filesystem as input, and
    # the Ray 2.60 tests compare with ray.train's names (ray.train refuses to import without them and pydantic).
    session.install(*CONSTRAINTS, "-e", "packages/sgd-core", "-e", "packages/sgd-testing", "pytest>=8",
                    "pytest-timeout", "hypothesis", "pyarrow", "fsspec", "pandas", "requests", "pydantic")
    session.run("pytest", *(session.posargs or UNIT_TESTS), env={"PYTHONUNBUFFERED": "1"})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff on everything, the import contracts (sgd-core's layers, no cycles, plugins use
    only public modules: ``[tool.importlinter]`` in pyproject.toml), mypy on every package,
    and a check that a user's mypy sees the installed packages as typed."""
    # sgd-dashboard with its (light) dependencies: mypy reads starlette's hints.
    _install(session, "ruff", "mypy", "typing_extensions", "import-linter", "-e", "packages/sgd-dashboard")
    # The packages with heavy frameworks, without them: mypy needs only their own sources.
    no_deps = ["packages/sgd-tune", "packages/sgd-tensorflow", "packages/sgd-horovod", "packages/sgd-xgboost"]
    session.install("--no-deps", *[arg for p in no_deps for arg in ("-e", p)])
    session.run("ruff", "check", ".")
    session.run("lint-imports", "--no-cache")
    session.run("mypy", *MYPY_TARGETS)
    # A user's mypy reads sgd's hints only through the py.typed markers: check a use of the
    # installed packages from outside the repository, with no mypy settings at all.
    use = os.path.abspath("tests/typing/use_installed.py")
    with session.chdir(session.create_tmp()):
        session.run("mypy", "--no-incremental", "--config-file=", use)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The documentation site (MkDocs): the guide in docs/ and an API reference generated from
    the docstrings, built with warnings as errors into ``build/site``. ``nox -s docs -- serve``
    serves it on localhost instead."""
    # mkdocstrings reads the packages' sources statically (griffe, paths in mkdocs.yml): building
    # the reference imports none of them, so this session needs neither torch nor Ray.
    session.install(*CONSTRAINTS, *DOCS_DEPS)
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", *session.posargs[1:], env=DOCS_ENV)
    else:
        session.run("mkdocs", "build", "--strict", "--site-dir", "build/site", *session.posargs, env=DOCS_ENV)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """Train a small network on scikit-learn's digits with 2 workers on a local Ray."""
    _install(session, "scikit-learn")
    session.run("python", "examples/digits.py", *session.posargs, env={"PYTHONUNBUFFERED": "1"})


#: Every benchmark: name -> (script, extra packages it needs besides the sgd packages).
BENCHMARKS = {
    "core": ("benchmarks/bench_core.py", ()),
    "checkpoint": ("benchmarks/bench_checkpoint.py", ()),
    # N = 2 to 32 workers on a simulated multi-node cluster, sgd beside Ray Train and a floor
    "scale": ("benchmarks/bench_scale.py", ("ray[train]", "matplotlib")),
    "data": ("benchmarks/bench_data.py", ("ray[data,train]", "matplotlib")),
    # ray[train]: Ray Train's TorchTrainer (the same ray as sgd's); matplotlib: compare.png
    "compare": ("benchmarks/bench_compare.py", ("ray[data,train]", "matplotlib")),
    # an 8-trial Tune grid: sgd with and without actor reuse, and Ray Train
    "tune": ("benchmarks/bench_tune.py", ("ray[data,train]", "matplotlib")),
    # a real three-host cluster (ray start hosts with private disks; needs root): cold start and
    # a lost host, sgd beside Ray Train
    "cluster": ("benchmarks/bench_cluster.py", ("ray[train]",)),
    # in-place recovery (sgd.elastic): what state.commit() costs per DDP step of a 100 MB model
    "elastic": ("benchmarks/bench_elastic.py", ()),
    # 1M rows × 50 features, 100 rounds: sgd-xgboost beside Ray Train's XGBoostTrainer and one process
    "xgboost": ("benchmarks/bench_xgboost.py", ("ray[train]", "packages/sgd-xgboost")),
    # sgd-dashboard: list 1,000 runs, open a 1,000,000-round run, live latency, memory while following
    "dashboard": ("benchmarks/bench_dashboard.py", ("packages/sgd-dashboard", "httpx")),
}


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: core overhead, checkpoints and recovery, scale (2 to 32 workers, scale.md/.png),
    Ray Data, sgd side by side with Ray Train and torchrun (compare.md/.png), a Tune grid with
    and without actor reuse (tune.md), a real three-host cluster losing a host (cluster.md), and
    distributed XGBoost beside Ray Train's and one process (xgboost.md, ``--rows N`` for a smaller run),
    and the dashboard's listing, opening, live latency and memory (dashboard.md);
    JSON and markdown tables in benchmarks/results/.
    ``nox -s bench -- --quick`` runs fewer repetitions; ``nox -s bench -- cluster [--quick]``
    runs the named benchmarks only (any of: core, checkpoint, scale, data, compare, tune, cluster,
    elastic, xgboost, dashboard)."""
    _install(session)
    env = {"PYTHONUNBUFFERED": "1"}
    chosen = [a for a in session.posargs if a in BENCHMARKS]
    args = [a for a in session.posargs if a not in BENCHMARKS]
    installed: set = set()
    for name in chosen or list(BENCHMARKS):
        script, extra = BENCHMARKS[name]
        missing = [p for p in extra if p not in installed]
        if missing:  # the repository's own packages editable, like the core's
            args_ = [a for p in missing for a in (("-e", p) if p.startswith("packages/") else (p,))]
            session.install(*CONSTRAINTS, *args_)
            installed.update(missing)
        session.run("python", script, *args, env=env)


@nox.session(python=PYTHON, venv_backend="none")
def clean(session: nox.Session) -> None:
    """Remove build leftovers (not the nox virtualenvs)."""
    for root, dirs, _files in os.walk("."):
        for d in list(dirs):
            if d in ("__pycache__", ".pytest_cache") or d.endswith(".egg-info"):
                session.run("rm", "-rf", os.path.join(root, d), external=True)
                dirs.remove(d)
