"""Leaf utilities shared by the driver and the workers (the wire protocol, node and scaling
arithmetic, JSON values, dataset parts): they import nothing of sgd above ``errors``/``redact``."""
