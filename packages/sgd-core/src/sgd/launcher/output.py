"""The output of ``sgd run``: each worker's ``sys.stdout``/``sys.stderr`` on the driver,
line by line, prefixed with ``[rank N]``.

The script's streams are replaced by text streams over :class:`_StreamWriter`, whose bytes
go, in write order, through an :class:`_OutputChannel` to a small Ray actor on the driver's
node (:class:`_OutputSink`). A driver thread (:class:`OutputPump`) takes them from there and
an :class:`OutputPrinter` prints whole lines. Output written below Python (C libraries,
subprocesses) does not pass through ``sys.stdout``: Ray forwards it with its own prefix.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
import uuid
from collections import defaultdict
from typing import IO, Any, Dict, List, Optional, Sequence, Tuple

logger = logging.getLogger("sgd")

#: How often a worker sends its buffered output to the driver, in seconds.
OUTPUT_FLUSH_S = 0.05

_STREAMS = ("stdout", "stderr")


# --- worker side --------------------------------------------------------------


class OutputChannel:
    """One worker's captured output on its way to the driver, in write order.

    A write that completes a line after a quiet spell is sent at once (fire and
    forget); under a flood of output, writes only append to a buffer that a thread
    sends every :data:`OUTPUT_FLUSH_S`. Sends are numbered so that the driver can put
    them back in order. :meth:`close` sends the rest and waits until the sink has
    everything: what a script printed reaches the driver before its result does.
    Sending at once matters when another rank fails: sgd stops the surviving workers
    as soon as the error arrives, and their last lines must already be on their way.
    """

    def __init__(self, sink: Any, world_rank: int):
        self._sink = sink
        self._rank = world_rank
        self._id = uuid.uuid4().hex
        self._lock = threading.RLock()  # re-entrant: Ray may print while we send
        self._chunks: List[Tuple[str, bytearray]] = []
        self._seq = 0
        self._last_send = 0.0
        self._refs: List[Any] = []
        self._closed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sgd-run-output", daemon=True)
        self._thread.start()

    def write(self, stream: str, data: bytes) -> bool:
        with self._lock:
            if self._closed:
                return False
            if self._chunks and self._chunks[-1][0] == stream:
                self._chunks[-1][1].extend(data)
            else:
                self._chunks.append((stream, bytearray(data)))
            if b"\n" in data and time.monotonic() - self._last_send >= OUTPUT_FLUSH_S:
                try:
                    self._send()
                except Exception:  # never fail the script's print; the flusher retries
                    pass
            return True

    def _send(self, final: bool = False) -> None:
        import ray

        with self._lock:
            if not self._chunks and not final:
                return
            chunks = [(s, bytes(b)) for s, b in self._chunks]
            self._chunks = []
            self._last_send = time.monotonic()
            self._refs.append(self._sink.write.remote((self._id, self._rank, self._seq, chunks, final)))
            self._seq += 1
            if len(self._refs) > 64:  # forget the ones already delivered
                done, self._refs = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)

    def _loop(self) -> None:
        while not self._stop.wait(OUTPUT_FLUSH_S):
            try:
                self._send()
            except Exception:  # the driver is gone; nothing useful left to do
                return

    def close(self, timeout: float = 30.0) -> None:
        import ray

        self._stop.set()
        self._thread.join()
        with self._lock:
            self._send(final=True)
            self._closed = True
            refs, self._refs = self._refs, []
        try:
            ray.get(refs, timeout=timeout)
        except Exception:
            pass


class _StreamWriter(io.RawIOBase):
    """The binary end of a replaced ``sys.stdout``/``sys.stderr``: bytes go to the channel
    (or, once the channel is closed, to the original stream: a thread the script left
    behind may still print)."""

    def __init__(self, channel: OutputChannel, stream: str, original: Any):
        super().__init__()
        self._channel = channel
        self._stream = stream
        self._original = original

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        raw = bytes(data)
        if not self._channel.write(self._stream, raw):
            try:
                self._original.write(raw.decode("utf-8", "replace"))
            except Exception:
                pass
        return len(raw)

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        # faulthandler and friends write to the real descriptor (Ray's worker log).
        return int(self._original.fileno())


def text_stream(channel: OutputChannel, stream: str, original: Any) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        _StreamWriter(channel, stream, original),  # type: ignore[arg-type]
        encoding="utf-8",
        errors="backslashreplace",
        write_through=True,
    )


# --- driver side -------------------------------------------------------------------


class _OutputSink:
    """Ray actor on the driver's node: workers put output batches, the driver takes them."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._batches: List[Any] = []

    def write(self, batch: Any) -> None:
        with self._cv:
            self._batches.append(batch)
            self._cv.notify_all()

    def read(self, timeout: float) -> List[Any]:
        with self._cv:
            if not self._batches and timeout > 0:
                self._cv.wait(timeout)
            batches, self._batches = self._batches, []
            return batches


