"""Copying one source file into a release being written, hashed as written and
checked against the source (its manifest, or an S3 object's own checksums) before
anything is committed (split from :mod:`registry.release.model_release`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from registry.protocol.commit import DirectoryWriter
from registry.errors import IntegrityError
from registry.release.source_check import object_before, verify_object
from registry.host.sourcecheck import SourceHashes
from registry.store import Store


def copy_file(src_store: Store, key: str, w: DirectoryWriter, relpath: str,
          digests: Mapping[str, str] | None = None,
          checks: dict[str, str] | None = None) -> None:
    """Copy one source file in (hashed as written); with ``digests`` (the
    source manifest), the copy's sha256 must be the source's; from S3 without
    a manifest, the bytes read must be what the server holds by every means
    it offers (registry.release.source_check.verify_object; the means go to
    ``checks[relpath]``).

    Raises:
        IntegrityError: the bytes read differ from the source manifest.
        SourceChangedError: the source changed while read, or was altered on the way.
    """
    local = src_store.local_path(key)
    if local is not None:
        w.put_file(relpath, local)  # checked before and after: registry.host.sourcecheck
    else:
        before = object_before(src_store, key)  # S3: ETag, version, checksums
        hashes = SourceHashes(before)
        with src_store.open_read(key) as f, \
                w.open(relpath, size=src_store.info(key).size) as out:
            _pump(f, _Tee(out, hashes))
        if before is not None:  # inside the writer: nothing committed
            means = verify_object(src_store, key, before, hashes, w.entries[relpath].sha256)
            if checks is not None:
                checks[relpath] = means
    expected = (digests or {}).get(relpath)
    entry = w.entries[relpath]
    if expected is not None and entry.sha256 != expected:
        raise IntegrityError(src_store.url_of(key), expected_sha256=expected,
                             actual_sha256=entry.sha256, actual_size=entry.size,
                             reason=f"the bytes read differ from the source manifest (sha256 "
                                    f"{entry.sha256}, expected {expected}); nothing was "
                                    "committed")


class _Tee:
    """Writes to ``out``, each block also fed to ``hashes``: the bytes
    compared with the server's values are the bytes written."""

    def __init__(self, out: Any, hashes: SourceHashes) -> None:
        self._out, self._hashes = out, hashes

    def write(self, block: bytes) -> int:
        self._hashes.update(block)
        return self._out.write(block)  # type: ignore[no-any-return]


def _pump(f: IO[bytes], out: Any) -> None:
    while block := f.read(8 * 1024 * 1024):
        out.write(block)
