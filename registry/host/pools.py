"""Shared helper-thread pools that survive ``fork`` and interpreter shutdown.

A module-level ``ThreadPoolExecutor`` breaks in two situations a library must
handle:

* in a child made by ``os.fork`` (``multiprocessing``'s default on Linux) the
  pool's worker threads do not exist, so a submitted job never runs and its
  caller waits forever;
* while the interpreter shuts down (an async checkpoint save still running
  when the script ends), every ``submit`` raises ``RuntimeError``.

:class:`HelperPool` creates its executor lazily, forgets it in a forked child
(``os.register_at_fork``), and runs a job on the calling thread when no new
thread may be started, so the work is done either way.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

_POOLS: weakref.WeakSet[HelperPool] = weakref.WeakSet()


class HelperPool:
    """A lazily started pool of ``max_workers`` threads named ``name``."""

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers = max_workers
        self.name = name
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        _POOLS.add(self)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on a helper thread; returns its Future. During
        interpreter shutdown it runs on the calling thread instead, and the
        Future returned is already done (with its result or exception)."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_workers,
                                                    thread_name_prefix=self.name)
            executor = self._executor
        try:
            return executor.submit(fn, *args)
        except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
            done: Future[T] = Future()
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)
            return done

    def _forget(self) -> None:
        """In a forked child: the threads are gone; start anew on next use."""
        self._executor = None
        self._lock = threading.Lock()


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
