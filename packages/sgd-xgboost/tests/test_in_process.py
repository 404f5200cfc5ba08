"""The parts of sgd-xgboost that run inside a worker, run here in one process (no Ray): the data
helpers on every input shape and every bad one, XGBoost's communicator around a training
function (a real one-worker tracker), and LightGBM's network parameters. A worker's code is
measured by coverage only when its process exits cleanly; these tests measure it directly."""

from __future__ import annotations

import socket
import warnings

import numpy as np
import pandas as pd
import pytest
import xgboost

from sgd_xgboost import config, data
from sgd_xgboost.data import (
    columns_of,
    label_error,
    numpy_dtypes,
    to_dmatrix,
    to_lgb_dataset,
    to_quantile_dmatrix,
)

FRAME = pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "b": [0.0, 1.0, 0.0, 1.0, 1.0, 0.0],
                      "y": [0, 1, 0, 1, 1, 0]})


@pytest.fixture(autouse=True)
def _outside_a_worker():
    """sgd's rank getters warn outside a worker (the error messages ask for the rank)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="sgd rank getters called outside an sgd worker")
        yield


class Shard:
    """What ``sgd.get_dataset_shard`` returns, as far as the helpers read it: ``iter_batches``
    (pandas batches of ``rows`` rows) and ``schema()`` (``None`` names: not known yet; raising:
    a shard whose schema needs a pass)."""

    def __init__(self, frame, rows=2, names="columns"):
        self.frame, self.rows, self.names = frame, rows, names
        self.passes = 0

    def iter_batches(self, batch_format, batch_size):
        assert batch_format == "pandas"
        self.passes += 1
        for start in range(0, len(self.frame), self.rows):
            yield self.frame.iloc[start:start + self.rows].reset_index(drop=True)

    def schema(self):
        if self.names == "raises":
            raise RuntimeError("needs a pass")

        class Schema:
            names = None if self.names is None else list(self.frame.columns)

        return Schema()


def _rows(matrix):
    return matrix.num_row(), matrix.num_col(), list(matrix.get_label())


@pytest.mark.parametrize("shape", ["frame", "numpy", "dict", "pair", "shard"])
def test_every_input_shape_gives_the_same_matrix(shape):
    labels = [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    source, label = {
        "frame": (FRAME, "y"),
        "numpy": (FRAME.to_numpy(), 2),  # the label column is an index
        "dict": ({c: FRAME[c].tolist() for c in FRAME}, "y"),
        "pair": ((FRAME[["a", "b"]], FRAME["y"]), None),
        "shard": (Shard(FRAME), "y"),  # three batches, concatenated once
    }[shape]
    assert _rows(to_dmatrix(source, label)) == (6, 2, labels)
    assert _rows(to_quantile_dmatrix(source, label)) == (6, 2, labels)
    assert to_lgb_dataset(source, label).construct().num_data() == 6


def test_a_shard_is_streamed_into_the_quantile_matrix_in_passes():
    shard = Shard(FRAME, rows=4)
    matrix = to_quantile_dmatrix(shard, "y", max_bin=16)
    assert _rows(matrix) == (6, 2, [0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    assert shard.passes >= 2  # XGBoost reads it once to sketch the quantiles, once to fill the matrix
    valid = to_quantile_dmatrix(Shard(FRAME), "y", ref=matrix, max_bin=16)
    assert valid.num_row() == 6


def test_feature_columns_select_and_order_the_features():
    matrix = to_dmatrix(FRAME, "y", feature_columns=["b", "a"])
    assert matrix.feature_names == ["b", "a"]
    with pytest.raises(ValueError, match=r"feature columns \['c'\] are not in dataset 'train'; its columns are: "
                                         r"\['a', 'b', 'y'\]"):
        to_dmatrix(FRAME, "y", feature_columns=["a", "c"], where="dataset 'train'")


def test_an_empty_shard_still_takes_part_with_the_datasets_columns():
    empty = Shard(FRAME.iloc[:0])  # more workers than blocks
    assert _rows(to_dmatrix(empty, "y")) == (0, 2, [])
    assert _rows(to_quantile_dmatrix(Shard(FRAME.iloc[:0]), "y")) == (0, 2, [])


@pytest.mark.parametrize("names", [None, "raises"])
def test_an_empty_shard_whose_columns_cannot_be_known_is_a_clear_error(names):
    with pytest.raises(ValueError, match="dataset 'train' has no rows on worker rank 0 and its columns cannot be "
                                         r"known; give every worker data \(fewer workers, or repartition"):
        to_dmatrix(Shard(FRAME.iloc[:0], names=names), "y", where="dataset 'train'")


def test_bad_shapes_say_what_to_pass():
    with pytest.raises(ValueError, match=r"must be 2-D \(rows, columns\), got shape \(6,\)"):
        to_dmatrix(FRAME["a"].to_numpy(), None)
    with pytest.raises(ValueError, match=r"is an \(X, y\) pair: its labels are y, so pass label_column=None"):
        to_dmatrix((FRAME[["a"]], FRAME["y"]), "y")
    with pytest.raises(TypeError, match=r"cannot read training data of type list: pass a Ray Dataset or shard"):
        to_lgb_dataset([[1, 2]], None)
    with pytest.raises(ValueError, match=r"label column 'z' is not in the dataset; its columns are: 'a', 'b', 'y'"):
        to_dmatrix(Shard(FRAME), "z")


def test_a_label_error_lists_at_most_50_columns():
    message = str(label_error("y", [f"c{i}" for i in range(60)]))
    assert "'c49' ..." in message and "'c50'" not in message
    assert str(label_error("y", [])).endswith("its columns are: (none)")


def test_columns_are_known_without_reading_where_they_can_be():
    assert columns_of(FRAME) == ["a", "b", "y"]
    assert columns_of({"p": [1], "q": [2]}) == ["p", "q"]
    assert columns_of(np.zeros((3, 4))) == [0, 1, 2, 3]
    assert columns_of(np.zeros(3)) is None
    assert columns_of(Shard(FRAME)) == ["a", "b", "y"]
    assert columns_of(Shard(FRAME, names=None)) is None
    assert columns_of(Shard(FRAME, names="raises")) is None
    assert columns_of(object()) is None


def test_arrow_backed_numbers_become_numpy_ones_with_nan_for_nulls():
    import pyarrow as pa

    frame = pd.DataFrame({
        "i": pd.array([1, None, 3], dtype=pd.ArrowDtype(pa.int64())),
        "j": pd.array([1, 2, 3], dtype=pd.ArrowDtype(pa.int32())),
        "f": pd.array([0.5, 1.5, None], dtype=pd.ArrowDtype(pa.float32())),
        "s": pd.array(["x", "y", "z"], dtype=pd.ArrowDtype(pa.string())),
    })
    out = numpy_dtypes(frame)
    assert out["i"].dtype == np.float64 and np.isnan(out["i"][1])  # an int column with nulls
    assert out["j"].dtype == np.int32
    assert out["f"].dtype == np.float32 and np.isnan(out["f"][2])
    assert isinstance(out["s"].dtype, pd.ArrowDtype)  # not a number: as it was
    assert numpy_dtypes(FRAME) is FRAME
    assert numpy_dtypes(pd.DataFrame({"s": pd.array(["x"], dtype=pd.ArrowDtype(pa.string()))})) is not None
    pair = (FRAME[["a"]], FRAME["y"])
    assert numpy_dtypes(pair) is pair


def test_the_batch_iterator_class_is_made_once():
    data._BATCH_ITER = None
    first = data._BatchIter(lambda: iter([]), "y", None, "the dataset", FRAME)
    second = data._BatchIter(lambda: iter([]), "y", None, "the dataset", FRAME)
    assert type(first) is type(second) and isinstance(first, xgboost.DataIter)


# --- XGBoost's communicator ---------------------------------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_training_function_joins_the_tracker_and_a_failure_is_signalled():
    from xgboost import collective

    tracker = config._start_tracker(1, config.XGBoostConfig(tracker_host="127.0.0.1"))
    config._set_comm_args({**tracker.worker_args(), "dmlc_task_id": "00000000"})
    seen = []
    with pytest.raises(ValueError, match="boom"):
        with config._xgboost_communicator():
            seen.append((collective.get_rank(), collective.get_world_size()))
            raise ValueError("boom")  # the tracker is told; the error goes on as it was
    assert seen == [(0, 1)]
    assert config._comm_args is None  # taken by the run: the next one needs its own
    config._close_tracker(tracker, 0)

    tracker = config._start_tracker(1, config.XGBoostConfig(tracker_host="127.0.0.1"))
    config._set_comm_args({**tracker.worker_args(), "dmlc_task_id": "00000000"})
    x = FRAME[["a", "b"]].to_numpy()
    with config._xgboost_communicator():
        booster = xgboost.train({"max_depth": 2}, xgboost.DMatrix(x, label=FRAME["y"]), num_boost_round=2)
    assert booster.num_boosted_rounds() == 2
    config._close_tracker(tracker, 10)  # every worker left: returns at once


def test_a_run_of_another_backend_is_not_touched():
    config._set_comm_args(None)
    with config._xgboost_communicator():
        pass


def test_a_tracker_that_cannot_be_reached_is_named_with_what_to_do():
    port = _free_port()  # nobody listens there
    config._set_comm_args({"dmlc_tracker_uri": "127.0.0.1", "dmlc_tracker_port": port, "dmlc_task_id": "00000000",
                           "dmlc_retry": 1, "dmlc_timeout": 2})
    with pytest.raises(RuntimeError) as raised:
        with config._xgboost_communicator():
            pytest.fail("the training function ran without a communicator")
    assert str(raised.value) == (
        f"worker rank 0 could not join XGBoost's tracker at 127.0.0.1:{port} (Socket error. Connection refused). "
        "Is the driver's node reachable from this worker? Set XGBoostConfig(tracker_host=...) to an address it can "
        "reach.")  # the reason, not XGBoost's native stack trace
    assert config._root_cause(RuntimeError("no details\nat all")) == "no details"


def test_a_port_in_use_names_the_port_and_the_default_does_not_hit_it():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"cannot start XGBoost's tracker on 127.0.0.1:{port} .*"
                                               r"Pass XGBoostConfig\(tracker_port=0\)"):
            config._start_tracker(1, config.XGBoostConfig(tracker_host="127.0.0.1", tracker_port=port))


def test_releasing_a_tracker_no_worker_joined_does_not_wait_for_its_timeout():
    """A run that failed before its training functions started: XGBoost's own ``free`` would wait
    for the tracker's timeout (300 s by default) for workers that never come."""
    import threading

    tracker = config._start_tracker(2, config.XGBoostConfig(tracker_host="127.0.0.1"))
    closing = threading.Thread(target=config._close_tracker, args=(tracker, 0))
    closing.start()
    closing.join(timeout=30)
    assert not closing.is_alive(), "releasing the tracker waited for workers that never joined"


