"""PrintCallback and the live progress line (on a real pseudo-terminal)."""

from __future__ import annotations

import io
import json
import os
import pty
import re

import pytest

from sgd_loggers import PrintCallback, ProgressCallback
from sgd_loggers.console import _active


@pytest.fixture
def terminal():
    """A real pseudo-terminal: yields (stream the callback writes to, function reading what arrived)."""
    master, slave = pty.openpty()
    os.set_blocking(master, False)
    stream = os.fdopen(slave, "w", encoding="utf-8")
    received = bytearray()

    def read() -> str:
        while True:
            try:
                chunk = os.read(master, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            received.extend(chunk)
        return received.decode()

    yield stream, read
    stream.close()
    os.close(master)


def frames_of(out: str):
    """The successive drawings of the line: split on the carriage returns that start them."""
    return re.split(r"\r(?!\n)", out)[1:]


def test_print_callback_prints_each_round_as_json(capsys, rounds, secret):
    cb = PrintCallback()
    cb.start_training(logdir="/tmp/x/run_001", config={})
    cb.handle_result(rounds[0])
    cb.handle_result([{"loss": float("nan"), "token": secret, "_training_iteration": 2}])
    cb.finish_training()
    out = capsys.readouterr().out
    first, second = out.split("\n]\n")[:2]
    assert json.loads(first + "]") == rounds[0]
    assert json.loads(second + "]") == [{"loss": "NaN", "_training_iteration": 2}]
    assert out.startswith('[\n    {\n        "loss": 1.0,')  # indented like Ray Train's PrintCallback
    assert secret not in out


def test_progress_line_on_a_terminal(terminal, rounds):
    stream, read = terminal
    cb = ProgressCallback(stream=stream, refresh_s=0)
    cb.start_training(logdir="/results/train_a/run_003", config={})
    for round_ in rounds[:3]:
        cb.handle_result(round_)
    cb.finish_training()
    frames = frames_of(read())
    assert len(frames) == 4  # three rounds, then the final line
    assert re.fullmatch(r"sgd run_003 \| iter 1 \| 0:00:0\d \| loss=1 acc/top1=0\.1\x1b\[K", frames[0])
    assert re.fullmatch(r"sgd run_003 \| iter 3 \| 0:00:0\d \| loss=0\.3333 acc/top1=0\.3\x1b\[K", frames[2])
    assert frames[3].endswith("loss=0.3333 acc/top1=0.3 | done\x1b[K\r\n")  # the tty turns \n into \r\n
    assert "\n" not in "".join(frames[:3])  # one live line: no newline until the end


def test_progress_failed_run_chosen_metrics_and_width(terminal, rounds):
    stream, read = terminal
    import fcntl
    import struct
    import termios

    fcntl.ioctl(stream.fileno(), termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))  # 40 columns
    cb = ProgressCallback(stream=stream, metrics=["acc/top1", "missing"], worker_to_log=1, refresh_s=0)
    cb.start_training(logdir="/r/t/run_001", config={})
    cb.handle_result(rounds[1])
    cb.finish_training(error=True)
    frames = frames_of(read())
    full = "sgd run_001 | iter 2 | 0:00:00 | acc/top1=0.21"
    assert frames[0] == full[:38] + "…\x1b[K"  # cut to 39 of the 40 columns
    cb2 = ProgressCallback(stream=stream, metrics=["acc/top1"], worker_to_log=1, refresh_s=0)
    fcntl.ioctl(stream.fileno(), termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
    cb2.start_training(logdir="/r/t/run_001", config={})
    cb2.handle_result(rounds[1])
    cb2.finish_training(error=True)
    assert frames_of(read())[-1] == "sgd run_001 | iter 2 | 0:00:00 | acc/top1=0.21 | failed\x1b[K\r\n"


def test_progress_shows_no_secret_and_survives_odd_values(terminal, secret):
    stream, read = terminal
    cb = ProgressCallback(stream=stream, refresh_s=0)
    cb.start_training(logdir="/r/t/run_001", config={"api_key": secret})
    cb.handle_result([{"_training_iteration": 1, "loss": float("nan"), "inf": float("inf"), "name": "abc",
                       "auth_token": 12345.0, "val": {"client_secret": 777.0, "acc": 0.5}}])
    cb.finish_training()
    (frame, final) = frames_of(read())
    assert frame == "sgd run_001 | iter 1 | 0:00:00 | loss=nan inf=inf val/acc=0.5\x1b[K"
    assert "12345" not in final and "777" not in final


def test_progress_is_off_when_not_a_terminal(rounds):
    stream = io.StringIO()
    cb = ProgressCallback(stream=stream)
    cb.start_training(logdir="/r/t/run_001", config={})
    cb.handle_result(rounds[0])
    cb.finish_training()
    assert stream.getvalue() == ""
    forced = ProgressCallback(stream=stream, enabled=True, refresh_s=0)
    forced.start_training(logdir="/r/t/run_001", config={})
    forced.handle_result(rounds[0])
    forced.finish_training()
    assert stream.getvalue().startswith("\rsgd run_001 | iter 1 |")


def test_progress_redraws_at_most_every_refresh_s_but_ends_on_the_last_round(terminal, make_rounds):
    stream, read = terminal
    cb = ProgressCallback(stream=stream, refresh_s=3600)
    cb.start_training(logdir="/r/t/run_001", config={})
    for round_ in make_rounds(workers=1, reports=50):
        cb.handle_result(round_)
    cb.finish_training()
    assert [f.split(" | ")[1] for f in frames_of(read())] == ["iter 1", "iter 50"]


def test_automatic_progress_keeps_quiet_beside_other_console_callbacks(terminal, rounds):
    stream, read = terminal
    user = ProgressCallback(stream=stream, refresh_s=0)
    auto = ProgressCallback.automatic()
    auto._stream = stream
    auto._refresh_s = 0
    for cb in (user, auto):  # user callbacks start first, the plugin's defaults after them
        cb.start_training(logdir="/r/t/run_001", config={})
    for cb in (user, auto):
        cb.handle_result(rounds[0])
    for cb in (user, auto):
        cb.finish_training()
    assert len(frames_of(read())) == 2  # the user's line and its final redraw only
    assert not _active

    alone = ProgressCallback.automatic()
    alone._stream = stream
    alone.start_training(logdir="/r/t/run_001", config={})
    alone.handle_result(rounds[0])
    alone.finish_training()
    assert "iter 1" in read()


def test_progress_names_the_slowest_rank_of_the_last_rounds(terminal):
    stream, read = terminal
    cb = ProgressCallback(stream=stream, refresh_s=0)
    cb.start_training(logdir="/results/train_a/run_001", config={})

    def round_(times):
        return [{"loss": 0.5, "_training_iteration": 1, "_time_this_iter_s": t} for t in times]

    cb.handle_result(round_([0.40, 0.41, 0.40]))  # even: nothing said
    assert "slowest" not in frames_of(read())[-1]
    for _ in range(3):
        cb.handle_result(round_([0.40, 0.40, 0.90]))
    assert "| loss=0.5 | slowest rank 2: 0.78 s/iter (med" in frames_of(read())[-1]  # cut at 80 columns
    for _ in range(40):  # rank 2 caught up: the window forgets it
        cb.handle_result(round_([0.40, 0.40, 0.40]))
    assert "slowest" not in frames_of(read())[-1]
    cb.finish_training()


def test_progress_names_the_slower_of_two_ranks(terminal):
    # Two ranks: the median is the faster one's time (the lower middle), so the slower one shows.
    stream, read = terminal
    cb = ProgressCallback(stream=stream, refresh_s=0)
    cb.start_training(logdir="/results/train_a/run_001", config={})
    for _ in range(3):
        cb.handle_result([{"loss": 0.5, "_training_iteration": 1, "_time_this_iter_s": t} for t in (0.40, 0.60)])
    assert "slowest rank 1: 0.60 s/iter" in frames_of(read())[-1]
    cb.finish_training()
