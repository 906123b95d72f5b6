"""Translate foreign storage errors into ``registry.errors``, in one table.

fsspec and s3fs already map most botocore errors onto builtins
(``FileNotFoundError``, ``PermissionError``, ``FileExistsError``); what is left
arrives as ``botocore.exceptions.ClientError`` or ``OSError``. Every store
primitive runs its backend call inside :func:`translated`.
"""

from __future__ import annotations

import errno
from collections.abc import Collection, Iterator
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
    "404": ObjectNotFoundError,
    "PreconditionFailed": ObjectExistsError,
    "412": ObjectExistsError,
    "AccessDenied": StoragePermissionError,
    "403": StoragePermissionError,
    "InvalidAccessKeyId": StoragePermissionError,
    "SignatureDoesNotMatch": StoragePermissionError,
    "InvalidClientTokenId": StoragePermissionError,
    "ExpiredToken": StoragePermissionError,
    "InvalidToken": StoragePermissionError,
}

#: the likely cause of a failure, by S3 error code, in words a user can act on.
#: A missing bucket is never "not found": only a missing object under an
#: existing bucket is (issue 13 item 7).
_S3_HINTS: dict[str, str] = {
    "NoSuchBucket": "the bucket does not exist (check the store URL)",
    "AccessDenied": "access denied (check the credentials' permissions and the bucket policy)",
    "403": "access denied (check the credentials' permissions and the bucket policy)",
    "InvalidAccessKeyId": "the access key is not known to the server (check the credentials)",
    "SignatureDoesNotMatch": "the secret key is wrong (check the credentials)",
    "InvalidClientTokenId": "the credentials are not known to the server",
    "ExpiredToken": "the credentials have expired",
    "InvalidToken": "the session token is invalid (check the credentials)",
    "SlowDown": "the server is throttling requests (503 SlowDown) and kept doing so",
    "503": "the server is unavailable (503) and stayed so",
    "InternalError": "the server failed (500 InternalError) and kept failing",
    "500": "the server failed (500) and kept failing",
}

#: exception class names (botocore, aiohttp, the OS) that mean the endpoint
#: could not be reached or did not answer in time.
_UNREACHABLE = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                "ConnectionClosedError", "ClientConnectorError", "ServerDisconnectedError",
                "ClientOSError", "ConnectionRefusedError", "ConnectionResetError",
                "TimeoutError", "ServerTimeoutError", "ResponseStreamingError")


#: errno values of a full disk (a quota is a full disk for this user).
_FULL_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}

#: The rule a write to a read-only file system breaks (EROFS), for every message.
READ_ONLY = "read-only file system: this command writes there, so it must be mounted writable"

#: S3 error codes of a full server: MinIO's full drives answer 507.
_S3_FULL = {"XMinioStorageFull", "507"}


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or while handling, and so on."""
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def is_named(exc: BaseException, names: Collection[str]) -> bool:
    """Whether ``exc``'s class, or a class it derives from, has one of ``names``
    (a library's exception matched without importing the library)."""
    return any(c.__name__ in names for c in type(exc).__mro__)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status a service answered, from ``exc`` or what it was raised
    from: gcsfs's HttpError ``code``, azure-core's ``status_code``, aiohttp's
    ``status``. Never read from a message, whose text (an endpoint's port, a
    request id) may hold any number."""
    for seen in causes(exc):
        for attr in ("status_code", "code", "status"):
            value = getattr(seen, attr, None)
            if isinstance(value, int) and 100 <= value <= 599:
                return value
    return None


def range_not_satisfiable(exc: BaseException) -> bool:
    """Whether ``exc`` is a service's answer that a range starts at or past the
    object's end (HTTP 416), judged by status, never by message text."""
    return http_status(exc) == 416


def s3_error_code(exc: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError (or its translated cause)."""
    for seen in causes(exc):
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            return str(code) if code is not None else None
    return None


def unreachable(exc: BaseException) -> BaseException | None:
    """The connection-level error behind ``exc`` (refused, reset, timed out)."""
    return next((seen for seen in causes(exc) if is_named(seen, _UNREACHABLE)), None)


def translate(exc: BaseException, key: str, *, where: str | None = None) -> StorageError:
    """Map one foreign exception to the registry error for ``key``.

    Args:
        where: the store as a user knows it (``s3://bucket/root at
            http://host:9000``): added to every error but "not found", with the
            likely cause (credentials, permissions, bucket, endpoint).
    """
    code = s3_error_code(exc)
    if code in _S3_FULL:
        return InsufficientSpaceError(f"{key}: no space left on the storage server ({code})",
                                      key=key)
    if code in _S3_HINTS or (code is None and unreachable(exc) is not None):
        if code in _S3_HINTS:
            cause = _S3_HINTS[code]
        else:
            low = unreachable(exc)
            cause = (f"cannot reach the endpoint ({type(low).__name__}: {low}); is the "
                     "server up and the endpoint URL (AWS_ENDPOINT_URL) right?")
        mapped = _S3_CODES.get(code or "", StorageError)
        place = f" in {where}" if where else ""
        return mapped(f"{key}{place}: {cause}", key=key)
    if code in _S3_CODES:
        return _S3_CODES[code](f"{key}: {code}", key=key)
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return InsufficientSpaceError(f"{key}: {_FULL_ERRNOS[exc.errno]}", key=key)
    if isinstance(exc, OSError) and exc.errno == errno.EROFS:
        return StoragePermissionError(f"{exc.filename or key}: {READ_ONLY}", key=key)
    for builtin, mapped in _TABLE:
        if isinstance(exc, builtin):
            reason = {ObjectNotFoundError: "not found",
                      ObjectExistsError: "already exists",
                      StoragePermissionError: "permission denied"}[mapped]
            return mapped(f"{key}: {reason}", key=key)
    place = f" in {where}" if where else ""
    return StorageError(f"{key}{place}: {type(exc).__name__}: {exc}", key=key)


@contextmanager
def translated(key: str, *, where: str | None = None) -> Iterator[None]:
    """Run a backend call, re-raising foreign errors as registry errors
    (``where``: see :func:`translate`)."""
    try:
        yield
    except RegistryError:
        raise
    except Exception as exc:  # the whole point: nothing foreign escapes
        raise translate(exc, key, where=where) from exc
