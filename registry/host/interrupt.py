"""SIGTERM handled like SIGINT (Ctrl-C), for the registry's processes.

Kubernetes, systemd and ``docker stop`` end a process with SIGTERM, whose
default action kills it on the spot: no ``finally``, no cleanup, a staging
directory and a claim left behind. :func:`terminate_like_interrupt` makes
SIGTERM raise :class:`Terminated`, a ``KeyboardInterrupt``, in the main
thread instead, so every write unwinds exactly as it does on Ctrl-C (commits
abort on any ``BaseException``: staging removed, claim and writer lease
released, nothing committed; a pull removes its partial files). The process
then exits with 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM
(what a shell reports for a process the signal killed).

An interrupt never hides a commit (issue 47 item 4): a commit marker is
written and noted (:func:`note_commit`) as one step an interrupt waits for,
and a command interrupted after that still prints the committed line (and
its ``--json`` record) before it exits 130/143.
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: exit codes of a process interrupted by SIGINT and by SIGTERM (128 + signal)
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM

_received: list[int] = []
#: commits made by this process that no output has reported yet (note_commit;
#: the newest 64: a long-lived writer that never reports keeps no more)
_commits: deque[dict[str, Any]] = deque(maxlen=64)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: raised in the main thread where SIGINT raises KeyboardInterrupt."""


def _raise_terminated(signum: int, frame: Any) -> None:
    _received.append(signum)
    raise Terminated(f"signal {signal.Signals(signum).name}")


def terminate_like_interrupt() -> None:
    """Make SIGTERM raise :class:`Terminated` in the main thread (a no-op off it,
    where Python cannot set handlers). Call once, at a process's entry point."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def exit_code(default: int = EXIT_SIGINT) -> int:
    """143 once SIGTERM was received in this process, else ``default`` (130)."""
    return EXIT_SIGTERM if _received else default


def signal_name() -> str:
    """``SIGTERM`` once it was received, else ``SIGINT``."""
    return "SIGTERM" if _received else "SIGINT"


@contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then act on the first one
    that arrived (its handler runs at the block's end: an interrupt is raised
    there). For a short step whose half-done state nobody could clean up, such
    as taking a claim and recording that it is held. A no-op off the main
    thread, where Python runs no signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[tuple[int, Any]] = []
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, lambda n, f: got.append((n, f)))
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if got:
            signum, frame = got[0]
            handler = old[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def note_commit(record: dict[str, Any]) -> None:
    """Record that a commit happened (``record``: what a report prints, see
    registry.protocol.commit.DirectoryWriter.commit_record). A command interrupted
    after it prints the commit anyway (registry.cli: the committed line and
    ``--json`` record), so that nobody takes a committed write for a failed one."""
    _commits.append(record)


def unreported_commits() -> list[dict[str, Any]]:
    """The commits noted since the last :func:`commits_reported`, oldest first."""
    return list(_commits)


def commits_reported() -> None:
    """The command has printed what it committed: nothing is left to report."""
    _commits.clear()
