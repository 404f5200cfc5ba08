"""``sgd run`` with core only (the ``base`` backend): script semantics, output, exit codes, bad input.

The torch side (DDP scripts, torchrun equivalence, killed workers) is in ``tests/test_sgd_run.py``.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from sgd import cli
from sgd.launcher import ScriptExitError, failure_message, launcher_env
from sgd.launcher.output import OutputPrinter

SEMANTICS_SCRIPT = '''
import os
import sys
import threading

import sgd
from helper import GREETING  # the script's folder is on sys.path

rank = int(os.environ["RANK"])
assert __name__ == "__main__", __name__
assert sys.argv[1:] == ["--flag", "x", "--", "-n", "3"], sys.argv
assert sys.argv[0] == os.path.abspath(__file__)
assert os.getcwd() == EXPECTED_CWD, os.getcwd()  # the driver's working directory
assert os.environ["WORLD_SIZE"] == "2" and os.environ["LOCAL_RANK"] == str(rank)
assert os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["GROUP_WORLD_SIZE"] == "1"
assert os.path.isdir(os.environ["SGD_RUN_DIR"])
assert threading.current_thread() is not threading.main_thread()  # documented limitation


def main():
    print(f"{GREETING} from {rank}")
    print(f"warning from {rank}", file=sys.stderr)
    sys.stdout.write("progress 1\\rprogress 2\\rprogress 3\\n")
    sys.stdout.buffer.write("bytes ok \\u00e9\\n".encode())
    sgd.report(rank=rank, value=rank * 10)
    sgd.save_checkpoint(step=1)
    print("no newline at the end", end="")
    sys.exit(0)


if __name__ == "__main__":
    main()
'''


def _write(folder, name, text):
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def test_script_runs_as_main_with_its_arguments(ray_cluster, tmp_path, monkeypatch, capsys, results_dir):
    project = tmp_path / "project"
    project.mkdir()
    _write(project, "helper.py", "GREETING = 'hello'\n")
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = _write(project, "train.py", SEMANTICS_SCRIPT.replace("EXPECTED_CWD", repr(str(workdir))))
    monkeypatch.chdir(workdir)

    code = cli.main(["run", "--backend", "base", "-n", "2", "--max-retries", "0", "--logdir", "exp",
                     "--resources-per-worker", '{"CPU": 1}',
                     str(script), "--flag", "x", "--", "-n", "3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    out_lines, err_lines = out.splitlines(), err.splitlines()
    for rank in (0, 1):
        assert out_lines.count(f"[rank {rank}] hello from {rank}") == 1
        assert f"[rank {rank}] progress 3" in out_lines  # a progress bar shows its last state
        assert f"[rank {rank}] bytes ok \u00e9" in out_lines
        assert f"[rank {rank}] no newline at the end" in out_lines
        assert f"[rank {rank}] warning from {rank}" in err_lines
    assert "sgd run: finished; 1 report(s), last (rank 0): rank=0, value=0" in err_lines
    run_dir = results_dir / "exp" / "run_001"
    assert f"sgd run: run directory {run_dir}" in err_lines
    rounds = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [(r["rank"], r["value"]) for r in rounds[0]] == [(0, 0), (1, 10)]
    assert (run_dir / "checkpoints" / "checkpoint_000001").is_dir()


def test_env_set_for_every_rank():
    from sgd._worker.session import WorkerContext

    contexts = [WorkerContext(0, 0, 3, 0, 2), WorkerContext(1, 1, 3, 0, 2), WorkerContext(2, 0, 3, 1, 1)]
    envs = launcher_env(contexts, "abc", 2, 5, "/runs/run_001")
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0"]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1"]
    assert {e["GROUP_WORLD_SIZE"] for e in envs} == {"2"} and {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert envs[2]["LOCAL_WORLD_SIZE"] == "1" and envs[0]["LOCAL_WORLD_SIZE"] == "2"
    assert envs[1]["TORCHELASTIC_RUN_ID"] == "abc" and envs[1]["TORCHELASTIC_RESTART_COUNT"] == "2"
    assert envs[1]["TORCHELASTIC_MAX_RESTARTS"] == "5" and envs[1]["SGD_RUN_DIR"] == "/runs/run_001"


EXIT_SCRIPT = '''
import os
import sys

print(f"before exit, argv {sys.argv}")
if os.environ["RANK"] == "1":
    sys.exit(3)
'''


def test_nonzero_exit_status_is_the_exit_code(ray_cluster, tmp_path, monkeypatch, capsys):
    script = _write(tmp_path, "exits.py", EXIT_SCRIPT)
    monkeypatch.chdir(tmp_path)  # python -m finds modules in the working directory
    code = cli.main(["run", "--backend", "base", "-n", "2", "-m", "exits", "--x"])
    out, err = capsys.readouterr()
    assert code == 3
    assert "sgd run: failed: worker rank 1 exited with status 3" in err
    assert f"[rank 1] before exit, argv {[str(script), '--x']}" in out.splitlines()


def test_failure_message_names_the_rank():
    assert failure_message(ScriptExitError(4, 1)) == "worker rank 1 exited with status 4"
    import pickle

    again = pickle.loads(pickle.dumps(ScriptExitError(4, 1)))
    assert (again.code, again.world_rank) == (4, 1)


@pytest.mark.parametrize(
    ("argv", "head", "rest"),
    [
        (["-n", "2", "t.py", "--lr", "0.1"], ["-n", "2", "t.py"], ["--lr", "0.1"]),
        (["t.py", "-n", "3"], ["t.py"], ["-n", "3"]),  # after the script: the script's
        (["-n2", "--use-gpu", "t.py"], ["-n2", "--use-gpu", "t.py"], []),
        (["--num-workers=2", "--backend", "base", "t.py", "a"], ["--num-workers=2", "--backend", "base", "t.py"],
         ["a"]),
        (["-n", "2", "--", "t.py", "--", "x"], ["-n", "2", "--", "t.py"], ["--", "x"]),
        (["-m", "pkg.train", "--x"], ["-m", "pkg.train"], ["--x"]),
        (["--logdir", "-weird-", "t.py"], ["--logdir", "-weird-", "t.py"], []),
    ],
)
def test_words_after_the_script_belong_to_it(argv, head, rest):
    assert cli.split_run_argv(argv) == (head, rest)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--backend", "base", "-n", "2", "missing.py"], "script 'missing.py' not found"),
        (["run", "--backend", "jax", "SCRIPT"], "unknown backend 'jax'; installed:"),
        (["run", "--backend", "base", "."], "is not a file"),
        (["run", "-m", "no_such_module_here"], "module 'no_such_module_here' not found"),
        (["run", "--backend", "base", "--backend-config", '{"nope": 1}', "SCRIPT"], "bad --backend-config"),
        (["run", "--backend", "base", "--use-gpu", "--resources-per-worker", '{"GPU": 0}', "SCRIPT"],
         "use_gpu=True"),
    ],
)
def test_bad_input_is_refused_before_anything_starts(argv, message, tmp_path, monkeypatch, capsys):
    script = _write(tmp_path, "ok.py", "print('never runs')\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main([str(script) if a == "SCRIPT" else a for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sgd run: error: ") and message in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "-n", "0", "t.py"], "must be a positive integer"),
        (["run", "-n", "two", "t.py"], "must be a positive integer"),
        (["run", "--max-retries", "-5", "t.py"], "integer >= -1"),
        (["run", "--resources-per-worker", "{CPU: 1}", "t.py"], "not valid JSON"),
        (["run", "--resources-per-worker", "[1]", "t.py"], "must be a JSON object"),
        (["run", "-n", "2"], "required: script"),
    ],
)
def test_bad_options_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_printer_orders_batches_and_assembles_lines():
    import io

    out, err = io.StringIO(), io.StringIO()
    printer = OutputPrinter(12, out, err)
    e_acute = "\u00e9".encode()
    printer.feed([
        ("a", 3, 1, [("stdout", b"lo\n" + e_acute[:1])], False),  # arrives before batch 0
        ("b", 10, 0, [("stderr", b"oops\n")], False),
    ])
    assert out.getvalue() == "" and err.getvalue() == "[rank 10] oops\n"
    printer.feed([("a", 3, 0, [("stdout", b"hel")], False)])
    assert out.getvalue() == "[rank  3] hello\n"
    printer.feed([("a", 3, 2, [("stdout", e_acute[1:] + b"\r\n"), ("stderr", b"half")], True)])
    assert out.getvalue() == "[rank  3] hello\n[rank  3] \u00e9\n"
    assert err.getvalue() == "[rank 10] oops\n[rank  3] half\n"  # the final batch ends partial lines
    printer.feed([("b", 10, 2, [("stdout", b"after a gap")], False)])
    printer.close()  # batch 1 of "b" never came (its worker was killed): print what there is
    assert out.getvalue().endswith("[rank 10] after a gap\n")


def test_help_lists_run_and_runs(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "run" in out and "runs" in out
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "belongs to the script" in capsys.readouterr().out
