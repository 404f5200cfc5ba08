"""The loggers apply sgd-core's one secret rule (sgd.redact), not a copy of it."""

import sgd_loggers._util as loggers_util
from sgd.redact import is_secret_key, redact


def test_the_loggers_use_the_same_rule():
    assert loggers_util.redact is redact and loggers_util.is_secret_key is is_secret_key
    assert [is_secret_key(k) for k in ("wandb_api_key", "Token", "db_password", "lr", 3)] == [
        True, True, True, False, False]
