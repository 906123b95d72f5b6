"""The weights of a manifest, as the reader plans them: which files, which
tensors where, read through :func:`registry.formats.weights.load_weights` (the one
set of rules for a model directory's weights).

Headers are read *provisionally* with small ranged reads, so that every
shard's plan is known before the first piece is fetched; the reader checks
the header bytes again inside the verified read of the pieces that hold them
(:mod:`registry.load.reader`) before any tensor is handed out, so a header
that changed between the two reads is refused. The index
(``model.safetensors.index.json``) is small: it is read whole and checked
against its sha256 before it is parsed.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import IO, Any

from registry.errors import DocumentError, IntegrityError
from registry.protocol.manifest import FileEntry, Manifest
from registry.store import Store, join
from registry.formats.weights import ModelWeights, is_weights_name, load_weights

#: bytes read ahead by a provisional header read (most headers fit).
HEADER_PROBE = 64 * 1024


class _RangeFile(io.RawIOBase):
    """A seekable reader of one object through small ranged reads."""

    def __init__(self, store: Store, key: str, size: int) -> None:
        self.store, self.key, self.size, self.pos = store, key, size, 0
        self._buf, self._buf_at = b"", 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else (self.pos + offset if whence == 1 else
                                               self.size + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        if not (self._buf_at <= self.pos and end <= self._buf_at + len(self._buf)):
            fetch_end = min(self.size, max(end, self.pos + HEADER_PROBE))
            self._buf = b"".join(self.store.iter_range(self.key, self.pos, fetch_end))
            self._buf_at = self.pos
        out = self._buf[self.pos - self._buf_at:end - self._buf_at]
        self.pos += len(out)
        return out


class _Planning:
    """What :func:`load_weights` needs of a store, answered from a manifest:
    sizes from the manifest, the index checked against its sha256, headers
    through small ranged reads."""

    def __init__(self, store: Store, prefix: str, entries: dict[str, FileEntry]) -> None:
        self.store, self.prefix, self.entries = store, prefix, entries

    def url_of(self, key: str) -> str:
        return self.store.url_of(key)

    def read_bytes(self, key: str, *, limit: int | None = None) -> bytes:
        rel = key[len(self.prefix) + 1:] if self.prefix else key
        entry = self.entries[rel]
        data = self.store.read_bytes(key, limit=max(entry.size, limit or 0))
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != entry.size or digest != entry.sha256:
            raise IntegrityError(entry.path, expected_size=entry.size, actual_size=len(data),
                                 expected_sha256=entry.sha256, actual_sha256=digest)
        return data

    def open_read(self, key: str) -> IO[bytes]:
        rel = key[len(self.prefix) + 1:] if self.prefix else key
        return _RangeFile(self.store, key, self.entries[rel].size)  # type: ignore[return-value]


def plan_weights(store: Store, prefix: str, manifest: Manifest, *,
                 where: str) -> ModelWeights:
    """The checked weights of the directory whose manifest is ``manifest``.

    Raises:
        DocumentError, SafetensorsError: the weights break a rule of
            :mod:`registry.formats.weights` (named file and rule).
        IntegrityError: the index's bytes differ from the manifest.
        StorageError: the store fails.
    """
    entries = {e.path: e for e in manifest.files}
    files = {path: e.size for path, e in entries.items()}
    return load_weights(_Planning(store, prefix, entries), prefix,  # type: ignore[arg-type]
                        files=files, where=where)


def config_document(store: Store, prefix: str, manifest: Manifest) -> dict[str, Any] | None:
    """The directory's ``config.json``, verified against its sha256, or None."""
    entries = {e.path: e for e in manifest.files}
    if "config.json" not in entries:
        return None
    import json

    data = _Planning(store, prefix, entries).read_bytes(join(prefix, "config.json"))
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DocumentError(f"{store.url_of(prefix)}/config.json", f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise DocumentError(f"{store.url_of(prefix)}/config.json", "must be a JSON object")
    return doc


def write_small_files(reader: Any, folder: Path) -> None:
    """Every file of the reader's directory but the weights and ``model.sig``,
    each checked against its sha256, written under ``folder`` (config,
    tokenizer, card: what an engine reads from a folder)."""
    entries = {e.path: e for e in reader.manifest.files}
    planning = _Planning(reader.store, reader.prefix, entries)
    for path in entries:
        if is_weights_name(path.rsplit("/", 1)[-1]) or path == "model.sig":
            continue
        data = planning.read_bytes(join(reader.prefix, path))
        dest = folder / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)


__all__ = ["config_document", "plan_weights", "write_small_files"]
