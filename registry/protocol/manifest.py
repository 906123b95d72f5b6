"""Manifests: the list of every file of a committed directory, with size and sha256.

``MANIFEST.json`` is the commit marker of a directory (DESIGN sections 3 and 4).
It is serialized canonically (sorted keys, no insignificant whitespace, UTF-8,
one trailing newline), so its sha256 -- the *manifest digest* -- identifies the
directory's content and is what a release records as its source.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

from registry.rules import limits, numbers
from registry.rules import schemas
from registry.protocol.pieces import ChainHasher, Pieces
from registry.host.sourcedir import SourceRule
from registry.errors import (
    DocumentError,
    ManifestError,
    ObjectNotFoundError,
    StorageError,
    UnsafePathError,
    UsageError,
)

MANIFEST = "MANIFEST.json"
FORMAT = "tinyllm-manifest"
FORMAT_VERSION = 1
#: bytes per read when hashing; one reusable buffer, so memory stays flat.
HASH_CHUNK = 4 * 1024 * 1024


def utc_now() -> str:
    """The current time as an RFC 3339 UTC string with microseconds
    (``2026-11-29T13:45:07.123456Z``): releases made in one second still sort."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check_path(path: object, *, source: str) -> str:
    """Return ``path`` if it is a safe relative POSIX path, else raise.

    The rule (DESIGN section 4): a non-empty string, no leading ``/``, no ``..``
    segment, no backslash, no NUL, no empty segment (``a//b``, trailing ``/``),
    no ``.`` segment, and never ``MANIFEST.json`` itself.

    Raises:
        UnsafePathError: naming ``source`` (the manifest) and the rule broken.
    """
    def bad(rule: str) -> UnsafePathError:
        return UnsafePathError(source, f"file path {path!r}: {rule}")

    if not isinstance(path, str) or not path:
        raise bad("must be a non-empty string")
    if "\x00" in path:
        raise bad("contains NUL")
    if "\\" in path:
        raise bad("contains a backslash")
    if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        raise bad("is absolute")
    segments = path.split("/")
    if "" in segments:
        raise bad("has an empty segment")
    if ".." in segments:
        raise bad("has a '..' segment")
    if "." in segments:
        raise bad("has a '.' segment")
    if path == MANIFEST:
        raise bad("MANIFEST.json cannot list itself")
    return path


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a manifest: relative POSIX path, size in bytes, sha256 hex,
    and for a file of more than one piece its piece states (registry.protocol.pieces),
    None otherwise or in manifests written before them; ``blake3``: the
    file's BLAKE3 digest (64 hex digits) for files of at least
    ``registry.protocol.fastdigest.MIN_SIZE`` bytes committed since issue 19, which
    a pull from a local store checks instead of the sha256
    (registry.protocol.fastdigest), else None."""

    path: str
    size: int
    sha256: str
    pieces: Pieces | None = None
    blake3: str | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"path": self.path, "size": self.size, "sha256": self.sha256}
        if self.pieces is not None:
            doc["pieces"] = self.pieces.to_dict()
        if self.blake3 is not None:
            doc["blake3"] = self.blake3
        return doc


@dataclass(frozen=True, slots=True)
class Manifest:
    """A parsed, validated ``MANIFEST.json``.

    Attributes:
        kind: ``"checkpoint"`` or ``"release"``.
        files: entries sorted by path, unique, every path safe.
        created_at: RFC 3339 UTC.
        meta: the kind's own fields (``run_id``/``step``; ``model_id``/``version``/
            ``source``) and optional ``layout``.
    """

    kind: str
    files: tuple[FileEntry, ...]
    created_at: str = field(default_factory=utc_now)
    meta: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, kind: str, files: Iterable[FileEntry], **meta: Any) -> Manifest:
        """A new manifest over ``files`` (sorted here), validated like a parsed one.

        Raises:
            UnsafePathError, ManifestError: a path breaks the rules, a path is
                listed twice, or the result breaks ``manifest.schema.json``.
        """
        m = cls(kind, tuple(sorted(files, key=lambda e: e.path)), utc_now(), dict(meta))
        m._check(source="<new manifest>")
        _validate(m.to_dict(), source="<new manifest>")
        return m

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION,
                               "kind": self.kind, "created_at": self.created_at,
                               "files": [e.to_dict() for e in self.files]}
        doc.update(self.meta)
        return doc

    def to_bytes(self) -> bytes:
        """Canonical JSON: sorted keys, compact separators, UTF-8, trailing newline."""
        return (numbers.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False) + "\n").encode()

    @property
    def digest(self) -> str:
        """sha256 hex of :meth:`to_bytes`: the identity of this directory's content."""
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @property
    def total_size(self) -> int:
        """Sum of the listed file sizes, in bytes."""
        return sum(e.size for e in self.files)

    def entry(self, path: str) -> FileEntry | None:
        for e in self.files:
            if e.path == path:
                return e
        return None

    def _check(self, *, source: str) -> None:
        seen: set[str] = set()
        prev = ""
        for e in self.files:
            check_path(e.path, source=source)
            if e.path in seen:
                raise UnsafePathError(source, f"file path {e.path!r}: listed twice")
            if e.path < prev:
                raise ManifestError(source, f"files not sorted by path at {e.path!r}")
            seen.add(e.path)
            prev = e.path
            if e.pieces is not None and not e.pieces.fits(e.size):
                raise ManifestError(source, f"file {e.path!r}: {len(e.pieces.states)} piece "
                                            f"states of {e.pieces.size} bytes do not fit its "
                                            f"{e.size} bytes (a file of n pieces lists n-1)")
        # A file may not also be a directory of another entry ("a" and "a/b").
        for p in seen:
            head = p
            while "/" in head:
                head = head.rsplit("/", 1)[0]
                if head in seen:
                    raise UnsafePathError(source, f"file path {p!r}: {head!r} is listed "
                                                  "as a file")


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _plain_entry(f: Any) -> bool:
    """``f`` surely satisfies ``$defs/file`` of manifest.schema.json (checked
    here, at least as strictly as the schema, in a few microseconds); False
    leaves the verdict, and its message, to the schema."""
    if type(f) is not dict or not 3 <= len(f) <= 5:
        return False
    path, size, sha = f.get("path"), f.get("size"), f.get("sha256")
    if type(path) is not str or not path or type(size) is not int or size < 0:
        return False
    if type(sha) is not str or not _HEX64.fullmatch(sha):
        return False
    extra = len(f) - 3
    b3 = f.get("blake3")
    if b3 is not None:
        extra -= 1
        if type(b3) is not str or not _HEX64.fullmatch(b3):
            return False
    pieces = f.get("pieces")
    if pieces is not None:
        extra -= 1
        if type(pieces) is not dict or set(pieces) != {"size", "states"}:
            return False
        psize, states = pieces["size"], pieces["states"]
        if type(psize) is not int or psize < 64 or psize % 64 or type(states) is not list \
                or not states or not all(type(x) is str and _HEX64.fullmatch(x)
                                         for x in states):
            return False
    return extra == 0


