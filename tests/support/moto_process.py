"""A moto S3 server in its own process, configured by moto's environment
variables, which moto reads once at import (so they cannot change inside the
test session): ``INITIAL_NO_AUTH_ACTION_COUNT=0`` turns authentication on
(keys moto does not know answer 403 InvalidAccessKeyId, as a real server
does for wrong credentials); ``S3_UPLOAD_PART_MIN_SIZE`` lowers the minimum
part size. Prints its endpoint, then serves until stdin closes.

Use :func:`start` from a test: ``with start({"S3_UPLOAD_PART_MIN_SIZE": "1024"}) as url``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def start(env: dict[str, str]) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.moto_process"],
                            cwd=Path(__file__).resolve().parents[2], env={**os.environ, **env},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.communicate("", timeout=30)


if __name__ == "__main__":
    from tests.support.s3server import S3Server

    server = S3Server(serialize=True).start()
    print(server.endpoint, flush=True)
    sys.stdin.read()
    server.stop()
