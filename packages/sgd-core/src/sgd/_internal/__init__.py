"""The run directory on the driver: its one writer (:mod:`sgd._internal.run_dir`) and a saved
trainer's settings (:mod:`sgd._internal.saved_trainer`)."""
