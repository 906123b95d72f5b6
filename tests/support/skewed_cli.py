"""Run the registry CLI in this process with its wall clock shifted (a host
whose clock is off), like libfaketime for Python's ``time.time``:

    python -m tests.support.skewed_cli SECONDS registry-args...

``SECONDS`` may be negative (the host is behind). Monotonic time and the
store's stamps (file mtimes set by the kernel, S3's LastModified) are not
shifted: they are not this host's wall clock.
"""

from __future__ import annotations

import sys
import time

OFFSET = float(sys.argv[1])
_real = time.time
time.time = lambda: _real() + OFFSET  # type: ignore[assignment]

if __name__ == "__main__":
    from registry.cli import main

    sys.argv = ["registry", *sys.argv[2:]]
    main()