def _validate(doc: Any, *, source: str) -> None:
    """The schema check; file entries the fast check passes are not handed to
    jsonschema (about 1 ms each there: a 45 MB manifest took 6 minutes)."""
    files = doc.get("files") if isinstance(doc, dict) else None
    if isinstance(files, list):
        if len(files) > limits.MAX_MANIFEST_FILES:
            raise ManifestError(source, f"lists {len(files)} files, more than the limit of "
                                        f"{limits.MAX_MANIFEST_FILES} "
                                        "(REGISTRY_MAX_MANIFEST_FILES)")
        kept = [i for i, f in enumerate(files) if not _plain_entry(f)]
        doc = {**doc, "files": [files[i] for i in kept]}
    try:
        schemas.validate(doc, "manifest", path=source)
    except DocumentError as e:
        rule = e.rule
        if isinstance(files, list):  # name the entry by its place in the file, not the list checked
            rule = re.sub(r"^files\[(\d+)\]", lambda m: f"files[{kept[int(m[1])]}]", rule)
        raise ManifestError(source, rule) from None


#: manifests parsed lately, by their bytes (a Manifest is frozen, and the same
#: bytes always parse to the same one): `registry serve` reads a release's
#: manifest on every request, and the schema check is most of that page's time
_PARSED: OrderedDict[bytes, Manifest] = OrderedDict()
_PARSED_MAX = 256
#: larger manifests (checkpoints of thousands of shards) are not kept
_PARSED_MAX_BYTES = 256 << 10
_PARSED_LOCK = threading.Lock()


def parse_manifest(data: bytes, *, source: str) -> Manifest:
    """Parse and validate ``MANIFEST.json`` bytes read from ``source``
    (bytes parsed lately are answered from memory: the result is immutable).

    Raises:
        ManifestError: not UTF-8 JSON, breaks ``manifest.schema.json``, the
            files are not sorted, or it is larger or lists more files than
            :mod:`registry.rules.limits` allows (refused before parsing or validating).
        UnsafePathError: a path is unsafe or listed twice.
    """
    with _PARSED_LOCK:
        hit = _PARSED.get(data)
        if hit is not None:
            _PARSED.move_to_end(data)
            return hit
    m = _parse_manifest(data, source=source)
    if len(data) > _PARSED_MAX_BYTES:
        return m
    with _PARSED_LOCK:
        _PARSED[data] = m
        if len(_PARSED) > _PARSED_MAX:
            _PARSED.popitem(last=False)
    return m


def _parse_manifest(data: bytes, *, source: str) -> Manifest:
    if len(data) > limits.MAX_MANIFEST_BYTES:
        raise ManifestError(source, f"{len(data)} bytes, more than the limit of "
                                    f"{limits.MAX_MANIFEST_BYTES} (REGISTRY_MAX_MANIFEST_BYTES)")
    try:
        doc = schemas.load_json(data, path=source)
    except DocumentError as e:
        raise ManifestError(source, e.rule) from None
    _validate(doc, source=source)
    meta = {k: v for k, v in doc.items()
            if k not in ("format", "format_version", "kind", "created_at", "files")}
    m = Manifest(doc["kind"],
                 tuple(FileEntry(f["path"], f["size"], f["sha256"],
                                 Pieces.from_dict(f["pieces"]) if "pieces" in f else None,
                                 f.get("blake3"))
                       for f in doc["files"]),
                 doc["created_at"], meta)
    m._check(source=source)
    return m


