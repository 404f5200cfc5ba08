"""Worker groups: the protocol the run controller drives (:mod:`sgd.group.protocol`), what a
group reports as data (:mod:`sgd.group.status`), and its implementations: Ray actors
(:mod:`sgd.group.actors`, with report rounds in :mod:`sgd.group.rounds` and hosts'
health in :mod:`sgd.group.hosts`) and the driver's own process (:mod:`sgd.group.in_process`)."""
