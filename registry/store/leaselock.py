"""A lock file that needs no ``flock``: ``O_CREAT | O_EXCL`` with an owner and a lease.

Some shared filesystems (Lustre, GPFS, some NFS mounts) accept ``flock`` and
lock nothing, so a compare-and-swap that relies on it alone can lose an
update (issue 13 item 10). Exclusive creation is atomic on all of them. The
lock file holds its owner (host, pid, a random token) and is held for a few
milliseconds (read, compare, write a temp file, rename). A holder that died
leaves it behind: it is broken when its owner is a dead process on this host,
or when it is older than ``lease`` seconds. Breaking takes a second exclusive
file (``<lock>.break``), so two waiters never both break one lock and then
remove each other's fresh one.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

from registry.rules import numbers
from registry.errors import PointerConflictError
from registry.host.processes import pid_alive

#: seconds after which a lock file is taken to be abandoned (the section it
#: guards takes milliseconds; a generous lease tolerates clock skew and stalls).
LEASE = 30.0
#: seconds to wait for a lock before giving up.
TIMEOUT = 120.0


class LeaseLock:
    """``with LeaseLock(path):`` -- exclusive across processes and hosts.

    Raises:
        PointerConflictError: the lock stayed held by a live owner for
            ``timeout`` seconds (the message names it).
        OSError: the folder is not writable.
    """

    def __init__(self, path: str, *, lease: float = LEASE, timeout: float = TIMEOUT) -> None:
        self.path = path
        self.lease = lease
        self.timeout = timeout
        self.token = uuid.uuid4().hex
        self._body = numbers.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                 "token": self.token}).encode()

    def _try_create(self, path: str, body: bytes) -> bool:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        return True

    def _stale(self, content: bytes, mtime: float) -> bool:
        age = time.time() - mtime
        try:
            owner = json.loads(content)
        except ValueError:
            # Empty or partial: being written right now, or a legacy flock
            # file (empty forever): stale once it is not brand new.
            return age > 2.0
        if owner.get("host") == socket.gethostname() and not pid_alive(int(owner.get("pid", 0))):
            return True
        return age > self.lease

    def _read(self) -> tuple[bytes, float] | None:
        try:
            with open(self.path, "rb") as f:
                return f.read(), os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None

    def _break(self, content: bytes) -> None:
        """Remove the lock if it still holds ``content``, under the break lock."""
        breaker = self.path + ".break"
        if not self._try_create(breaker, self._body):
            try:  # a breaker that died mid-break (microseconds) left it
                if time.time() - os.stat(breaker).st_mtime > self.lease:
                    os.unlink(breaker)
            except FileNotFoundError:
                pass
            return
        try:
            now = self._read()
            if now is not None and now[0] == content:
                os.unlink(self.path)
        finally:
            os.unlink(breaker)

    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout
        delay = 0.001
        while not self._try_create(self.path, self._body):
            seen = self._read()
            if seen is not None and self._stale(*seen):
                self._break(seen[0])
                continue
            if time.monotonic() > deadline:
                owner = seen[0].decode("utf-8", "replace") if seen else "(gone)"
                raise PointerConflictError(self.path, expected="the lock",
                                           actual=f"held by {owner}")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def release(self) -> None:
        seen = self._read()
        if seen is not None and seen[0] == self._body:  # never remove another's lock
            os.unlink(self.path)

    def __enter__(self) -> LeaseLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
