"""Entry point of sgd-tune: answers ``sgd_tune_trainable`` for ``Trainer.to_tune_trainable``.

Glue only, and light: Ray Tune is imported when a trainable is asked for, not when sgd
loads its plugins.
"""

import sgd


@sgd.hookimpl
def sgd_tune_trainable(trainer, train_func, dataset):
    from sgd.air import DataParallelTrainer

    if isinstance(trainer, DataParallelTrainer):
        from sgd_tune.air import make_air_trainable

        return make_air_trainable(trainer)
    from sgd_tune.trainable import make_trainable

    return make_trainable(trainer, train_func, dataset)
