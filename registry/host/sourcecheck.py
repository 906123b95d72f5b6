"""A source file must hold still while it is copied (issue 29 item 5).

A release is what its source held at one instant. A file rewritten in place
while publish copies it would otherwise be released as a mix of old and new
bytes whose digest is the mix's own, and verify forever after. So each
file's state is taken before its copy and compared after it:

* **local**: size, ``mtime_ns``, ``ctime_ns``, device and inode of the open
  descriptor before and after, the inode now at the path (a file replaced by
  rename), and the number of bytes copied against the size;
* **S3**: the object's ETag and VersionId before and after (a HEAD each),
  and the bytes read against every whole-object value the server keeps and
  this host can recompute (issue 47): ``x-amz-checksum-sha256``, ``-sha1``,
  ``-crc32`` (``-crc32c`` and ``-crc64nvme`` where awscrt is installed), and
  the ETag where it is the MD5 of the bytes (one PUT, no KMS or customer-key
  encryption). A proxy or a link that flips a byte on the way is caught by
  any of them. Where the server keeps none of these (a multipart upload
  without full-object checksums), the caller reads the object a second time
  and compares (registry.release.source_check.verify_object) and reports
  which means it used; a fault that returns the same wrong bytes to both
  reads is then the one thing not seen.

Any difference is SourceChangedError naming the file and what changed; the
copy runs inside a :class:`registry.protocol.commit.DirectoryWriter`, so nothing is
committed. Limits: a rewrite that restores size and both timestamps to the
nanosecond (only a process with the rights to set ctime, i.e. the clock) is
not seen; a filesystem with coarse timestamps (FAT: 2 s) sees a same-size
rewrite within one tick only through the descriptor's inode and size.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import os
import re
import zlib
from collections.abc import Callable
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


#: The whole-object checksums an S3 HEAD (``ChecksumMode=ENABLED``) may carry,
#: and the name each is compared under.
CHECKSUM_FIELDS = {"ChecksumSHA256": "sha256", "ChecksumSHA1": "sha1",
                   "ChecksumCRC32": "crc32", "ChecksumCRC32C": "crc32c",
                   "ChecksumCRC64NVME": "crc64nvme"}


class _Crc:
    """A running CRC with hashlib's ``update``/``digest`` (``width`` bytes, big-endian,
    as S3 sends it base64-encoded)."""

    def __init__(self, fn: Callable[[bytes, int], int], width: int) -> None:
        self._fn, self._width, self._value = fn, width, 0

    def update(self, data: bytes | memoryview) -> None:
        self._value = self._fn(bytes(data), self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._width, "big")


def _crt(name: str) -> Callable[[bytes, int], int] | None:
    """awscrt's CRC ``name`` when awscrt is installed (boto3[crt]), else None."""
    try:
        checksums = importlib.import_module("awscrt.checksums")
    except ImportError:
        return None
    return getattr(checksums, name, None)


def _hasher(alg: str) -> Any:
    """A new hasher for ``alg``, or None where this host cannot compute it."""
    if alg in ("sha256", "sha1", "md5"):
        return hashlib.new(alg)
    if alg == "crc32":
        return _Crc(zlib.crc32, 4)
    fn = _crt(alg)
    return _Crc(fn, 8 if alg == "crc64nvme" else 4) if fn is not None else None


@dataclass(frozen=True, slots=True)
class ObjectState:
    """What is compared of an S3 object (see module docstring).

    Attributes:
        etag, version: the ETag and VersionId (None where the server keeps none).
        sums: ``(algorithm, expected)`` for each whole-object value this host can
            recompute from the bytes read: the server's full-object checksums
            (base64, as sent) and, for an object stored in one PUT without
            KMS or customer-key encryption, its ETag as the MD5 (hex).
        offered: every checksum the server named, computable here or not.
    """

    etag: str | None
    version: str | None
    sums: tuple[tuple[str, str], ...] = ()
    offered: tuple[str, ...] = ()

    @property
    def sha256(self) -> str | None:
        """The server's whole-object SHA-256 as hex, or None."""
        raw = dict(self.sums).get("sha256")
        return base64.b64decode(raw).hex() if raw is not None else None


def object_state(head: dict[str, Any]) -> ObjectState:
    """The compared fields of an S3 HEAD answer (see :class:`ObjectState`).

    A composite checksum (``<b64>-<parts>``, ``ChecksumType: COMPOSITE``) is a
    checksum of part checksums: it is named in ``offered`` but not compared,
    as is a multipart ETag (``<md5>-<parts>``) and the ETag of an object
    encrypted with KMS or a customer key (not an MD5 of its bytes)."""
    sums: list[tuple[str, str]] = []
    offered: list[str] = []
    composite = head.get("ChecksumType") == "COMPOSITE"
    for field_name, alg in CHECKSUM_FIELDS.items():
        raw = head.get(field_name)
        if not isinstance(raw, str) or not raw:
            continue
        offered.append(alg)
        if composite or "-" in raw or _hasher(alg) is None:
            continue
        try:
            base64.b64decode(raw, validate=True)
        except ValueError:
            continue
        sums.append((alg, raw))
    etag = head.get("ETag")
    md5 = etag.strip('"').lower() if isinstance(etag, str) else ""
    encrypted = (str(head.get("ServerSideEncryption") or "").startswith("aws:kms")
                 or head.get("SSECustomerAlgorithm"))
    if re.fullmatch(r"[0-9a-f]{32}", md5) and not encrypted:
        sums.append(("md5", md5))
    return ObjectState(etag, head.get("VersionId"), tuple(sums), tuple(offered))


class SourceHashes:
    """Running hashes of the bytes read from an object, one per value of
    ``state.sums`` (feed every byte in order with :meth:`update`)."""

    def __init__(self, state: ObjectState | None) -> None:
        self._h = {alg: _hasher(alg) for alg, _ in (state.sums if state else ())}

    def update(self, data: bytes | memoryview) -> None:
        for h in self._h.values():
            h.update(data)

    def value(self, alg: str) -> str:
        """The value as the server writes it: MD5 as hex, the others base64."""
        digest = self._h[alg].digest()
        return digest.hex() if alg == "md5" else base64.b64encode(digest).decode()


def check_object(where: str, before: ObjectState, after: ObjectState,
                 hashes: SourceHashes) -> list[str]:
    """Compare an object's state before and after it was read, and the bytes
    read (``hashes``) with every value the server keeps of it.

    Returns:
        The algorithms compared (empty: the server offers none this host can
        recompute; the caller then reads twice, registry.release.source_check).

    Raises:
        SourceChangedError: the object changed between the two HEADs, or the
            bytes read are not the object the server holds (altered on the
            way); nothing may be committed.
    """
    changed = [f"{k} {getattr(before, k)} -> {getattr(after, k)}" for k in ("etag", "version")
               if getattr(before, k) != getattr(after, k)]
    if changed:
        raise SourceChangedError(f"{where}: changed while it was copied ({', '.join(changed)}); "
                                 "nothing was committed", key=where)
    for alg, expected in before.sums:
        actual = hashes.value(alg)
        if actual != expected:
            what = "ETag (MD5)" if alg == "md5" else f"x-amz-checksum-{alg}"
            raise SourceChangedError(f"{where}: the bytes read ({alg} {actual}) are not the "
                                     f"object the server holds ({what} {expected}): altered "
                                     "on the way; nothing was committed", key=where)
    return [alg for alg, _ in before.sums]


__all__ = ["CHECKSUM_FIELDS", "LocalState", "ObjectState", "SourceHashes", "check_local",
           "check_object", "object_state"]
