"""A run's storage: the run directory's one reader and writer, and the checkpoints in it.

- :mod:`sgd.storage.run_dir`: :class:`RunDirectory`, the driver's writer of ``run_NNN/``
  (``trainer.json``, ``results.jsonl``, ``status.json``);
- :mod:`sgd.storage.reading`: reading run directories back (public as :mod:`sgd.runs`);
- :mod:`sgd.storage.saved_trainer`: an AIR trainer's settings (``air_trainer.json``);
- :mod:`sgd.storage.staging`: a worker's checkpoint written into a temporary folder of the run's
  checkpoint folder (on the driver's disk, directly or through the run's file server): the one
  thing that travels to the driver for a checkpoint is that folder's path;
- :mod:`sgd.storage.manager`: the driver's :class:`CheckpointManager`, which registers each
  such folder once (numbered, committed atomically, the best K kept, mirrored to a URI);
  :mod:`sgd.storage.restoring` reads the kept ones back (what a run resumes from) and
  :mod:`sgd.storage.kept` holds a kept checkpoint's record and its metadata file.

The checkpoint format itself (:class:`sgd.Checkpoint`, codecs, integrity, storage URIs) is
:mod:`sgd.checkpoint`, below this package: workers and users read and write checkpoints with it.
"""
