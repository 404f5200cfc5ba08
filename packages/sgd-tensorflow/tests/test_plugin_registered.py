"""sgd-tensorflow is discovered through its entry point and passes the backend contract."""

import subprocess
import sys

import pytest

import sgd
from sgd_tensorflow import TensorflowConfig
from sgd_tensorflow.config import tf_config_for
from sgd_testing import BackendContractTests


def test_discovered_without_importing_sgd_tensorflow():
    spec = sgd.plugins.available_backends()["tensorflow"]
    assert spec.config_cls is TensorflowConfig
    assert spec.provider == "sgd-tensorflow"


def test_plugin_module_does_not_import_tensorflow():
    code = (
        "import sgd, sgd_tensorflow, sgd_tensorflow.plugin, sys; sgd.plugins.available_backends(); "
        "print('tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_config_validation():
    assert TensorflowConfig().use_legacy_keras is None
    assert TensorflowConfig(use_legacy_keras=False).name == "tensorflow"
    with pytest.raises(ValueError, match="use_legacy_keras"):
        TensorflowConfig(use_legacy_keras="yes")  # type: ignore[arg-type]


def test_tf_config_shape():
    assert tf_config_for(["a:1", "b:2"], 1) == {
        "cluster": {"worker": ["a:1", "b:2"]},
        "task": {"type": "worker", "index": 1},
    }


class TestTensorflowContract(BackendContractTests):
    backend_name = "tensorflow"
    provider = "sgd-tensorflow"

    @staticmethod
    def collective():
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        value = strategy.run(lambda: tf.constant(1.0))
        return float(strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None))
