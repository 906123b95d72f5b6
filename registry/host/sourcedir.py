"""The confinement rule of a source directory: what publish may read (issue 29 item 2).

A model directory handed to ``registry publish`` (or committed by
:func:`registry.protocol.commit.commit_local_directory`) is read as the files it holds.
Symbolic links in it are allowed where they stay inside it, and refused where
they leave it (docs/confinement.md):

* The **boundary** is the source directory itself, resolved once
  (``os.path.realpath``: the directory may be reached through links of the
  operator's own). For a Hugging Face cache snapshot
  (``<cache>/models--org--name/snapshots/<revision>``, beside a
  ``<cache>/models--org--name/blobs`` folder) the repository's ``blobs/``
  folder is inside the boundary too: every file of a snapshot is a link
  ``../../blobs/<digest>``.
* A link whose fully resolved target lies inside the boundary is read as the
  file or folder it names. A link whose target lies outside is refused
  (UnsafeEntryError naming the link, what it says, and where it leads),
  unless ``follow_symlinks`` is given: then it is followed and reported to
  ``followed(link, target)``.
* Links are resolved when the directory is listed and again when each file
  is opened (``O_NOFOLLOW`` on the resolved path, whose device and inode must
  be the listed ones), so a link retargeted in between is refused too.
* A hardlink is the file itself (one inode, no name is "the" inside one);
  Linux's ``fs.protected_hardlinks`` keeps another user from linking a file
  they cannot write. FIFOs, sockets and devices are refused wherever they are.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from registry.errors import ObjectNotFoundError, UnsafeEntryError

#: called with (the link's path, the path it resolves to) for each link
#: followed out of the boundary.
Followed = Callable[[str, str], None]


def boundaries(root: str | os.PathLike[str]) -> tuple[str, ...]:
    """The resolved folders links under ``root`` may lead into: ``root``
    itself, plus ``<repo>/blobs`` for a Hugging Face cache snapshot
    ``<repo>/snapshots/<revision>`` (module docstring)."""
    real = os.path.realpath(root)
    out = [real]
    snapshots = os.path.dirname(real)
    repo = os.path.dirname(snapshots)
    if os.path.basename(snapshots) == "snapshots" and os.path.isdir(os.path.join(repo, "blobs")):
        out.append(os.path.realpath(os.path.join(repo, "blobs")))
    return tuple(out)


def inside(path: str, bounds: tuple[str, ...]) -> bool:
    """``path`` (resolved) is one of ``bounds`` or below one."""
    return any(path == b or path.startswith(b.rstrip(os.sep) + os.sep) for b in bounds)


@dataclass(frozen=True, slots=True)
class SourceRule:
    """How one source directory's links are treated (module docstring)."""

    root: str
    follow_symlinks: bool = False
    followed: Followed | None = None

    @property
    def bounds(self) -> tuple[str, ...]:
        return boundaries(self.root)

    def check(self, path: str, bounds: tuple[str, ...] | None = None) -> str:
        """The resolved path of the entry ``path`` (under :attr:`root`), after
        the rule: a link leaving the boundary is refused or, with
        ``follow_symlinks``, reported. Raises UnsafeEntryError,
        ObjectNotFoundError (a link to nowhere)."""
        real = os.path.realpath(path)
        if not os.path.lexists(real):
            raise ObjectNotFoundError(f"{path}: not found (a symlink to nowhere?)", key=path)
        if inside(real, bounds or self.bounds):
            return real
        link = _first_link(self.root, path)
        said = os.readlink(link) if link and os.path.islink(link) else real
        if not self.follow_symlinks:
            raise UnsafeEntryError(
                f"{link or path}: a symbolic link to {said} ({real}), outside the source "
                f"directory {os.path.realpath(self.root)}; links are read only where they "
                "stay inside it (--follow-symlinks reads it anyway)", key=path)
        if self.followed is not None:
            self.followed(link or path, real)
        return real


def _first_link(root: str, path: str) -> str | None:
    """The first symbolic link on the way from ``root`` down to ``path``."""
    rel = os.path.relpath(path, root)
    here = root
    for seg in rel.split(os.sep):
        here = os.path.join(here, seg)
        if os.path.islink(here):
            return here
    return None


def open_source_file(rule: SourceRule, path: str, *, expect: os.stat_result | None = None,
                     ) -> int:
    """A read descriptor of the regular file ``path`` under ``rule.root``, by
    its resolved path with ``O_NOFOLLOW``; ``expect`` (the listing's stat):
    the descriptor must be the same device and inode, else the entry changed
    under the reader (UnsafeEntryError).

    Raises:
        UnsafeEntryError: a link leaving the boundary (see SourceRule.check),
            a FIFO, socket or device, a file swapped since ``expect``.
        ObjectNotFoundError: a link to nowhere.
    """
    real = rule.check(path)
    st = os.lstat(real)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeEntryError(f"{path}: not a regular file (a FIFO, socket or device cannot "
                               "be part of a model directory)", key=path)
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        got = os.fstat(fd)
        if not stat.S_ISREG(got.st_mode) or (expect is not None and (
                got.st_dev, got.st_ino) != (expect.st_dev, expect.st_ino)):
            raise UnsafeEntryError(f"{path}: replaced while the source directory was read "
                                   "(another file is there now); nothing was committed",
                                   key=path)
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


__all__ = ["Followed", "SourceRule", "boundaries", "inside", "open_source_file"]
