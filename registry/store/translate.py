"""Translate foreign storage errors into ``registry.errors``, in one table.

fsspec and s3fs already map most botocore errors onto builtins
(``FileNotFoundError``, ``PermissionError``, ``FileExistsError``); what is left
arrives as ``botocore.exceptions.ClientError`` or ``OSError``. Every store
primitive runs its backend call inside :func:`translated`.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from registry.errors import (
    InsufficientSpaceError,
    ObjectExistsError,
    ObjectNotFoundError,
    RegistryError,
    StorageError,
    StoragePermissionError,
)

#: (builtin exception type, registry error type) in match order.
_TABLE: tuple[tuple[type[BaseException], type[StorageError]], ...] = (
    (FileNotFoundError, ObjectNotFoundError),
    (NotADirectoryError, ObjectNotFoundError),
    (FileExistsError, ObjectExistsError),
    (PermissionError, StoragePermissionError),
)

#: S3 error codes (botocore ClientError) and what they mean here.
_S3_CODES: dict[str, type[StorageError]] = {
    "NoSuchKey": ObjectNotFoundError,
    "NoSuchBucket": ObjectNotFoundError,
    "404": ObjectNotFoundError,
    "PreconditionFailed": ObjectExistsError,
    "412": ObjectExistsError,
    "AccessDenied": StoragePermissionError,
    "403": StoragePermissionError,
}


#: errno values of a full disk (a quota is a full disk for this user).
_FULL_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}

#: S3 error codes of a full server: MinIO's full drives answer 507.
_S3_FULL = {"XMinioStorageFull", "507"}


def s3_error_code(exc: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError (or its translated cause)."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            return str(code) if code is not None else None
        seen = seen.__cause__ or seen.__context__
    return None


def translate(exc: BaseException, key: str) -> StorageError:
    """Map one foreign exception to the registry error for ``key``."""
    code = s3_error_code(exc)
    if code in _S3_FULL:
        return InsufficientSpaceError(f"{key}: no space left on the storage server ({code})",
                                      key=key)
    if code in _S3_CODES:
        return _S3_CODES[code](f"{key}: {code}", key=key)
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return InsufficientSpaceError(f"{key}: {_FULL_ERRNOS[exc.errno]}", key=key)
    for builtin, mapped in _TABLE:
        if isinstance(exc, builtin):
            reason = {ObjectNotFoundError: "not found",
                      ObjectExistsError: "already exists",
                      StoragePermissionError: "permission denied"}[mapped]
            return mapped(f"{key}: {reason}", key=key)
    return StorageError(f"{key}: {type(exc).__name__}: {exc}", key=key)


@contextmanager
def translated(key: str) -> Iterator[None]:
    """Run a backend call, re-raising foreign errors as registry errors."""
    try:
        yield
    except RegistryError:
        raise
    except Exception as exc:  # the whole point: nothing foreign escapes
        raise translate(exc, key) from exc
