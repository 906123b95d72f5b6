"""The example trainer as a script: ``python examples/tinytrainer.py --help``.

The code lives in :mod:`registry.examples.tinytrainer` so that the quickstart
can run it from an installed wheel.
"""

import os
import sys

# Single-threaded BLAS before numpy loads: a fixed summation order in every process.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from registry.examples.tinytrainer import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
