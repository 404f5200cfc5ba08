"""``TorchTensorboardProfilerCallback``: ``torch.profiler`` traces from the workers, written
where TensorBoard's PyTorch Profiler plugin reads them (Ray Train 1.x's callback of that name)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from sgd import TrainingCallback
from sgd_loggers._util import check_workers, resolve_dir, select

#: The report key ``sgd_torch.TorchWorkerProfiler`` puts the traces under.
PYTORCH_PROFILER_KEY = "_pytorch_profiler_trace"
#: The folder under the log directory that holds the traces.
TRACE_DIR_NAME = "pytorch_profiler"


class TorchTensorboardProfilerCallback(TrainingCallback):
    """Writes the traces that workers report with ``sgd_torch.TorchWorkerProfiler``
    (``sgd.report(**profiler.get_and_clear_profile_traces())``) to
    ``<logdir>/pytorch_profiler/<file name>``, one file per trace
    (``worker_<rank>.<step>.pt.trace.json``). View them with ``pip install torch-tb-profiler``
    and ``tensorboard --logdir <run_dir>``, tab "PyTorch Profiler".

    :param logdir: where the ``pytorch_profiler`` folder goes; ``None`` means the run
        directory, a relative path is taken relative to the run directory.
    :param workers_to_log: a rank, a list of ranks, or ``None`` (the default) for every worker.

    :ivar trace_dir: the folder of the latest run (``None`` before the first run).
    :ivar written: the paths written so far in the latest run, in order.
    """

    def __init__(self, logdir: Optional[Union[str, os.PathLike]] = None,
                 workers_to_log: Optional[Union[int, List[int]]] = None):
        if logdir is not None and not isinstance(logdir, (str, os.PathLike)):
            raise TypeError(f"TorchTensorboardProfilerCallback(logdir=...) takes a path, got {type(logdir).__name__}")
        self._logdir = logdir
        self._workers = check_workers(workers_to_log)
        self.trace_dir: Optional[Path] = None
        self.written: List[Path] = []

    def start_training(self, logdir: str, config: Dict[str, Any], **info: Any) -> None:
        self.trace_dir = resolve_dir(self._logdir, logdir) / TRACE_DIR_NAME
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self.written = []

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        if self.trace_dir is None:
            raise RuntimeError("TorchTensorboardProfilerCallback.handle_result called before start_training")
        for result in select(results, self._workers, "workers_to_log"):
            for name, contents in result.get(PYTORCH_PROFILER_KEY) or ():
                safe = Path(str(name)).name  # a file name, never a path out of the folder
                if not safe or safe in (".", ".."):
                    raise ValueError(f"{PYTORCH_PROFILER_KEY}: {name!r} is not a file name")
                path = self.trace_dir / safe
                tmp = path.with_name(f".{safe}.tmp")
                data = contents.encode("utf-8") if isinstance(contents, str) else bytes(contents)
                tmp.write_bytes(data)
                os.replace(tmp, path)  # TensorBoard never reads half a trace
                self.written.append(path)