class OutputPrinter:
    """Turns the workers' output batches into whole lines prefixed with ``[rank N]``.

    Batches of one worker process (one channel) are put back in send order; each
    stream of a channel is decoded and split into lines on its own. A line with
    carriage returns (a progress bar) is printed as its last state.
    """

    def __init__(self, num_workers: int, stdout: Optional[IO[str]] = None, stderr: Optional[IO[str]] = None):
        self._width = len(str(max(0, num_workers - 1)))
        self._out = stdout
        self._err = stderr
        self._next_seq: Dict[str, int] = defaultdict(int)
        self._waiting: Dict[str, Dict[int, Any]] = defaultdict(dict)
        self._partial: Dict[Tuple[str, str], str] = {}
        self._decoders: Dict[Tuple[str, str], Any] = {}
        self._ranks: Dict[str, int] = {}

    def _stream(self, name: str) -> IO[str]:
        # Looked up when used, so that a replaced sys.stdout (pytest's capsys) is honoured.
        if name == "stdout":
            return self._out or sys.stdout
        return self._err or sys.stderr

    def feed(self, batches: Sequence[Any]) -> None:
        touched = set()
        for batch in batches:
            channel, rank, seq, _chunks, _final = batch
            self._ranks[channel] = rank
            self._waiting[channel][seq] = batch
            while self._next_seq[channel] in self._waiting[channel]:
                ready = self._waiting[channel].pop(self._next_seq[channel])
                self._next_seq[channel] += 1
                touched |= self._emit(ready)
        for name in touched:
            self._stream(name).flush()

    def _emit(self, batch: Any) -> set:
        import codecs

        channel, rank, _seq, chunks, final = batch
        touched = set()
        for stream, data in chunks:
            key = (channel, stream)
            decoder = self._decoders.get(key)
            if decoder is None:
                decoder = self._decoders[key] = codecs.getincrementaldecoder("utf-8")("replace")
            text = self._partial.pop(key, "") + decoder.decode(data)
            lines = text.split("\n")
            if lines[-1]:
                self._partial[key] = lines[-1]
            complete = lines[:-1]
            if complete:
                self._write(stream, rank, complete)
                touched.add(stream)
        if final:
            for stream in _STREAMS:
                touched |= self._flush_partial(channel, stream, rank)
        return touched

    def _flush_partial(self, channel: str, stream: str, rank: int) -> set:
        rest = self._partial.pop((channel, stream), "")
        decoder = self._decoders.pop((channel, stream), None)
        if decoder is not None:
            rest += decoder.decode(b"", final=True)
        if not rest:
            return set()
        self._write(stream, rank, [rest])
        return {stream}

    def _write(self, stream: str, rank: int, lines: List[str]) -> None:
        prefix = f"[rank {rank:>{self._width}}] "
        shown = []
        for line in lines:
            line = line[:-1] if line.endswith("\r") else line
            if "\r" in line:
                line = line.rsplit("\r", 1)[-1]
            shown.append(prefix + line + "\n")
        self._stream(stream).write("".join(shown))

    def close(self) -> None:
        """Print what is left: batches that never found their predecessors, partial lines."""
        touched = set()
        for waiting in self._waiting.values():
            for seq in sorted(waiting):
                touched |= self._emit(waiting[seq])
        self._waiting.clear()
        for channel, stream in list(self._partial):
            touched |= self._flush_partial(channel, stream, self._ranks.get(channel, 0))
        for name in touched:
            self._stream(name).flush()


class OutputPump:
    """Driver thread: takes batches from the sink and prints them until stopped."""

    def __init__(self, sink: Any, printer: OutputPrinter):
        self._sink = sink
        self._printer = printer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sgd-run-output", daemon=True)
        self._thread.start()

    def _read(self, timeout: float) -> List[Any]:
        import ray

        return list(ray.get(self._sink.read.remote(timeout)))

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._printer.feed(self._read(0.2))
        except Exception:
            logger.warning("sgd run: lost the workers' output stream", exc_info=True)

    def stop(self) -> None:
        """Print everything the sink holds (workers flush theirs before their script ends)."""
        self._stop.set()
        self._thread.join()
        try:
            while True:
                batches = self._read(0)
                if not batches:
                    break
                self._printer.feed(batches)
        except Exception:
            logger.warning("sgd run: could not read the last output", exc_info=True)
        self._printer.close()


def start_sink() -> Any:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    remote = ray.remote(num_cpus=0, max_concurrency=4)(_OutputSink)  # type: ignore[call-overload]
    return remote.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True),
    ).remote()
