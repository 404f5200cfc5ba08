"""``WandbLoggerCallback``: one Weights & Biases run per training run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from sgd import TrainingCallback
from sgd_loggers._util import check_worker, clean, histogram_values, require, scalar, select, step_of, to_jsonable


class WandbLoggerCallback(TrainingCallback):
    """Logs a training run to Weights & Biases (needs ``sgd-loggers[wandb]``).

    ``wandb.init`` is called at the start of each training run with the run's ``config``
    (secrets removed), and each report of the logged worker is one ``run.log`` call at
    step ``_training_iteration``: numbers as they are (NaN and infinities included),
    numeric lists as ``wandb.Histogram``, nested keys joined with ``/``; other values are
    skipped. The W&B run ends with exit code 0, or 1 when training raised.

    Works offline: ``mode="offline"`` or ``WANDB_MODE=offline`` writes the run under
    ``<run_dir>/wandb/`` and touches no network (``wandb sync`` uploads it later).

    :param project: the W&B project (``None``: W&B's default, ``$WANDB_PROJECT``).
    :param group: the W&B group, for example to gather the runs of one sweep.
    :param api_key: the W&B API key; handed to W&B's settings, never logged.
    :param mode: ``"online"``, ``"offline"`` or ``"disabled"``; ``None``: W&B's default
        (``$WANDB_MODE``, else online).
    :param wandb_init_kwargs: passed to ``wandb.init`` (``name``, ``tags``, ``entity``,
        ``settings``...). ``dir`` defaults to the run directory, ``name`` to
        ``<logdir name>/<run_NNN>``, ``reinit`` to ``"create_new"``. A ``config`` given here
        is merged over the run's config. ``worker_to_log`` (an sgd option, not W&B's) picks
        the rank whose results are logged, 0 by default.
    """

    def __init__(
        self,
        project: Optional[str] = None,
        group: Optional[str] = None,
        api_key: Optional[str] = None,
        mode: Optional[str] = None,
        **wandb_init_kwargs: Any,
    ):
        require("wandb", type(self).__name__, "wandb")
        self._worker = check_worker(wandb_init_kwargs.pop("worker_to_log", 0))
        self._project = project
        self._group = group
        self._api_key = api_key
        self._mode = mode
        self._init_kwargs = wandb_init_kwargs
        self._run: Any = None
        self._rounds = 0

    def __repr__(self) -> str:  # never show the API key
        return f"WandbLoggerCallback(project={self._project!r}, group={self._group!r}, mode={self._mode!r})"

    @property
    def run(self) -> Any:
        """The current ``wandb`` run (``None`` outside a training run)."""
        return self._run

    def start_training(self, logdir: str, config: Dict[str, Any], **info: Any) -> None:
        import wandb

        self.finish_training(error=True)  # a run left open by a run that never finished
        run_dir = Path(logdir)
        kwargs = dict(self._init_kwargs)
        kwargs.setdefault("dir", str(run_dir))
        kwargs.setdefault("name", f"{run_dir.parent.name}/{run_dir.name}")
        kwargs.setdefault("reinit", "create_new")
        os.makedirs(kwargs["dir"], exist_ok=True)
        merged = {**config, **(kwargs.pop("config", None) or {})}
        settings = kwargs.pop("settings", None)
        if self._api_key:
            if settings is None:
                settings = wandb.Settings(api_key=self._api_key)
            elif isinstance(settings, dict):
                settings = {**settings, "api_key": self._api_key}
            else:
                settings.api_key = self._api_key
        self._run = wandb.init(
            project=self._project,
            group=self._group,
            mode=self._mode,  # type: ignore[arg-type]  # wandb checks the value itself
            config=to_jsonable(merged),
            settings=settings,
            **kwargs,
        )
        self._rounds = 0

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        import wandb

        if self._run is None:
            raise RuntimeError("WandbLoggerCallback.handle_result called before start_training")
        self._rounds += 1
        (result,) = select(results, [self._worker], "worker_to_log")
        data: Dict[str, Any] = {}
        for key, value in clean(result).items():
            number = scalar(value)
            if number is not None:
                data[key] = number
                continue
            values = histogram_values(value)
            if values is not None:
                data[key] = wandb.Histogram(values)
        self._run.log(data, step=step_of(result, self._rounds))

    def finish_training(self, error: bool = False, **info: Any) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            run.finish(exit_code=1 if error else 0)

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_run"] = None
        return state
