"""Fresh trust for long-running processes: keys and revocations re-read when they change.

A ``registry serve`` (or any process holding trust for long) keeps a
:class:`TrustSource` instead of a :class:`registry.trust.Trust`: every
:meth:`TrustSource.current` stats the trust inputs (each ``--trusted-key`` /
``--trusted-ca`` file, each folder, its listing and its ``revoked.json``) at
most every :data:`CHECK_INTERVAL` seconds and reloads them
(:func:`registry.trust.load_trust`, its checks of file modes included) when
any inode, size or modification time changed. A key revoked on the host
(``registry keys revoke``, which replaces ``revoked.json`` by rename) is
therefore refused from the next request on, at most CHECK_INTERVAL seconds
later; a key dropped into the folder is trusted likewise.

A reload that fails (a garbled ``revoked.json``, a file another user can
write) fails closed: :meth:`current` raises until the inputs are good again;
the last good trust is never used past a change it could not read.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from registry.trust import Trust, load_trust

#: seconds between two stats of the trust inputs
CHECK_INTERVAL = 0.25


def _stamp(p: Path) -> tuple[object, ...]:
    try:
        st = p.stat()
    except OSError:
        return (str(p), None)
    out: tuple[object, ...] = (str(p), st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode,
                               st.st_uid)
    if p.is_dir():
        try:
            names = sorted(os.listdir(p))
        except OSError:
            names = []
        out += tuple(_stamp(p / n) for n in names)
    return out


class TrustSource:
    """The host's trust, re-read when its files change (see the module docstring)."""

    def __init__(self, key_files: Iterable[str | os.PathLike[str]] = (),
                 folder: str | os.PathLike[str] | None = None, *,
                 ca_files: Iterable[str | os.PathLike[str]] = (),
                 ca_folder: str | os.PathLike[str] | None = None,
                 interval: float = CHECK_INTERVAL) -> None:
        self.key_files = [Path(p) for p in key_files]
        self.folder = Path(folder) if folder else None
        self.ca_files = [Path(p) for p in ca_files]
        self.ca_folder = Path(ca_folder) if ca_folder else None
        self.interval = interval
        self._lock = threading.Lock()
        self._checked = 0.0
        self._stamp = self._stamps()
        self._trust: Trust | None = self._load()
        self._error: Exception | None = None

    def _stamps(self) -> tuple[object, ...]:
        paths = [*self.key_files, *self.ca_files]
        paths += [p for p in (self.folder, self.ca_folder) if p is not None]
        return tuple(_stamp(p) for p in paths)

    def _load(self) -> Trust:
        return load_trust(self.key_files, self.folder, ca_files=self.ca_files,
                          ca_folder=self.ca_folder)

    def current(self) -> Trust:
        """The trust as the files say now (stat at most every ``interval`` s).

        Raises:
            UsageError, DocumentError: as :func:`registry.trust.load_trust`,
                when the inputs changed and cannot be read (fail closed).
        """
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= self.interval:
                self._checked = now
                stamp = self._stamps()
                if stamp != self._stamp:
                    self._stamp = stamp
                    try:
                        self._trust, self._error = self._load(), None
                    except Exception as e:  # fail closed until the inputs are good
                        self._trust, self._error = None, e
            if self._trust is None:
                assert self._error is not None
                raise self._error
            return self._trust


def current(trust: Trust | TrustSource | None) -> Trust | None:
    """``trust`` as it is now: a TrustSource's current trust, else itself."""
    return trust.current() if isinstance(trust, TrustSource) else trust


__all__ = ["CHECK_INTERVAL", "TrustSource", "current"]
