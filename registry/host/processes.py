"""Processes on this host: whether a process id names a living one (the
owner of a lock file, a lease or a temp file that may have been left behind)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0; a process owned by
    another user counts as alive). Raises OverflowError for a pid too large for
    the OS's type."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
