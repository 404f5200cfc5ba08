"""Reading run directories back (``sgd runs ls`` / ``sgd runs show``, :meth:`sgd.Result.from_path`,
:meth:`sgd.Trainer.restore`): the public name of :mod:`sgd.storage.reading`, the run directory's
one reader. Everything here only reads: a run that is still going is not disturbed.
"""

from sgd.storage.reading import (
    MAX_DEPTH,
    RESULTS_FILE,
    SETTINGS_FILE,
    STACKS_FILE,
    STACKS_REQUEST,
    STATUS_FILE,
    RunInfo,
    checkpoints,
    find_runs,
    is_run_dir,
    last_iteration,
    last_results,
    read_settings,
    resolve_run_dir,
    result_rows,
    run_info,
    run_status,
    run_summary,
)

__all__ = [
    "MAX_DEPTH",
    "RESULTS_FILE",
    "SETTINGS_FILE",
    "STACKS_FILE",
    "STACKS_REQUEST",
    "STATUS_FILE",
    "RunInfo",
    "checkpoints",
    "find_runs",
    "is_run_dir",
    "last_iteration",
    "last_results",
    "read_settings",
    "resolve_run_dir",
    "result_rows",
    "run_info",
    "run_status",
    "run_summary",
]
