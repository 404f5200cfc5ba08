"""The run engine on the driver: the run controller and its policies, the backend executor
(the worker group's lifecycle), report rounds, the run directory."""
