"""High-water marks: negative facts a store writer cannot erase unseen (issue 50 item 3).

A store writer (bucket write access, no signing key) can delete or roll back
any record whose absence means "allowed": a yank record (the release is
served again), a tombstone (a deleted release comes back), an alias pointer
(an older signed move, or none at all). TUF's answer is a signed snapshot of
every record's version plus a client that never goes back below the newest
state it has seen. This module is the second half, on every host, with or
without keys: **trust on first use**. What a host saw once, it keeps:

==============================  ============================================
record                          what the host remembers and refuses
==============================  ============================================
``ledger/yanks/<m>/<v>.json``   its highest ``revision``; a record absent or
                                lower afterwards is refused (a removed yank
                                is refused loudly, never taken as "unyanked")
tombstone of ``<m>@<v>``        that it existed; a release whose tombstone
                                is gone stays deleted on this host
alias pointer ``refs/<a>``      its highest move ``seq``; a pointer with a
                                lower seq, or one without history, is refused
``ledger/revocations/<s>.json``  that it existed (read where gates are
                                evaluated); gone afterwards: refused
==============================  ============================================

The marks cannot protect what this host never saw (first use): a fresh host
believes the store, and the refusal text says so. Keys and revocations are
host-side files (:mod:`registry.trust`), not store records. Where keys are
configured, alias moves are signed (:mod:`registry.trust.alias_sign`): the marks
then stop a replay of an *older signed* move, which a signature alone cannot.

The marks of one store live in ``<cache>/marks/<sha256(store url)[:16]>.json``
(``$REGISTRY_CACHE``; a folder of mode 0700, files 0600, written by temp file
and rename under an ``flock``); a ``Marks(None)`` keeps them in memory only
(a ``serve`` process without a cache folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from registry.errors import SignatureError, StorageError

#: the folder under the cache that holds one marks file per store
FOLDER = "marks"
#: what a marks file remembers, one table each
KINDS = ("aliases", "yanks", "deleted", "revoked", "snapshots", "timestamps")
#: marks kept per kind at most (a store writer cannot grow the file without bound)
MAX_MARKS = 100_000


class RollbackError(SignatureError):
    """A store record went back below what this host saw before: a removed or
    older yank record, an erased tombstone, an older or history-less alias
    pointer (trust on first use, :mod:`registry.trust.marks`)."""


def marks_path(cache: str | os.PathLike[str] | None, store_url: str) -> Path:
    """The marks file of ``store_url`` under the cache folder ``cache``
    (default ``$REGISTRY_CACHE``, as :func:`registry.pull.cache.cache_dir`)."""
    from registry.pull.cache import cache_dir

    digest = hashlib.sha256(store_url.encode()).hexdigest()[:16]
    return cache_dir(cache) / FOLDER / f"{digest}.json"


class Marks:
    """This host's high-water marks of one store (None ``path``: memory only).

    Every ``check_*`` both checks and raises the mark: it returns when the
    record is at or above what was seen, and raises :class:`RollbackError`
    otherwise. Safe for threads; processes share the file under ``flock``.
    """

    def __init__(self, path: str | os.PathLike[str] | None, store_url: str = "") -> None:
        self.path = Path(path) if path is not None else None
        self.store_url = store_url
        self._lock = threading.Lock()
        self._memory: dict[str, dict[str, int]] = {k: {} for k in KINDS}

    @classmethod
    def for_store(cls, store_url: str, cache: str | os.PathLike[str] | None = None) -> Marks:
        """The marks of ``store_url`` in this host's cache folder."""
        return cls(marks_path(cache, store_url), store_url)

    # -- storage ------------------------------------------------------------------------

    def _read(self) -> dict[str, dict[str, int]]:
        assert self.path is not None
        try:
            doc = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {k: {} for k in KINDS}
        except (OSError, ValueError):
            # a damaged marks file is this host's own state: start over, loudly in the
            # next refusal's absence; never a crash of every pull
            return {k: {} for k in KINDS}
        out: dict[str, dict[str, int]] = {}
        for kind in KINDS:
            table = doc.get(kind) if isinstance(doc, dict) else None
            out[kind] = {str(k): int(v) for k, v in (table or {}).items()
                         if isinstance(v, int) and not isinstance(v, bool)}
        return out

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, dict[str, int]]]:
        with self._lock:
            if self.path is None:
                yield self._memory
                return
            from registry.pull import privacy

            group = privacy.cache_group()
            try:
                # the cache's folders are private whatever the umask (a cache made
                # here first, by a door that only reads its marks, stays the
                # cache registry.pull.privacy accepts)
                privacy.make_private_dir(self.path.parent, group)
            except OSError as e:
                raise StorageError(f"{self.path.parent}: cannot use as the cache directory "
                                   f"of this host's marks ({e.strerror})",
                                   key=str(self.path.parent)) from None
            self._check_private(privacy, group)
            try:
                fd = os.open(self.path.parent / ".lock",
                             os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError as e:
                raise StorageError(f"{self.path.parent}: cannot use as the cache directory "
                                   f"of this host's marks ({e.strerror})",
                                   key=str(self.path.parent)) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                state = self._read()
                before = json.dumps(state, sort_keys=True)
                yield state
                after = json.dumps(state, sort_keys=True)
                if after != before:
                    tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                    try:
                        wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                        with os.fdopen(wfd, "w") as f:
                            f.write(after)
                        os.replace(tmp, self.path)
                    except OSError as e:
                        raise StorageError(f"{self.path}: cannot record this host's marks "
                                           f"({e.strerror})", key=str(self.path)) from None
            finally:
                os.close(fd)

    def _check_private(self, privacy: Any, group: int | None) -> None:
        """Refuse marks another local user could have written (UnsafeEntryError):
        the cache folder or the marks folder owned by another user or writable by
        others or the group, or a marks file likewise. Never read as "nothing
        seen": erasing the marks would lift every yank this host saw."""
        from registry.errors import UnsafeEntryError

        assert self.path is not None
        for folder in (self.path.parent.parent, self.path.parent):
            try:
                privacy.check_dir(folder, group)
            except NotADirectoryError:
                raise StorageError(f"{folder}: cannot use as the cache directory of this "
                                   "host's marks (not a directory)", key=str(folder)) from None
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else privacy.problem(st, group)
        if why:
            raise UnsafeEntryError(f"{self.path}: {why}; this host's marks must be its user's "
                                   "alone (another user could erase what it saw): remove the "
                                   "file, and trust on first use starts over",
                                   key=str(self.path))

    def _where(self) -> str:
        return f"{self.path}" if self.path is not None else "this process's memory"

    # -- the facts ---------------------------------------------------------------------

    def check_yank(self, model_id: str, version: str, record: dict[str, Any] | None,
                   where: str) -> None:
        """``record``: the yank record as read now (None: absent). Raises
        RollbackError when its revision is below the highest seen."""
        rev = record.get("revision") if record is not None else 0
        rev = rev if isinstance(rev, int) and not isinstance(rev, bool) and rev > 0 else 0
        key = f"{model_id}@{version}"
        with self._state() as state:
            seen = state["yanks"].get(key, 0)
            if rev < seen:
                what = "is gone" if record is None else f"is at revision {rev}"
                raise RollbackError(where, f"the yank record of {key} {what}, but this host saw "
                                           f"revision {seen} before (trust on first use, "
                                           f"{self._where()}): refused, a removed or rolled-back "
                                           "yank is never taken as lifted")
            if rev > seen and len(state["yanks"]) < MAX_MARKS:
                state["yanks"][key] = rev

    def check_deleted(self, model_id: str, version: str, deleted: bool, where: str) -> None:
        """Raises RollbackError when ``model_id@version`` was seen deleted and
        its tombstone is gone now."""
        key = f"{model_id}@{version}"
        with self._state() as state:
            if state["deleted"].get(key) and not deleted:
                raise RollbackError(where, f"{key} was deleted (this host saw its tombstone; "
                                           f"trust on first use, {self._where()}), but the "
                                           "tombstone is gone now: refused")
            if deleted and len(state["deleted"]) < MAX_MARKS:
                state["deleted"][key] = 1

    def check_revoked(self, sources: set[str], where: str) -> None:
        """``sources``: the data sources revoked in the store now (readable or
        not). Raises RollbackError when one seen revoked before is missing."""
        with self._state() as state:
            gone = sorted(k for k in state["revoked"] if k not in sources)
            if gone:
                raise RollbackError(where, f"the revocation of data source {gone[0]!r} is "
                                           f"gone, but this host saw it before (trust on first "
                                           f"use, {self._where()}): refused, a revocation is "
                                           "never taken as lifted")
            for k in sources:
                if len(state["revoked"]) < MAX_MARKS:
                    state["revoked"][k] = 1

    def check_alias(self, model_id: str, alias: str, seq: int | None, where: str) -> None:
        """``seq``: the seq of the pointer's move now (None: no pointer, or one
        without history). Raises RollbackError when it is below the highest seen."""
        key = f"{model_id}@{alias}"
        with self._state() as state:
            seen = state["aliases"].get(key, 0)
            if (seq or 0) < seen:
                what = "has no move history" if seq is None else f"is at move {seq}"
                raise RollbackError(where, f"alias {alias!r} of {model_id} {what}, but this "
                                           f"host saw move {seen} before (trust on first use, "
                                           f"{self._where()}): refused, an alias never goes back")
            if seq is not None and seq > seen and len(state["aliases"]) < MAX_MARKS:
                state["aliases"][key] = seq


    def seen_snapshot(self, model_id: str) -> int:
        """The newest snapshot version of ``model_id`` this host accepted (0: none)."""
        with self._state() as state:
            return state["snapshots"].get(model_id, 0)

    def check_snapshot(self, model_id: str, snapshot: int, timestamp: int, where: str) -> None:
        """A signed snapshot and timestamp of ``model_id`` (their versions) that
        verified; raises RollbackError when either is below the newest this
        host accepted, else records them (a host never goes back)."""
        with self._state() as state:
            for kind, got, what in (("snapshots", snapshot, "snapshot"),
                                    ("timestamps", timestamp, "timestamp")):
                seen = state[kind].get(model_id, 0)
                if got < seen:
                    raise RollbackError(where, f"the signed {what} of {model_id} is at version "
                                               f"{got}, but this host accepted version {seen} "
                                               f"before ({self._where()}): refused, a host "
                                               "never goes back to an older signed state")
            for kind, got in (("snapshots", snapshot), ("timestamps", timestamp)):
                if got > state[kind].get(model_id, 0) and len(state[kind]) < MAX_MARKS:
                    state[kind][model_id] = got


__all__ = ["FOLDER", "KINDS", "MAX_MARKS", "Marks", "RollbackError", "marks_path"]
