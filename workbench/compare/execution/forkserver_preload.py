"""What the pool's forkserver loads once, before it forks a worker: numpy with one BLAS thread, the worker module and
the fused metric kernels' machine code (`kernel_code.preload`). Every worker then starts warm.

The compare's parallelism is its worker processes, and the kernels call no BLAS: OpenBLAS's own thread per core would
only be started and spun at numpy's load. A user's own `OPENBLAS_NUM_THREADS` is kept.

The forkserver ends without the interpreter's teardown (it holds nothing to flush; tearing down numpy and numba,
when numba was loaded here, took ~0.13 s after `wb` itself had ended, during which it kept `wb`'s stdout and stderr
open: a caller reading them waited).
The workers it forks end through `os._exit` already.
"""

import atexit
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from workbench.compare.execution import lifeline, worker  # noqa: F401  (loaded for the workers)
from workbench.compare.judging import kernel_code

lifeline.watch_owner()
kernel_code.preload()
atexit.register(os._exit, 0)  # at exit: end here, without the teardown
