raise ImportError("sgd_dummy.broken needs the 'jax' package")
