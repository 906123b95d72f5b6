"""The one exception hierarchy of the registry.

Every error a user can cause derives from :class:`RegistryError`. Each class
mixes in the builtin exception a caller would naturally catch (``FileNotFoundError``,
``FileExistsError``, ``ValueError``), and carries the facts as attributes so that
programs never parse messages. ``str(error)`` is one line that names the file (or
object key) and the rule that was broken.

The CLI maps each class to an exit code in one table (``registry.cli.errors``).
"""

from __future__ import annotations

from typing import Any


class RegistryError(Exception):
    """Base class of every error raised by the registry on bad input or state."""


class _Message:
    """Put before an ``OSError`` base: the error reads as its message
    (``OSError.__str__`` would print errno tuples)."""

    def __str__(self) -> str:
        args = self.args  # type: ignore[attr-defined]
        return str(args[0]) if args else ""


class _AtPath(_Message):
    """An error about the directory at ``path``."""

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)  # type: ignore[call-arg]
        self.path = path


# -- storage -----------------------------------------------------------------


class StorageError(_Message, RegistryError, OSError):
    """An operation on the store failed (network, permissions, backend error)."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object or directory does not exist in the store."""


class ObjectExistsError(StorageError, FileExistsError):
    """A conditional create found the object already present."""


class StoragePermissionError(StorageError, PermissionError):
    """The store refused the operation for lack of permission."""


class InsufficientSpaceError(StorageError):
    """The destination has less free space than the operation needs (bytes)."""

    def __init__(self, message: str, *, key: str | None = None, needed: int = 0,
                 available: int = 0) -> None:
        super().__init__(message, key=key)
        self.needed = needed
        self.available = available


class ConditionalWritesUnsupportedError(StorageError):
    """The S3-compatible server ignores ``If-None-Match`` / ``If-Match``: it
    cannot guard commits, claims and pointers against a second writer."""


class UnsafeEntryError(StorageError):
    """An entry of a store, a pull cache, a release or a source directory that
    the registry will not follow or touch: a symbolic link (or one leading out
    of a source directory), a FIFO, socket or device, a mount point, a key with
    ``..``, or a cache file another user owns or can write
    (registry.store.confine)."""


class SourceChangedError(StorageError):
    """A file of the source changed while publish (or a commit) copied it: its
    size, mtime, ctime or inode on disk, or its ETag, version or checksum on
    S3, differs after the copy from before it (registry.host.sourcecheck). Nothing
    was committed: what a release holds is what its source held at one
    instant."""


class InvalidStoreURLError(StorageError, ValueError):
    """The store URL cannot be opened (unknown protocol, missing bucket)."""


# -- names, arguments and documents -------------------------------------------


class UsageError(RegistryError, ValueError):
    """An argument has a value the operation does not accept (unknown dtype,
    layout, duration, an empty reason)."""


class UnsafeFileModeError(UsageError):
    """A file or folder the registry must trust (a host's trusted keys, CAs,
    revocations) can be changed by another local user: owned by them, or
    writable by group or other (:mod:`registry.host.filemodes`). Exit code 2."""


class InvalidNameError(RegistryError, ValueError):
    """A model id, version, run id or alias breaks the naming rule."""

    def __init__(self, message: str, *, name: str = "") -> None:
        super().__init__(message)
        self.name = name


class AmbiguousRefError(InvalidNameError):
    """``model_id@name`` names both a version and an alias (an alias made
    before versions and aliases were kept apart)."""


class DocumentError(RegistryError, ValueError):
    """A JSON document (or a file) is malformed or breaks its schema.

    Attributes:
        path: the file or object the document came from.
        rule: the rule that was broken, in words.
    """

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"{path}: {rule}")
        self.path = path
        self.rule = rule


class SchemaValidationError(DocumentError):
    """A JSON document does not validate against its JSON Schema."""


class ManifestError(DocumentError):
    """``MANIFEST.json`` is missing, not JSON, breaks the schema or the path rules."""


class UnsafePathError(ManifestError):
    """A manifest path is absolute, has ``..``, a backslash, NUL or an empty segment."""


class SafetensorsError(DocumentError):
    """A safetensors file breaks the header rules (DESIGN section 4)."""


