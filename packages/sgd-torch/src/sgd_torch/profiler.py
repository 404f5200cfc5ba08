"""``TorchWorkerProfiler``: ``torch.profiler`` traces taken on each worker, sent to the driver
with a report (Ray Train 1.x's ``ray.train.torch.TorchWorkerProfiler``).

On the driver, ``sgd_loggers.TorchTensorboardProfilerCallback`` writes them where TensorBoard's
PyTorch Profiler plugin (``torch-tb-profiler``) reads them. Nothing here imports torch: the
profiler object only receives ``torch.profiler.profile`` objects.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import sgd

#: The report key that carries the traces (Ray Train's name).
PYTORCH_PROFILER_KEY = "_pytorch_profiler_trace"

# Numbers the traces of this process, so names never repeat (the profiler's own step number
# does: the trace taken when the ``with`` block ends has the number of the last step's).
_TRACE_NUMBERS = itertools.count(1)


class TorchWorkerProfiler:
    """Collects the traces of a ``torch.profiler.profile`` on one worker.

    Pass :meth:`trace_handler` as the profiler's ``on_trace_ready``; every time a trace is
    ready it is written to ``trace_dir`` as ``worker_<rank>.<n>.pt.trace.json`` (``n`` counts
    this process's traces from 1; the name pattern TensorBoard's profiler plugin reads).
    :meth:`get_and_clear_profile_traces` returns the traces collected since its last call,
    ready to pass to ``sgd.report``. The ``with`` block's end takes one more trace: report it
    after the block if you want it::

        profiler = TorchWorkerProfiler()
        with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=0, active=1),
                                    on_trace_ready=profiler.trace_handler) as p:
            for epoch in range(epochs):
                train_one_epoch()
                p.step()
                sgd.report(epoch=epoch, **profiler.get_and_clear_profile_traces())
        sgd.report(epoch=epochs, **profiler.get_and_clear_profile_traces())

    :param trace_dir: where this worker keeps trace files until they are sent; ``None`` means
        a new temporary directory. Files are deleted once read.
    """

    def __init__(self, trace_dir: Optional[Union[str, os.PathLike]] = None):
        if trace_dir is not None and not isinstance(trace_dir, (str, os.PathLike)):
            raise TypeError(f"TorchWorkerProfiler(trace_dir=...) takes a path, got {type(trace_dir).__name__}")
        self.trace_dir = Path(trace_dir) if trace_dir is not None else Path(tempfile.mkdtemp(prefix="sgd_profile_"))
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self._pending: List[Path] = []

    def trace_handler(self, profile: Any) -> None:
        """``on_trace_ready`` for ``torch.profiler.profile``: export the trace just taken."""
        try:
            rank = sgd.world_rank()
        except RuntimeError:  # outside a training function: one process, rank 0
            rank = 0
        path = self.trace_dir / f"worker_{rank}.{next(_TRACE_NUMBERS)}.pt.trace.json"
        profile.export_chrome_trace(str(path))
        self._pending.append(path)

    def get_and_clear_profile_traces(self) -> Dict[str, List[Tuple[str, str]]]:
        """The traces taken since the last call, as ``{"_pytorch_profiler_trace": [(file name,
        contents), ...]}`` (an empty list when there is none); their local files are removed."""
        traces = []
        for path in self._pending:
            traces.append((path.name, path.read_text(encoding="utf-8")))
            path.unlink(missing_ok=True)
        self._pending = []
        return {PYTORCH_PROFILER_KEY: traces}
