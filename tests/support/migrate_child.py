"""Run one registry CLI command in this process and SIGKILL it at one point
of its SQL: right before its ``N``-th statement or commit (issue 31 item 4).

    python -m tests.support.migrate_child N registry-args...

``N`` = 0 never kills; the number of points passed is printed on stderr at
exit (``points <n>``), so a test first counts them, then kills at each.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

KILL_AT = int(sys.argv[1])
_points = [0]


def _point(*_: Any) -> None:
    _points[0] += 1
    if _points[0] == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)


event.listen(Engine, "before_cursor_execute", _point)
event.listen(Engine, "commit", _point)
atexit.register(lambda: print(f"points {_points[0]}", file=sys.stderr))

if __name__ == "__main__":
    from registry.cli import main

    sys.argv = ["registry", *sys.argv[2:]]
    main()
