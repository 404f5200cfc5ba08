"""sgd's counterparts of ``ray.tune.integration`` modules: ``sgd_tune.integration.ray_train``
(``TuneReportCallback``, Ray Train 2.x's way of running a trainer inside a Tune trial)."""
