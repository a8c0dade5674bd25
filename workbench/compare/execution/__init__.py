"""Computing the pairs: units of work, the worker, the process pool and its lifeline, the
early pairs, the executor, Ray."""
