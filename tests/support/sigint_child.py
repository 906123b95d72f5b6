"""``python -m tests.support.sigint_child N ARGS...``: ``registry ARGS`` with
SIGINT sent to this process at the start of its Nth store call (issue 47
item 4); ``N`` = 0 sends none and prints ``calls <n>`` on stderr at exit.

Every public method of the store classes counts once (calls they make of
each other do not), from any thread: the signal is raised where the call
starts, so each N is a different point of the command.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import sys
import threading
from typing import Any

from registry.store.base import Store
from registry.store.local import LocalStore
from registry.store.s3 import S3Store


def main() -> None:
    at = int(sys.argv[1])
    calls = [0]
    lock = threading.Lock()
    depth = threading.local()

    def wrap(fn: Any) -> Any:
        @functools.wraps(fn)
        def counted(*args: Any, **kw: Any) -> Any:
            outer = not getattr(depth, "n", 0)
            if outer:
                with lock:
                    calls[0] += 1
                    hit = calls[0] == at
                if hit:
                    os.kill(os.getpid(), signal.SIGINT)
            depth.n = getattr(depth, "n", 0) + 1
            try:
                return fn(*args, **kw)
            finally:
                depth.n -= 1
        return counted

    for cls in (Store, LocalStore, S3Store):
        for name, fn in list(vars(cls).items()):
            if not name.startswith("_") and inspect.isfunction(fn):
                setattr(cls, name, wrap(fn))
    sys.argv = ["registry", *sys.argv[2:]]
    from registry.cli import main as cli_main

    try:
        cli_main()
    finally:
        if at == 0:
            print(f"calls {calls[0]}", file=sys.stderr)


if __name__ == "__main__":
    main()
