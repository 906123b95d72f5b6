"""Stat stamps: telling, without reading a byte, whether a file changed since it was checked.

A stamp is ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)`` taken right
after the file's bytes were verified. Any write, truncation, replacement
(rename over it, a new inode), ``chmod`` or ``utime`` changes at least one of
them: ``utime`` can put back an old mtime but not an old ctime, which the
kernel sets to the current time on every change of the inode. What a stamp
misses: writes to the block device underneath, a clock set back to the
instant of the stamp, and bit rot. A stamp that differs is never trusted: the
file is re-hashed (``registry.pull.materialize``).

Stamps are kept in the cache, never in the model directory (which holds only
the release's files and MANIFEST.json):

    <cache>/stamps/blobs/<hex>          the stamp of blobs/sha256/<hex>
    <cache>/stamps/dirs/<sha256 of the target's absolute path>.json
                                        {"target", "manifest_sha256", "files": {path: stamp}}

Records are written to a unique temp name and renamed into place, so
concurrent pulls never read a torn record; a record that cannot be parsed is
treated as absent (the files are re-hashed), and so is one another user could
have written (registry.pull.privacy).
"""

from __future__ import annotations

from registry.rules import numbers, schemas

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

from registry.pull import privacy

Stamp = tuple[int, int, int, int, int]


def stamp(path: str | os.PathLike[str]) -> Stamp:
    """The stamp of ``path`` (raises OSError when it cannot be stat'ed)."""
    st = os.stat(path, follow_symlinks=False)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _write_atomic(path: Path, data: bytes, group: int | None = None) -> None:
    """Write ``data`` under a unique temp name (private: registry.pull.privacy)
    and rename it onto ``path``."""
    privacy.make_private_dir(path.parent, group)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    privacy.write_private(tmp, data, group)
    os.replace(tmp, path)


def _load(path: str | os.PathLike[str], group: int | None) -> Any:
    """A stamp record's JSON, only when this user alone could have written it
    (else OSError: treated as absent, the files re-hashed)."""
    if not privacy.usable(Path(path), group):
        raise PermissionError(f"{path}: not a private record of this cache")
    return schemas.load_local_json(path)


class Stamps:
    """The stamp records of one cache (``root`` = ``<cache>/stamps``)."""

    def __init__(self, root: Path, group: int | None = None) -> None:
        self.root = root
        self.group = group
        self.blobs = root / "blobs"
        self.dirs = root / "dirs"

    # -- blobs ------------------------------------------------------------------------

    def record_blob(self, blob: Path) -> None:
        """Record the stamp of a blob whose bytes were just verified."""
        _write_atomic(self.blobs / blob.name, numbers.dumps(stamp(blob)).encode(),
                      self.group)

    def blob_unchanged(self, blob: Path) -> bool:
        """The blob's stamp equals the one recorded when it was verified."""
        try:
            recorded = tuple(_load(self.blobs / blob.name, self.group))
            return recorded == stamp(blob)
        except (OSError, ValueError, TypeError):
            return False

    def forget_blob(self, sha256: str) -> None:
        (self.blobs / sha256).unlink(missing_ok=True)

    # -- materialized directories ------------------------------------------------------

    def _dir_record(self, target: Path) -> Path:
        key = hashlib.sha256(os.fsencode(str(target))).hexdigest()
        return self.dirs / f"{key}.json"

    def record_dir(self, target: Path, manifest_sha256: str, paths: list[str], *,
                   blake3_only: list[str] | tuple[str, ...] = ()) -> None:
        """Record the stamps of ``paths`` (relative, POSIX) under ``target``,
        whose bytes were just placed or verified; ``blake3_only``: those of
        them checked by their BLAKE3 and not their sha256
        (registry.protocol.fastdigest), which a pull that must check sha256 re-hashes."""
        files = {p: list(stamp(target / p)) for p in paths}
        doc = {"target": str(target), "manifest_sha256": manifest_sha256, "files": files,
               "blake3_only": sorted(blake3_only)}
        _write_atomic(self._dir_record(target), numbers.dumps(doc).encode(), self.group)

    def blake3_only(self, target: Path, manifest_sha256: str) -> set[str]:
        """The files of ``target``'s record checked by BLAKE3 only."""
        try:
            doc = _load(self._dir_record(target), self.group)
            if doc.get("manifest_sha256") != manifest_sha256:
                return set()
            return set(doc.get("blake3_only", []))
        except (OSError, ValueError, TypeError, AttributeError):
            return set()

    def dir_stamps(self, target: Path, manifest_sha256: str) -> dict[str, Stamp]:
        """The recorded stamps of ``target`` for this manifest ({} when none)."""
        try:
            doc = _load(self._dir_record(target), self.group)
            if doc.get("target") != str(target) or \
                    doc.get("manifest_sha256") != manifest_sha256:
                return {}
            return {p: tuple(s) for p, s in doc["files"].items()}  # type: ignore[misc]
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}

    def forget_dir(self, target: Path) -> None:
        self._dir_record(target).unlink(missing_ok=True)

    def placed_digests(self) -> dict[str, str]:
        """Every directory record: target path -> the manifest sha256 placed
        there last (unreadable records are skipped)."""
        out: dict[str, str] = {}
        try:
            entries = list(os.scandir(self.dirs))
        except FileNotFoundError:
            return out
        for entry in entries:
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            try:
                doc = _load(entry.path, self.group)
                out[str(doc["target"])] = str(doc["manifest_sha256"])
            except (OSError, ValueError, TypeError, KeyError):
                continue
        return out


__all__ = ["Stamp", "Stamps", "stamp"]
