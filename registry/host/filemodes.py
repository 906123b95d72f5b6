"""Files the registry trusts on a host must be writable only by their owner.

A serving host's trust material (``--trusted-key`` files, the keys and CA
folders, their ``revoked.json``) decides which releases it places. Another
local user who can write any of them can add a key of their own, or un-revoke
a revoked one, and then sign whatever they like. So, as ``ssh`` refuses an
``authorized_keys`` another user could rewrite (StrictModes), the registry
refuses to use such a file or folder at all (issue 30, item 8):

- it must be owned by the user running the registry, or by root;
- it must not be writable by group or other;
- the folder holding it may be writable by others only with the sticky bit
  (``/tmp``-like: others cannot replace a file they do not own).

Symbolic links are followed (a Kubernetes secret volume is links to a
root-owned ``..data`` folder); the checks apply to what they name, and to each
link on the way: a link must be owned by this user or root and sit in a folder
the rules above allow (else another user could re-point it at any file).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from registry.errors import UnsafeFileModeError

__all__ = ["check_trusted_path"]


def _owner_ok(st: os.stat_result) -> bool:
    return st.st_uid in (os.geteuid(), 0)


def check_trusted_path(path: str | os.PathLike[str], what: str) -> None:
    """Refuse ``path`` (a file or folder of trust material) unless only its
    owner -- this user or root -- can change it, nor replace it in its folder.

    Args:
        path: an existing file or folder.
        what: what it is, for the message (``"trusted key"``).

    Raises:
        UnsafeFileModeError: owned by another user, writable by group or
            other, or in a folder others can write without the sticky bit
            (for each symbolic link on the way too);
            one line naming the path, the owner or mode, and the fix.
        FileNotFoundError: ``path`` does not exist.
    """
    p = Path(path)
    st = p.stat()
    _check_links(p, what)
    if not _owner_ok(st):
        raise UnsafeFileModeError(f"{p}: the {what} is owned by uid {st.st_uid}, not by this "
                                  "user or root; refusing to trust it")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        who = "group and other users" if mode & 0o022 == 0o022 else (
            "other users" if mode & 0o002 else "its group")
        raise UnsafeFileModeError(f"{p}: the {what} is writable by {who} (mode {mode:04o}); "
                                  f"refusing to trust it (chmod go-w {p})")
    _check_folder(p, p.resolve().parent, what)


def _check_folder(p: Path, parent: Path, what: str) -> None:
    pst = parent.stat()
    if (stat.S_IMODE(pst.st_mode) & 0o022 and not pst.st_mode & stat.S_ISVTX) \
            or not _owner_ok(pst):
        raise UnsafeFileModeError(f"{p}: the {what} is in {parent}, which another user can "
                                  f"write (mode {stat.S_IMODE(pst.st_mode):04o}, uid "
                                  f"{pst.st_uid}); refusing to trust it")


def _check_links(p: Path, what: str) -> None:
    """Each symbolic link from ``p`` to its target: owned by this user or root,
    in a folder only they can change entries of (p.stat() already bounded the
    chain: the kernel refuses a loop)."""
    cur = Path(os.path.abspath(p))
    while cur.is_symlink():
        lst = cur.lstat()
        if not _owner_ok(lst):
            raise UnsafeFileModeError(f"{p}: the {what} is a link ({cur}) owned by uid "
                                      f"{lst.st_uid}, not by this user or root; refusing "
                                      "to trust it")
        _check_folder(p, cur.parent, what)
        cur = Path(os.path.abspath(cur.parent / os.readlink(cur)))
