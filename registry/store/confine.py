"""One confinement rule for every local tree the registry reads, writes or deletes in.

A key (``runs/r1/ckpt/LATEST``) names an entry under a root (a store folder,
a pull cache, a model directory being placed). Resolving it never leaves the
root: every component is opened relative to its parent's descriptor with
``O_NOFOLLOW`` (``openat``), so a symbolic link anywhere on the way -- planted
by a store writer, another local user or a cloned repository -- is refused,
never followed, whatever happens to the tree meanwhile. Only regular files and
directories are entries; a symlink, FIFO, socket or device (a hardlink to one
included) is refused by the operations that name it and skipped, with a
message, by the listings that meet it (a store keeps them in
``Store.skipped`` for the command to show).
Deletion works on descriptors too (``unlinkat``), removes a symlink as the
link it is, and never descends into another filesystem or a mount point.

The root itself is the operator's choice and may be reached through links
(``./artifacts -> /data/artifacts``); nothing below it is.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Callable, Iterator

from registry.errors import UnsafeEntryError
from registry.store.base import key_parts

log = logging.getLogger("registry.store")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFDIR: "a directory", stat.S_IFREG: "a regular file"}


def kind(mode: int) -> str:
    """``st_mode`` in words: ``"a symbolic link"``, ``"a FIFO"``..."""
    return _KINDS.get(stat.S_IFMT(mode), "a special file")


def parts(key: str, *, where: str) -> list[str]:
    """The segments of ``key`` (registry.store.base.key_parts, the one key rule)."""
    return key_parts(key, where=where)


def _refusal(where: str, shown: str, dir_fd: int, name: str, mode: int) -> UnsafeEntryError:
    what = kind(mode)
    if stat.S_ISLNK(mode):
        try:
            what += f" to {os.readlink(name, dir_fd=dir_fd)}"
        except OSError:
            pass
        rule = "links are never followed inside a store, a cache or a release"
    else:
        rule = "only regular files and directories are read, written or deleted there"
    return UnsafeEntryError(f"{where}/{shown}: {what}; {rule}", key=shown)


def open_root(root: str) -> int:
    """A descriptor of the root folder (links in the root's own path followed)."""
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _open_child_dir(fd: int, name: str, *, where: str, shown: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        st = os.lstat(name, dir_fd=fd)
        if stat.S_ISREG(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", shown) from None
        raise _refusal(where, shown, fd, name, st.st_mode) from None


#: fsyncs a directory by its path: a store passes its own (tests spy on it).
FsyncDir = Callable[[str], None]


def _fsync_fd_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_root(root: str, *, fsync_dir: FsyncDir = _fsync_fd_dir) -> None:
    """Create the folder ``root`` and its missing parents, fsyncing the parent
    of each one made (so that its entry survives a power loss)."""
    missing = []
    folder = root
    while not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:
            continue
        fsync_dir(os.path.dirname(folder))


def open_dir(root: str, segs: list[str], *, where: str, create: bool = False,
             fsync_dir: FsyncDir = _fsync_fd_dir) -> int:
    """A descriptor of the directory ``root/segs...``, every component opened
    without following links. ``create``: make missing folders (0o777 less the
    umask), fsyncing the parent of each one made (``fsync_dir`` of its path:
    the folder just opened by descriptor, so the path names it).

    Raises:
        UnsafeEntryError: a component is a symlink or a special file.
        FileNotFoundError, NotADirectoryError: a component is missing (without
            ``create``) or is a regular file.
    """
    if create:
        make_root(root, fsync_dir=fsync_dir)
    fd = open_root(root)
    try:
        for i, name in enumerate(segs):
            shown = "/".join(segs[:i + 1])
            try:
                nxt = _open_child_dir(fd, name, where=where, shown=shown)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # another writer made it
                    os.mkdir(name, dir_fd=fd)
                    fsync_dir(os.path.join(root, *segs[:i]))
                nxt = _open_child_dir(fd, name, where=where, shown=shown)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def lstat(root: str, key: str, *, where: str) -> os.stat_result:
    """The entry ``key`` as it is (a link is not followed; its parents must be
    directories). Raises UnsafeEntryError, FileNotFoundError."""
    segs = parts(key, where=where)
    if not segs:
        return os.stat(root)
    fd = open_dir(root, segs[:-1], where=where)
    try:
        return os.lstat(segs[-1], dir_fd=fd)
    finally:
        os.close(fd)


def entry_stat(root: str, key: str, *, where: str) -> os.stat_result:
    """:func:`lstat` of a regular file or directory; UnsafeEntryError for a link
    or a special file."""
    segs = parts(key, where=where)
    if not segs:
        return os.stat(root)
    fd = open_dir(root, segs[:-1], where=where)
    try:
        st = os.lstat(segs[-1], dir_fd=fd)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise _refusal(where, key, fd, segs[-1], st.st_mode)
        return st
    finally:
        os.close(fd)


def open_file(root: str, key: str, flags: int, mode: int = 0o666, *, where: str,
              create_parents: bool = False, fsync_dir: FsyncDir = _fsync_fd_dir) -> int:
    """``open(2)`` of the regular file ``key`` under ``root``, resolved without
    following links (``O_NOFOLLOW`` on every component).

    Raises:
        UnsafeEntryError: a component or the file is a symlink, or the file is
            a FIFO, socket, device or directory (checked before it is opened,
            so opening a device or a FIFO never blocks or has effects, and
            again on the descriptor).
        FileNotFoundError, FileExistsError (``O_EXCL``), OSError.
    """
    segs = parts(key, where=where)
    if not segs:
        raise IsADirectoryError(errno.EISDIR, "the root is a directory", root)
    fd = open_dir(root, segs[:-1], where=where, create=create_parents, fsync_dir=fsync_dir)
    name = segs[-1]
    try:
        try:
            st = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                raise
        else:
            if not stat.S_ISREG(st.st_mode):
                raise _refusal(where, key, fd, name, st.st_mode)
        try:
            out = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode,
                          dir_fd=fd)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise _refusal(where, key, fd, name, os.lstat(name, dir_fd=fd).st_mode) from None
        st = os.fstat(out)
        if not stat.S_ISREG(st.st_mode):  # swapped in between the two looks
            os.close(out)
            raise _refusal(where, key, fd, name, st.st_mode)
        os.set_blocking(out, True)
        return out
    finally:
        os.close(fd)


def opener(root: str, key: str, *, where: str, create_parents: bool = False,
           fsync_dir: FsyncDir = _fsync_fd_dir) -> Callable[[str, int], int]:
    """An ``opener`` for :func:`open` that resolves ``key`` as :func:`open_file`."""
    def _open(_path: str, flags: int) -> int:
        return open_file(root, key, flags, where=where, create_parents=create_parents,
                         fsync_dir=fsync_dir)
    return _open


def checked_path(root: str, key: str, *, where: str) -> str:
    """The filesystem path of ``key`` after checking each component: no link,
    no special file on the way or at the end (a missing end is fine). For
    callers that must hand a path to a library (torch DCP, ``copy_file_range``
    by path); prefer :func:`open_file`.

    Raises:
        UnsafeEntryError: a link or special file on the way or at the end.
    """
    segs = parts(key, where=where)
    path = os.path.join(root, *segs)
    try:
        entry_stat(root, key, where=where)
    except (FileNotFoundError, NotADirectoryError):
        pass
    return path


def scan(root: str, key: str, *, where: str, skipped: Callable[[str], None] | None = None,
         ) -> Iterator[tuple[str, bool, os.stat_result]]:
    """The entries of the directory ``key``: ``(name, is_dir, lstat)`` of
    regular files and directories; links and special files are skipped, each
    with a message to ``skipped`` (default: a warning on the
    ``registry.store`` logger). Raises FileNotFoundError when ``key`` is
    missing."""
    fd = open_dir(root, parts(key, where=where), where=where)
    try:
        with os.scandir(fd) as it:
            entries = list(it)
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                yield e.name, stat.S_ISDIR(st.st_mode), st
                continue
            shown = f"{key}/{e.name}" if key else e.name
            why = str(_refusal(where, shown, fd, e.name, st.st_mode))
            if skipped is not None:
                skipped(why)
            else:
                log.warning("skipped %s", why)
    finally:
        os.close(fd)


def walk(root: str, key: str, *, where: str, skipped: Callable[[str], None] | None = None,
         ) -> dict[str, os.stat_result]:
    """Every regular file under the directory ``key``: relative POSIX path ->
    lstat. Links (to files or folders) and special files are skipped with a
    warning; no link is followed. Raises FileNotFoundError when ``key`` is
    missing."""
    out: dict[str, os.stat_result] = {}

    def visit(rel: str) -> None:
        here = f"{key}/{rel}" if key and rel else (key or rel)
        try:
            found = list(scan(root, here, where=where, skipped=skipped))
        except FileNotFoundError:
            if not rel:
                raise
            return  # removed meanwhile
        for name, is_dir, st in found:
            sub = f"{rel}/{name}" if rel else name
            if is_dir:
                visit(sub)
            else:
                out[sub] = st

    visit("")
    return out


def unlink(root: str, key: str, *, where: str) -> None:
    """Remove the file (or the link itself) ``key``; a missing one is fine."""
    segs = parts(key, where=where)
    try:
        fd = open_dir(root, segs[:-1], where=where)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        os.unlink(segs[-1], dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def mount_points() -> set[str]:
    """The mount points of this process's mount namespace (Linux
    ``/proc/self/mountinfo``; empty elsewhere)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    out = set()
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            out.add(fields[4].encode().decode("unicode_escape"))
    return out


def remove_tree(root: str, key: str, *, where: str) -> None:
    """Remove ``key`` and everything under it, by descriptors: a link is removed
    as a link (never followed), and a directory on another filesystem or a
    mount point is never entered (UnsafeEntryError names it; what was removed
    before stays removed, nothing under the mount is touched). A missing
    ``key`` is fine; entries vanishing meanwhile (another deleter) too."""
    segs = parts(key, where=where)
    if not segs:
        raise UnsafeEntryError(f"{where}: refusing to remove the root itself", key="")
    try:
        parent = open_dir(root, segs[:-1], where=where)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        dev = os.fstat(parent).st_dev
        mounts = mount_points()
        _remove_entry(parent, segs[-1], dev, mounts, where=where, shown=key)
    finally:
        os.close(parent)


def _remove_entry(parent: int, name: str, dev: int, mounts: set[str], *, where: str,
                  shown: str) -> None:
    try:
        st = os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent)
        return
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # replaced by a link or file meanwhile
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=parent)
            return
        raise
    try:
        st = os.fstat(fd)
        if st.st_dev != dev or _is_mount(fd, mounts):
            raise UnsafeEntryError(f"{where}/{shown}: a mount point (another filesystem); "
                                   "deletion never crosses a mount", key=shown)
        with os.scandir(fd) as it:
            names = [e.name for e in it]
        for child in names:
            _remove_entry(fd, child, dev, mounts, where=where, shown=f"{shown}/{child}")
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent)
    except FileNotFoundError:
        pass


def _is_mount(fd: int, mounts: set[str]) -> bool:
    if not mounts:
        return False
    try:
        return os.readlink(f"/proc/self/fd/{fd}") in mounts
    except OSError:
        return False


__all__ = ["checked_path", "entry_stat", "kind", "lstat", "mount_points", "open_dir",
           "open_file", "opener", "parts", "remove_tree", "scan", "unlink", "walk"]
