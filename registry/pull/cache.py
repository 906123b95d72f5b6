"""The serving host's content-addressed cache.

Layout (under ``$REGISTRY_CACHE``, default ``~/.cache/model-registry``)::

    <cache>/
    ├── blobs/sha256/<hex>             verified file contents, read-only, shared
    ├── stamps/                        stat stamps of verified blobs and placed
    │                                  directories (registry.pull.stamps)
    ├── tmp/<hex>.<pid>.<rand>.incomplete   downloads in progress
    └── models/<model_id>/<version>/   materialized model directories (when no --to)
        └── MANIFEST.json              (reflinks or copies of blobs, never hardlinks)

The cache is private to its user (registry.pull.privacy): created ``0700``
whatever the umask, refused when another user could write it.

A blob enters ``blobs/`` only by an atomic rename after its size and sha256
matched the manifest, so a blob's presence means it was verified once; it is
checked again every time it is placed (registry.pull.materialize), because a
process with enough rights can still write to it. Temp files carry the pid of
their writer: a later pull deletes those whose writer is gone.
"""

from __future__ import annotations

import os
import re
import stat
import time
import uuid
from pathlib import Path

from registry.errors import StorageError, UnsafeEntryError, UsageError
from registry.host.processes import pid_alive
from registry.pull import privacy
from registry.pull.stamps import Stamps

_SHA256 = re.compile(r"[0-9a-f]{64}")

DEFAULT_CACHE = Path("~/.cache/model-registry")
INCOMPLETE = ".incomplete"
#: ``1``: place a cache blob (and call a pulled directory unchanged) by its
#: stat stamp alone, unread; default ``0``: read and hash it (issue 47).
TRUST_STAMPS_ENV = "REGISTRY_CACHE_TRUST_STAMPS"


