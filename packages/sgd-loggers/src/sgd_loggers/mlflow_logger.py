"""``MLflowLoggerCallback``: config as params, each round as metrics, one MLflow run per training run."""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from sgd import TrainingCallback
from sgd_loggers._util import check_worker, clean, require, resolve_dir, scalar, select, step_of

logger = logging.getLogger("sgd.loggers")

#: Limits of the MLflow REST API (``mlflow.utils.validation``), kept here to avoid importing it early.
_MAX_PARAMS_PER_BATCH = 100
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAM_VALUE = 6000
_MAX_KEY = 250
_KEY_BAD_CHARS = re.compile(r"[^\w.\- /]")

LOCAL_DB = "mlflow.db"
LOCAL_ARTIFACTS = "mlartifacts"


def mlflow_key(key: str) -> str:
    """``key`` made acceptable as an MLflow param/metric name.

    MLflow allows letters, digits, ``_ - . /`` and spaces, and rejects names that a path
    normalisation would change (``a//b``, ``./a``); anything else becomes ``_``.
    """
    parts = [p for p in _KEY_BAD_CHARS.sub("_", key).split("/") if p]
    parts = ["_" if p in (".", "..") else p for p in parts]
    return ("/".join(parts) or "_")[:_MAX_KEY]


def _cache_dir() -> Path:
    if os.environ.get("SGD_LOGGERS_CACHE_DIR"):
        return Path(os.environ["SGD_LOGGERS_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "sgd-loggers"


def _template_db() -> Path:
    """An empty MLflow database with the current schema, built once per MLflow version.

    Creating an MLflow SQLite store runs every schema migration (seconds of CPU); a copy
    of an already migrated empty store opens at once.
    """
    import mlflow
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    cache = _cache_dir()
    path = cache / f"mlflow-{mlflow.__version__}-empty.db"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{path.name}.{os.getpid()}.tmp"
    try:
        store = SqlAlchemyStore(f"sqlite:///{tmp}", str(cache / "unused-artifacts"))
        store.engine.dispose()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def local_tracking_uri(directory: Path) -> str:
    """A SQLite MLflow store in ``directory`` (``mlflow.db``, artifacts in ``mlartifacts/``).

    Returns its tracking URI. Made from a cached, already migrated empty store when
    possible, else created by MLflow itself.
    """
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    db = directory / LOCAL_DB
    uri = f"sqlite:///{db}"
    if db.exists():
        return uri
    try:
        shutil.copyfile(_template_db(), db)
        # The template's "Default" experiment points at the cache; point it here instead.
        with sqlite3.connect(db) as conn:
            conn.execute(
                "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                (str(directory / LOCAL_ARTIFACTS / "0"),),
            )
        conn.close()
    except Exception as exc:  # the slow path is always correct
        logger.debug("no cached MLflow store (%s); MLflow creates %s", exc, db)
        db.unlink(missing_ok=True)
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        SqlAlchemyStore(uri, str(directory / LOCAL_ARTIFACTS)).engine.dispose()
    return uri


class MLflowLoggerCallback(TrainingCallback):
    """Logs a training run to MLflow (needs ``sgd-loggers[mlflow]``).

    One MLflow run per training run: ``config`` (flattened with ``/``) as params, each
    report of ``worker_to_log`` as metrics at step ``_training_iteration`` and time
    ``_timestamp``; the run ends ``FINISHED``, or ``FAILED`` when training raised.
    Numbers only (bools as 0/1); NaN is logged as NaN, infinities as MLflow stores them
    (SQL stores clamp them to the largest float); other values are skipped. Keys that look
    like secrets never reach MLflow (params, metrics or tags).

    :param tracking_uri: where to log: an ``http(s)://`` MLflow server, a database URI...
        ``None`` uses ``$MLFLOW_TRACKING_URI`` if set, else a local SQLite store in the run
        directory (``<run_dir>/mlflow.db``, artifacts in ``<run_dir>/mlartifacts``; browse it
        with ``mlflow ui --backend-store-uri sqlite:///<run_dir>/mlflow.db``).
    :param experiment_name: the experiment (created if missing); ``None`` uses
        ``$MLFLOW_EXPERIMENT_NAME`` if set, else MLflow's ``"Default"``.
    :param tags: tags set on the MLflow run.
    :param save_artifact: at the end, upload the run directory's ``checkpoints/`` folder as
        the run's ``checkpoints`` artifact.
    :param worker_to_log: the rank whose results are logged.
    :param logdir: where the local SQLite store goes when no tracking URI is set (Ray Train
        1.x's ``logdir``): ``None`` means the run directory, a relative path is taken relative
        to the run directory. Ignored when a tracking URI is given.
    """

    def __init__(
        self,
        tracking_uri: Optional[str] = None,
        experiment_name: Optional[str] = None,
        tags: Optional[Dict[str, Any]] = None,
        save_artifact: bool = False,
        worker_to_log: int = 0,
        logdir: Optional[Union[str, os.PathLike]] = None,
    ):
        require("mlflow", type(self).__name__, "mlflow")
        if logdir is not None and not isinstance(logdir, (str, os.PathLike)):
            raise TypeError(f"MLflowLoggerCallback(logdir=...) takes a path, got {type(logdir).__name__}")
        self._logdir = logdir
        self._tracking_uri = tracking_uri
        self._experiment_name = experiment_name
        self._tags = dict(tags or {})
        self._save_artifact = save_artifact
        self._worker = check_worker(worker_to_log)
        self._client: Any = None
        self._run_dir: Optional[Path] = None
        self._rounds = 0
        #: The MLflow run id of the latest training run.
        self.run_id: Optional[str] = None
        #: The tracking URI the latest training run was logged to.
        self.tracking_uri: Optional[str] = None

    def start_training(self, logdir: str, config: Dict[str, Any], **info: Any) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.finish_training(error=True)  # a run left open by a run that never finished
        self._run_dir = Path(logdir)
        local = not (self._tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))
        store_dir = resolve_dir(self._logdir, logdir)
        uri = local_tracking_uri(store_dir) if local else (self._tracking_uri or os.environ["MLFLOW_TRACKING_URI"])
        client = MlflowClient(tracking_uri=uri)
        name = self._experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
        experiment_id = self._experiment_id(client, name, local)
        tags = {mlflow_key(k): str(v)[:8000] for k, v in clean(self._tags).items()}
        tags.setdefault("sgd.run_dir", str(self._run_dir))
        run = client.create_run(experiment_id, run_name=self._run_name(), tags=tags)
        self._client, self.run_id, self.tracking_uri, self._rounds = client, run.info.run_id, uri, 0
        params = {mlflow_key(k): _param_value(v) for k, v in clean(config).items()}
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), _MAX_PARAMS_PER_BATCH):
            client.log_batch(self.run_id, params=items[i : i + _MAX_PARAMS_PER_BATCH])

    def _experiment_id(self, client: Any, name: str, local: bool) -> str:
        from mlflow.exceptions import MlflowException

        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        # In the local store, keep artifacts beside the database (MLflow would use ./mlruns).
        location = None
        if local and self._run_dir is not None:
            store_dir = resolve_dir(self._logdir, str(self._run_dir)).resolve()
            location = str(store_dir / LOCAL_ARTIFACTS / re.sub(r"[^\w.-]", "_", name))
        try:
            return client.create_experiment(name, artifact_location=location)
        except MlflowException:  # created by someone else meanwhile
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _run_name(self) -> str:
        assert self._run_dir is not None
        return f"{self._run_dir.parent.name}/{self._run_dir.name}"

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        from mlflow.entities import Metric

        if self._client is None:
            raise RuntimeError("MLflowLoggerCallback.handle_result called before start_training")
        self._rounds += 1
        (result,) = select(results, [self._worker], "worker_to_log")
        step = step_of(result, self._rounds)
        stamp = scalar(result.get("_timestamp"))
        millis = int(stamp * 1000) if stamp is not None and math.isfinite(stamp) else int(time.time() * 1000)
        metrics = {}
        for key, value in clean(result).items():
            number = scalar(value)
            if number is not None:
                metrics[mlflow_key(key)] = number
        items = [Metric(k, v, millis, step) for k, v in metrics.items()]
        for i in range(0, len(items), _MAX_METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=items[i : i + _MAX_METRICS_PER_BATCH])

    def finish_training(self, error: bool = False, **info: Any) -> None:
        if self._client is None:
            return
        client, self._client = self._client, None
        status = "FAILED" if error else "FINISHED"
        try:
            if self._save_artifact:
                self._upload_checkpoints(client)
        except Exception:
            status = "FAILED"
            raise
        finally:
            client.set_terminated(self.run_id, status)

    def _upload_checkpoints(self, client: Any) -> None:
        assert self._run_dir is not None
        checkpoints = self._run_dir / "checkpoints"
        if not checkpoints.is_dir() or not any(checkpoints.iterdir()):
            logger.warning("save_artifact=True but %s holds no checkpoint; nothing uploaded", checkpoints)
            return
        client.log_artifacts(self.run_id, str(checkpoints), artifact_path="checkpoints")

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state


def _param_value(value: Any) -> str:
    return ("" if value is None else str(value))[:_MAX_PARAM_VALUE]