def hash_stream(f: IO[bytes], *, chunk: int = HASH_CHUNK) -> tuple[int, str]:
    """Hash a readable binary stream to its end: ``(size in bytes, sha256 hex)``."""
    h = hashlib.sha256()
    size = 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    readinto = getattr(f, "readinto", None)
    while True:
        if readinto is not None:
            n = readinto(view)
            if not n:
                break
            h.update(view[:n])
        else:
            block = f.read(chunk)
            if not block:
                break
            n = len(block)
            h.update(block)
        size += n
    return size, h.hexdigest()


def hash_file(path: str | os.PathLike[str]) -> tuple[int, str]:
    """``(size, sha256)`` of a local file, read once with a reused buffer."""
    with open(path, "rb", buffering=0) as f:
        return hash_stream(f)  # type: ignore[arg-type]


def hash_entry(path: str | os.PathLike[str], rel: str, *, blake3: bool = False) -> FileEntry:
    """The manifest entry of the local file ``path`` listed as ``rel``: size,
    sha256 and piece states (and with ``blake3`` its BLAKE3,
    registry.protocol.fastdigest), from one read with a reused buffer."""
    h = ChainHasher(blake3=blake3)
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
    return FileEntry(rel, h.size, h.hexdigest(), h.pieces, h.blake3)


def list_local_files(root: str | os.PathLike[str], *,
                     rule: SourceRule | None = None) -> list[str]:
    """Every regular file under ``root`` as sorted relative POSIX paths,
    excluding ``MANIFEST.json`` at the top. Symlinks that stay inside the
    source directory are followed (``rule``, registry.host.sourcedir: default the
    directory's own rule, links leaving it refused).

    Raises:
        ObjectNotFoundError: a symlink points nowhere.
        UnsafeEntryError: a symlink leads out of the directory (registry.host.sourcedir),
            named with its target.
        UsageError: an entry is not a regular file once symlinks are followed
            (a FIFO, a socket, a device): it could block a reader forever or
            never end, so nothing is committed; or a symlinked directory leads
            back to itself or an enclosing directory (a loop), named once.
    """
    rule = rule or SourceRule(os.fspath(root))
    bounds = rule.bounds
    out = []
    for dirpath, dirs, files in os.walk(root, followlinks=True):
        dirs.sort()
        rel = os.path.relpath(dirpath, root)
        _refuse_loops(dirpath, dirs, root)
        for d in dirs:
            if os.path.islink(os.path.join(dirpath, d)):
                rule.check(os.path.join(dirpath, d), bounds)
        for name in files:
            p = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
            if p == MANIFEST:
                continue
            path = os.path.join(dirpath, name)
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                raise ObjectNotFoundError(f"{path}: not found (a symlink to nowhere?)",
                                          key=path) from None
            except OSError as e:
                raise StorageError(f"{path}: {e.strerror or e}", key=path) from None
            if os.path.islink(path):
                rule.check(path, bounds)
            if not stat.S_ISREG(mode):
                raise UsageError(f"{path}: not a regular file (a FIFO, socket or device "
                                 f"cannot be part of a model directory)")
            out.append(p)
    return sorted(out)


def _refuse_loops(dirpath: str, dirs: list[str], root: str | os.PathLike[str]) -> None:
    """Raise UsageError when a symlinked sub-directory of ``dirpath`` resolves to
    ``dirpath`` or one of its ancestors: following it would repeat the same
    folders until the path is too long (``up/model/up/model/...``)."""
    here = os.path.realpath(dirpath)
    for d in dirs:
        link = os.path.join(dirpath, d)
        if not os.path.islink(link):
            continue
        target = os.path.realpath(link)
        if here == target or here.startswith(target.rstrip(os.sep) + os.sep):
            shown = os.path.relpath(link, root).replace(os.sep, "/")
            raise UsageError(f"{os.path.join(os.fspath(root), shown)}: a symlink loop: it "
                             f"points back to {target}, which holds it; a model directory "
                             "cannot contain itself")


def build_manifest(root: str | os.PathLike[str], kind: str, **meta: Any) -> Manifest:
    """Hash every file under the local directory ``root`` into a new Manifest.

    Each file is read exactly once. Raises UnsafePathError for a file name the
    path rules refuse (for example one containing a backslash), and what
    :func:`list_local_files` raises for an entry that is not a regular file.
    """
    entries = []
    for rel in list_local_files(root):
        check_path(rel, source=str(root))
        entries.append(hash_entry(os.path.join(root, *rel.split("/")), rel,
                                  blake3=kind == "release"))
    return Manifest.build(kind, entries, **meta)
