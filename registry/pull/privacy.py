"""The pull cache is private (issue 29 item 4), as ssh keeps a key file private.

A cache another local user can write is a cache that user fills: a blob with
the right name and the wrong bytes, a stamp saying it was verified, a record
naming a directory for ``cache prune`` to delete. So:

* **Created private**, whatever the umask: folders ``0700``, records and
  stamps ``0600`` (blobs stay ``0444``). With ``REGISTRY_CACHE_GROUP`` (a
  group name or gid) the group may read: folders ``02750`` (set-group-ID, so
  what is made inside keeps the group), files ``0640``. The group never
  writes.
* **Refused for use** when another user could have written it: the cache
  folder or one of its folders (``blobs/``, ``records/``, ``stamps/``...)
  owned by a user other than this one or root, writable by others, or
  writable by its group -> UnsafeEntryError naming it, the owner or mode,
  and the fix, exit 6; a blob, record or stamp that is -> treated as absent
  (a blob is downloaded again, over it; a record or stamp ignored). A blob
  that is not a regular file (a folder, a link, a FIFO) is treated the same.

See docs/confinement.md.
"""

from __future__ import annotations

import errno
import grp
import os
import shutil
import stat
from pathlib import Path

from registry.errors import UnsafeEntryError, UsageError

GROUP_ENV = "REGISTRY_CACHE_GROUP"


def cache_group() -> int | None:
    """The gid ``REGISTRY_CACHE_GROUP`` names (None when unset).

    Raises:
        UsageError: no such group.
    """
    name = os.environ.get(GROUP_ENV, "").strip()
    if not name:
        return None
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise UsageError(f"{GROUP_ENV}={name}: no such group") from None


def dir_mode(group: int | None) -> int:
    return 0o2750 if group is not None else 0o700


def file_mode(group: int | None) -> int:
    return 0o640 if group is not None else 0o600


def problem(st: os.stat_result, group: int | None) -> str | None:
    """Why an entry with this lstat is not the cache user's alone, or None."""
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        return f"owned by uid {st.st_uid} (not this user, uid {uid}, nor root)"
    if st.st_mode & 0o002:
        return f"writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    if st.st_mode & 0o020:
        return f"writable by its group (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def make_private_dir(path: Path, group: int | None) -> None:
    """Create ``path`` and its missing parents private (``dir_mode``), the
    umask notwithstanding; an existing folder is left as it is (checked by
    :func:`check_dir`)."""
    missing = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue
        if group is not None:
            os.chown(d, -1, group)
        os.chmod(d, dir_mode(group))


def check_dir(path: Path, group: int | None) -> None:
    """Raise UnsafeEntryError unless ``path`` is a folder (not a link) that is
    this user's alone (:func:`problem`); NotADirectoryError for a file there."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeEntryError(f"{path}: a symbolic link to {os.readlink(path)}; the pull "
                               "cache's folders must be folders of its own", key=str(path))
    if not stat.S_ISDIR(st.st_mode):  # a file in the way: the caller's "cannot use" error
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    why = problem(st, group)
    if why:
        raise UnsafeEntryError(
            f"{path}: {why}; the pull cache must be private to its user, as ssh refuses a "
            f"key file (chown it to yourself and chmod 700 it, or remove it; "
            f"{GROUP_ENV} lets a group read it)", key=str(path))


def usable(path: Path, group: int | None) -> bool:
    """``path`` is a regular file this user alone could have written."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and problem(st, group) is None


def evict(path: Path) -> None:
    """Remove what is at ``path`` in a cache folder, whatever it is: a file or
    link as itself, a folder with what it holds (links inside removed as
    links, never followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)  # fd-based: never follows a link
    else:
        path.unlink(missing_ok=True)


def write_private(path: Path, data: bytes, group: int | None) -> None:
    """Write ``data`` to a fresh ``path`` (exclusive create) with
    :func:`file_mode`, whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.fchmod(fd, file_mode(group))
        if group is not None:
            os.fchown(fd, -1, group)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


__all__ = ["GROUP_ENV", "cache_group", "check_dir", "dir_mode", "evict", "file_mode",
           "make_private_dir", "problem", "usable", "write_private"]
