"""The run engine on the driver: the run controller (one step function over states that carry
their data) and its policies (the only retry counters), and what it reads between rounds."""