# -- integrity and commits -----------------------------------------------------


class IntegrityError(RegistryError):
    """A file differs from its manifest entry (size or sha256).

    Attributes:
        path: the file that differs.
        expected_size, actual_size: sizes in bytes (``actual_size`` is None when
            the file is missing).
        expected_sha256, actual_sha256: hex digests, or None when not compared.
    """

    def __init__(self, path: str, *, expected_size: int | None = None,
                 actual_size: int | None = None, expected_sha256: str | None = None,
                 actual_sha256: str | None = None, reason: str | None = None) -> None:
        self.path = path
        self.expected_size = expected_size
        self.actual_size = actual_size
        self.expected_sha256 = expected_sha256
        self.actual_sha256 = actual_sha256
        if reason is None:
            if actual_size is None:
                reason = "missing"
            elif expected_size is not None and expected_size != actual_size:
                reason = f"size {actual_size} bytes, expected {expected_size}"
            else:
                reason = f"sha256 {actual_sha256}, expected {expected_sha256}"
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class NotCommittedError(_AtPath, RegistryError, FileNotFoundError):
    """The directory has no valid ``MANIFEST.json``: it is not committed."""


class CommitConflictError(_AtPath, RegistryError, FileExistsError):
    """Another writer committed (or claimed) the same directory first."""


class NameTakenError(CommitConflictError):
    """An alias and a version of one model would share a name."""


class VersionExistsError(CommitConflictError):
    """A release with this model id and version already exists; releases are immutable."""


class ReleaseDeletedError(NotCommittedError):
    """The release was deleted (``registry release delete``): its tombstone
    (``ledger/tombstones/<model_id>/<version>.json``) says who, when and why.

    Attributes:
        tombstone: the tombstone document.
    """

    def __init__(self, message: str, *, path: str = "",
                 tombstone: dict[str, Any] | None = None) -> None:
        super().__init__(message, path=path)
        self.tombstone = dict(tombstone or {})


class ReleaseInUseError(CommitConflictError):
    """A release cannot be deleted while an alias points at it.

    Attributes:
        aliases: the aliases that point at it.
    """

    def __init__(self, message: str, *, path: str = "", aliases: tuple[str, ...] = ()) -> None:
        super().__init__(message, path=path)
        self.aliases = aliases


# -- pointers ------------------------------------------------------------------


