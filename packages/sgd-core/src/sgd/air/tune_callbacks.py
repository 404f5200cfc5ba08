"""Ray Tune callbacks passed in ``RunConfig(callbacks=...)``, called by ``fit()`` as a Tune run of
one trial would call them, with a :class:`TrialView` standing for the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from sgd._common.public import public_module
from sgd.air.result import RAY_RESULT_FIELDS
from sgd.callbacks import TrainingCallback


def is_tune_callback(value: Any) -> bool:
    """Whether ``value`` is a Ray Tune ``Callback`` (without importing Ray Tune)."""
    return any(f"{c.__module__}.{c.__name__}" == "ray.tune.callback.Callback" for c in type(value).__mro__)


@public_module("sgd.air")
class TrialView:
    """What the Ray Tune callbacks in ``RunConfig(callbacks=...)`` get as ``trial`` when
    ``fit()`` runs without Tune: the run's id, name, config, directory and last result."""

    def __init__(self, config: Dict[str, Any]):
        self.trial_id = ""
        self.trial_name = ""
        self.config = config
        self.local_path: Optional[str] = None
        self.last_result: Dict[str, Any] = {}
        self.status = "PENDING"

    @property
    def logdir(self) -> Optional[str]:
        return self.local_path

    def __str__(self) -> str:
        return self.trial_name

    def __repr__(self) -> str:
        return f"TrialView({self.trial_name!r}, status={self.status})"


@public_module("sgd.air")
class TuneCallbacks(TrainingCallback):
    """Calls the Ray Tune callbacks of a ``RunConfig`` as a Tune run of one trial would."""

    def __init__(self, callbacks: Optional[Sequence[Any]], config: Dict[str, Any]):
        self.callbacks = [c for c in (callbacks or []) if is_tune_callback(c)]
        self.trial = TrialView(config)
        self.iteration = 0
        self.started = False

    def _call(self, hook: str, **kwargs: Any) -> None:
        for c in self.callbacks:
            getattr(c, hook)(iteration=self.iteration, trials=[self.trial], **kwargs)

    def start_training(self, logdir: str, config: Dict[str, Any], **info: Any) -> None:
        run_dir = Path(info.get("run_dir") or logdir)
        self.trial.trial_id = self.trial.trial_name = run_dir.name
        self.trial.local_path = str(run_dir)
        self.trial.status = "RUNNING"
        self.started = True
        for c in self.callbacks:
            c.setup(num_samples=1, total_num_samples=1)
        self._call("on_trial_start", trial=self.trial)

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        self.iteration += 1
        result = dict(results[0])
        for ray_key, key in RAY_RESULT_FIELDS.items():
            if key in result:
                result.setdefault(ray_key, result[key])
        result.setdefault("trial_id", self.trial.trial_id)
        self.trial.last_result = result
        self._call("on_trial_result", trial=self.trial, result=result)

    def end(self, error: Optional[BaseException]) -> None:
        if not self.callbacks:
            return
        if self.started:
            self.trial.status = "ERROR" if error is not None else "TERMINATED"
            if error is not None:
                self._call("on_trial_error", trial=self.trial)
            else:
                self._call("on_trial_complete", trial=self.trial)
        for c in self.callbacks:
            c.on_experiment_end(trials=[self.trial])