def trust_stamps() -> bool:
    """The :data:`TRUST_STAMPS_ENV` setting (default False).

    A stat stamp misses bytes that change under an unchanged inode, size,
    mtime and ctime: a reflinked extent rewritten beneath the file, a
    filesystem (FUSE, some network mounts) that keeps or caches ctime. By
    default every blob placed from the cache is hashed (one read of its
    bytes, from the page cache when warm: about the cost of a copy) and a
    re-pull re-hashes the target; a blob this pull downloaded and verified
    is placed unread either way.

    Raises:
        UsageError: the variable is set to something other than 0 or 1.
    """
    value = os.environ.get(TRUST_STAMPS_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise UsageError(f"{TRUST_STAMPS_ENV}={value!r}: must be 0 (hash every placed blob, "
                         "the default) or 1 (trust stat stamps)")
    return value == "1"


def cache_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """``path``, else ``$REGISTRY_CACHE``, else ``$XDG_CACHE_HOME/model-registry``.

    Raises:
        UsageError: ``path`` is an empty string (it would make the current
            directory the cache and scatter ``blobs/``, ``records/``... there).
    """
    if path is not None:
        if not str(path).strip():
            raise UsageError("--cache / REGISTRY_CACHE: must be a non-empty path")
        return Path(path).expanduser().resolve()
    env = os.environ.get("REGISTRY_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) / "model-registry" if xdg else DEFAULT_CACHE.expanduser()).resolve()


def owner_pid(name: str) -> int | None:
    """The writer pid encoded in a temp name (``x.<pid>.<rand>...``), if any."""
    for part in name.split("."):
        if part.startswith("pid") and part[3:].isdigit():
            return int(part[3:])
    return None


def temp_tag() -> str:
    """``pid<pid>.<random>``: unique per writer, and tells whether the writer lives."""
    return f"pid{os.getpid()}.{uuid.uuid4().hex[:12]}"


#: suffix of a partial download's piece log (registry.pull.resume)
LOG = ".pieces"
#: seconds a dead writer's partial is kept for a resume
KEEP_SECONDS = 7 * 24 * 3600


def is_kept(path: Path, now: float) -> bool:
    """A dead writer's partial (or its log) ``Cache.clean_stale`` keeps for a resume."""
    name = path.name
    partial = path.with_name(name[:-len(LOG)]) if name.endswith(LOG) else path
    if not partial.name.endswith(INCOMPLETE):
        return False
    try:
        return (partial.with_name(partial.name + LOG).exists()
                and now - partial.stat().st_mtime < KEEP_SECONDS)
    except FileNotFoundError:
        return False


class Cache:
    """A cache directory (created on first use).

    Raises:
        StorageError: the directory cannot be created or used (a file is in
            the way, no permission).
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = cache_dir(root)
        self.blobs = self.root / "blobs" / "sha256"
        self.tmp = self.root / "tmp"
        self.models = self.root / "models"
        #: the group that may read the cache (registry.pull.privacy), or None.
        self.group = privacy.cache_group()
        self.stamps = Stamps(self.root / "stamps", self.group)
        #: a signed pull sets it: no blob is placed unread but those in
        #: :attr:`fresh` (downloaded and verified by this pull).
        self.recheck = False
        self.fresh: set[str] = set()
        #: place blobs and judge targets by stat stamps alone (trust_stamps()).
        self.trust_stamps = trust_stamps()
        try:
            privacy.make_private_dir(self.root, self.group)
            privacy.check_dir(self.root, self.group)
            for d in (self.root / "blobs", self.blobs, self.tmp, self.models,
                      self.stamps.root, self.root / "records", self.root / "leases"):
                privacy.make_private_dir(d, self.group)
                privacy.check_dir(d, self.group)
        except UnsafeEntryError:
            raise
        except OSError as e:
            raise StorageError(f"{self.root}: cannot use as the cache directory "
                               f"({e.strerror or e})", key=str(self.root)) from None

    def blob(self, sha256: str) -> Path:
        """The path of the blob named ``sha256`` (64 lower-case hex digits,
        else UnsafeEntryError: a name from a record cannot leave blobs/)."""
        if not _SHA256.fullmatch(sha256):
            raise UnsafeEntryError(f"{self.blobs}/{sha256!r}: not a blob name (64 hex digits)",
                                   key=sha256)
        return self.blobs / sha256

    def usable(self, sha256: str) -> bool:
        """The blob is a regular file this user alone could have written."""
        return privacy.usable(self.blob(sha256), self.group)

    def has(self, sha256: str, size: int) -> bool:
        """A usable blob of this digest and size is present (verified when it
        entered; its bytes are checked again when placed). One another user
        could have written, or that is not a regular file, is absent: the
        pull downloads it again, over it."""
        try:
            st = os.lstat(self.blob(sha256))
        except FileNotFoundError:
            return False
        return (stat.S_ISREG(st.st_mode) and st.st_size == size
                and privacy.problem(st, self.group) is None)

    def unread_ok(self, sha256: str) -> bool:
        """The blob may be placed without reading it: its stamp is the one
        recorded when it was verified, and it was downloaded by this pull
        (a signed pull, or by default: :func:`trust_stamps`) or stamps are
        trusted (:data:`TRUST_STAMPS_ENV` = 1)."""
        if (self.recheck or not self.trust_stamps) and sha256 not in self.fresh:
            return False
        return self.usable(sha256) and self.stamps.blob_unchanged(self.blob(sha256))

    def drop(self, sha256: str) -> None:
        """Remove a blob found changed (or not a regular file), and its stamp:
        the next pull downloads it."""
        if "/" in sha256 or sha256 in ("", ".", "..") or "\0" in sha256:
            raise UnsafeEntryError(f"{self.blobs}/{sha256!r}: not a blob name", key=sha256)
        privacy.evict(self.blobs / sha256)  # listed in blobs/: one component
        self.stamps.forget_blob(sha256)

    def new_temp(self, sha256: str) -> Path:
        return self.tmp / f"{sha256}.{temp_tag()}{INCOMPLETE}"

    def clean_stale(self) -> list[tuple[Path, int]]:
        """Delete temp files whose writer process is gone, except partial
        downloads kept for a resume (registry.pull.resume: a piece log beside
        them, younger than its KEEP_SECONDS); returns each with its size in
        bytes (0 if it vanished meanwhile)."""
        removed = []
        now = time.time()
        for p in self.tmp.iterdir():
            pid = owner_pid(p.name)
            if pid is not None and not pid_alive(pid) and not is_kept(p, now):
                try:
                    size = p.lstat().st_size
                except FileNotFoundError:
                    size = 0
                p.unlink(missing_ok=True)
                removed.append((p, size))
        return removed
