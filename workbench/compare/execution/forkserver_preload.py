"""What the pool's forkserver loads once, before it forks a worker: numpy with one BLAS thread, the worker module and
the fused metric kernels (compiled, or loaded from numba's cache). Every worker then starts warm.

The compare's parallelism is its worker processes, and the kernels call no BLAS: OpenBLAS's own thread per core would
only be started and spun at numpy's load. A user's own `OPENBLAS_NUM_THREADS` is kept.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from workbench.compare.execution import lifeline, worker  # noqa: F401  (loaded for the workers)
from workbench.compare.judging import kernels

kernels.warm()