class PointerError(RegistryError, ValueError):
    """A pointer file (``LATEST``, ``refs/<alias>``, tracker) is empty or garbled,
    points outside its folder, or names an uncommitted directory."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"{path}: {rule}")
        self.path = path
        self.rule = rule


class PointerConflictError(RegistryError):
    """A compare-and-swap on a pointer lost: another writer moved it first."""

    def __init__(self, path: str, *, expected: Any = None, actual: Any = None) -> None:
        super().__init__(f"{path}: changed by another writer (expected {expected!r}, "
                         f"found {actual!r})")
        self.path = path
        self.expected = expected
        self.actual = actual


class PointerRegressionError(PointerConflictError):
    """Moving the pointer would make it go backwards (``LATEST`` only moves forward)."""


# -- releases ------------------------------------------------------------------


class GateFailedError(RegistryError):
    """A release fails one or more gates; ``results`` holds every check
    (``registry.gating.gates.GateResult``), failing or not."""

    def __init__(self, where: str, results: Any) -> None:
        self.where = where
        self.results = tuple(results)
        failed = "; ".join(f"{r.name}: {r.reason}" for r in self.results if not r.passed)
        super().__init__(f"{where}: fails the release gates ({failed})")


class ReleaseYankedError(GateFailedError):
    """A plain pull of a yanked release (``registry yank``), refused unless
    ``allow_yanked`` / ``--allow-yanked``; ``results`` holds the failing
    ``yanked`` gate."""


# -- signatures ------------------------------------------------------------------


class SignatureError(RegistryError):
    """A release's signature (``model.sig``) is missing, malformed, made by a key
    this host does not trust or has revoked, or does not cover exactly the
    release's files, digests, model id and version.

    Attributes:
        path: the release (or signature file) refused.
        fingerprint: sha256 fingerprint of the signing key, when known.
    """

    def __init__(self, path: str, reason: str, *, fingerprint: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.fingerprint = fingerprint
        super().__init__(f"{path}: {reason}")


class SigningUnavailableError(UsageError):
    """A signing option was used but the ``[signing]`` extra (``model-signing``)
    is not installed."""


# -- events ----------------------------------------------------------------------


class EventNotRecordedError(RegistryError):
    """A write committed in the store, but appending its event to ``events/``
    failed (issue 32 item 7). The write stands; ``registry events repair``
    appends the events the store's records imply and the log lacks.

    Attributes:
        event: the event's name (``model_version.created``...).
        cause: the error that stopped the append.
    """

    def __init__(self, what: str, event: str, cause: BaseException) -> None:
        self.event = event
        self.cause = cause
        super().__init__(f"{what} committed, but its event {event!r} was not recorded in "
                         f"events/ ({cause}); run `registry events repair` to append it")


# -- the index ------------------------------------------------------------------


class IndexDatabaseError(RegistryError):
    """The SQL index cannot be reached or refused an operation. The store is the
    source of truth: ``registry index rebuild`` repairs the index from it."""


class UnknownModelError(RegistryError, LookupError):
    """The index has no model of this id (a typo, or a store not indexed yet:
    ``registry index rebuild``).

    Attributes:
        model_id: the id asked for.
        known: the model ids the index holds.
    """

    def __init__(self, message: str, *, model_id: str, known: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.model_id = model_id
        self.path = model_id
        self.known = known


class IndexDamagedError(IndexDatabaseError):
    """The SQLite index file is not a database (overwritten, truncated, another
    file). ``registry index rebuild`` moves it aside and rebuilds it.

    Attributes:
        path: the damaged file.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class IndexReadOnlyError(IndexDatabaseError):
    """A write to an index that is read-only (a read-only file, or a file on a
    read-only volume). Reads of such an index work.

    Attributes:
        path: the database file.
    """

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class IndexOutOfDateError(IndexDatabaseError):
    """The index database's schema is behind this registry: run ``registry db upgrade``."""


# -- checkpoints ---------------------------------------------------------------


class CheckpointError(RegistryError):
    """A checkpoint cannot be saved or resumed."""


class RunLeasedError(CommitConflictError):
    """Another process holds the writer lease of this checkpoint tree (a run has
    one writer at a time), or this writer lost it to another one.

    Attributes:
        holder: the lease document of the holder (owner, host, pid,
            started_at, expires_at).
    """

    def __init__(self, message: str, *, path: str = "", holder: dict[str, Any] | None = None,
                 ) -> None:
        super().__init__(message, path=path)
        self.holder = dict(holder or {})


class CheckpointExistsError(CommitConflictError, CheckpointError):
    """The step is already a committed checkpoint at or before the pointer;
    saving never overwrites it."""


class NoValidCheckpointError(_Message, CheckpointError, FileNotFoundError):
    """No checkpoint step of the run is committed and verifies."""


# -- LoongSage data sources, rollout data, reference and teacher paths (issue 18) --


class TorchUnavailableError(UsageError):
    """A LoongSage ``.pt`` file (data source state, pipeline buffer, rollout
    data) is to be written or read, but torch (the ``[torch]`` extra) is not
    installed."""


__all__ = [name for name in dir() if name.endswith("Error")]


class PieceMismatchError(IntegrityError):
    """One piece of a file does not verify against its manifest entry's piece
    states (registry.protocol.pieces); the file's bytes differ from its sha256.

    Attributes:
        piece: the piece's index (0-based); ``start``, ``end``: its bytes.
        expected_state, actual_state: the SHA-256 state the piece must end at
            and the one its bytes give (for the last piece, the file's sha256).
    """

    def __init__(self, path: str, *, size: int, piece: int, start: int, end: int,
                 expected_state: str, actual_state: str, last: bool) -> None:
        self.piece, self.start, self.end = piece, start, end
        self.expected_state, self.actual_state = expected_state, actual_state
        what = "sha256" if last else "sha256 state"
        super().__init__(path, expected_size=size, actual_size=size,
                         reason=f"piece {piece} (bytes {start}-{end - 1}) does not verify: "
                                f"{what} {actual_state}, expected {expected_state}")