def test_collective_failures_become_peer_errors_and_others_stay_as_they_are():
    from sgd.errors import PeerFailureError

    lost = xgboost.core.XGBoostError("[12:00] comm.cc:1: Allreduce failed\n- [socket.h:79]: Connection reset by peer")
    echo = config._peer_error(lost)
    assert isinstance(echo, PeerFailureError)
    assert str(echo) == ("worker rank 0: XGBoost's collective call failed because another worker stopped (its own "
                         "error or death is the cause): [socket.h:79]: Connection reset by peer")
    assert config._peer_error(xgboost.core.XGBoostError("Invalid parameter max_depth")) is None
    assert config._peer_error(RuntimeError("allreduce failed")) is None  # not XGBoost's


def test_a_peer_failure_inside_the_communicator_is_raised_as_the_echo_it_is():
    tracker = config._start_tracker(1, config.XGBoostConfig(tracker_host="127.0.0.1"))
    config._set_comm_args({**tracker.worker_args(), "dmlc_task_id": "00000000"})
    with pytest.raises(config.XGBoostPeerError, match="another worker stopped") as raised:
        with config._xgboost_communicator():
            raise xgboost.core.XGBoostError("Allgather failed")
    assert isinstance(raised.value.__cause__, xgboost.core.XGBoostError)
    config._close_tracker(tracker, 0)


# --- LightGBM's network ---------------------------------------------------------------------------


def test_network_parameters_inside_and_outside_a_run(caplog):
    config._set_network_params({})
    with caplog.at_level("WARNING", logger="sgd.xgboost"):
        assert config.get_network_params() == {}  # as Ray 2.60: LightGBM trains alone, with a warning
    assert "get_network_params() was called outside a training function of the 'lightgbm' backend" in caplog.text
    config._set_network_params({"machines": "127.0.0.1:1", "local_listen_port": 1, "num_machines": 1,
                                "time_out": 120})
    assert config.get_network_params() == {}  # one worker: nothing to connect
    two = {"machines": "127.0.0.1:1,127.0.0.1:2", "local_listen_port": 2, "num_machines": 2, "time_out": 120}
    config._set_network_params(two)
    assert config.get_network_params() == two
    config._set_network_params({})


def test_freeing_the_network_after_a_failure_is_safe_with_or_without_lightgbm(monkeypatch):
    import sys

    import lightgbm  # noqa: F401  (imported: its network is freed, even when none was made)

    config._free_lightgbm_network()
    monkeypatch.delitem(sys.modules, "lightgbm")
    config._free_lightgbm_network()  # not imported on this worker: nothing to free
