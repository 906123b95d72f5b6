"""A source file must hold still while it is copied (issue 29 item 5).

A release is what its source held at one instant. A file rewritten in place
while publish copies it would otherwise be released as a mix of old and new
bytes whose digest is the mix's own, and verify forever after. So each
file's state is taken before its copy and compared after it:

* **local**: size, ``mtime_ns``, ``ctime_ns``, device and inode of the open
  descriptor before and after, the inode now at the path (a file replaced by
  rename), and the number of bytes copied against the size;
* **S3**: the object's ETag and VersionId before and after (a HEAD each),
  and, where the server keeps a SHA-256 of the whole object
  (``x-amz-checksum-sha256``), that digest against the sha256 of the bytes
  copied (a proxy or a link that flips a byte on the way is caught too).

Any difference is SourceChangedError naming the file and what changed; the
copy runs inside a :class:`registry.commit.DirectoryWriter`, so nothing is
committed. Limits: a rewrite that restores size and both timestamps to the
nanosecond (only a process with the rights to set ctime, i.e. the clock) is
not seen; a filesystem with coarse timestamps (FAT: 2 s) sees a same-size
rewrite within one tick only through the descriptor's inode and size.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from typing import Any

from registry.errors import SourceChangedError


@dataclass(frozen=True, slots=True)
class LocalState:
    """What is compared of a local file (see module docstring)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    dev: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> LocalState:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino)


def check_local(path: str, before: LocalState, fd: int, copied: int) -> None:
    """Raise SourceChangedError unless the file open as ``fd`` (and the file
    now at ``path``) is still ``before`` and ``copied`` bytes were its size."""
    after = LocalState.of(os.fstat(fd))
    changed = [f"{name} {getattr(before, name)} -> {getattr(after, name)}"
               for name in ("size", "mtime_ns", "ctime_ns")
               if getattr(before, name) != getattr(after, name)]
    try:
        now = LocalState.of(os.stat(path))
        if (now.dev, now.ino) != (before.dev, before.ino):
            changed.append(f"replaced (inode {before.ino} -> {now.ino})")
    except FileNotFoundError:
        changed.append("removed")
    if copied != before.size and not any(c.startswith("size") for c in changed):
        changed.append(f"{copied} bytes read of {before.size}")
    if changed:
        raise SourceChangedError(f"{path}: changed while it was copied ({', '.join(changed)}); "
                                 "nothing was committed: publish again once it is written",
                                 key=path)


def object_state(head: dict[str, Any]) -> dict[str, str | None]:
    """The compared fields of an S3 HEAD answer: ETag, VersionId and the
    whole-object SHA-256 (hex; None where the server keeps none, or keeps
    only a composite of part checksums, ``<b64>-<parts>``)."""
    raw = head.get("ChecksumSHA256")
    sha = None
    if isinstance(raw, str) and "-" not in raw and head.get("ChecksumType") != "COMPOSITE":
        try:
            sha = base64.b64decode(raw, validate=True).hex()
        except ValueError:
            sha = None
    return {"etag": head.get("ETag"), "version": head.get("VersionId"), "sha256": sha}


def check_object(where: str, before: dict[str, str | None], after: dict[str, str | None],
                 sha256: str) -> None:
    """Raise SourceChangedError when the object changed between the two HEADs,
    or when the bytes copied (``sha256``) are not the server's checksum."""
    changed = [f"{k} {before[k]} -> {after[k]}" for k in ("etag", "version")
               if before[k] != after[k]]
    if changed:
        raise SourceChangedError(f"{where}: changed while it was copied ({', '.join(changed)}); "
                                 "nothing was committed", key=where)
    if before["sha256"] is not None and before["sha256"] != sha256:
        raise SourceChangedError(f"{where}: the bytes read (sha256 {sha256}) are not the object "
                                 f"the server holds (x-amz-checksum-sha256 {before['sha256']}): "
                                 "altered on the way; nothing was committed", key=where)


__all__ = ["LocalState", "check_local", "check_object", "object_state"]
