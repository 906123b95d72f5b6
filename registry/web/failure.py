"""One answer for every failure of the store behind ``registry serve``, on every route.

A Hugging Face client treats ``404`` with ``X-Error-Code: RepoNotFound`` as
"this model does not exist": it raises, does not retry, and does not fall
back to its own cache. So an outage must never look like that. The rule,
for the Hub routes, ``/api/v1`` and the pages alike (:func:`failure_of`):

| what the store did | status | ``Retry-After`` | ``X-Error-Code`` |
|---|---|---|---|
| said the object is absent (``ObjectNotFoundError``, nothing committed) | 404 | no | the route's own |
| could not be reached, timed out, throttled, answered 5xx | 503 | yes | ``StoreUnavailable`` |
| refused the server's credentials (403) | 502 | no | ``StoreRefused`` |
| the mirror's cache disk cannot hold the file | 507 | no | ``InsufficientStorage`` |
| stored bytes differ from the manifest | 409 | no | none (retrying cannot help) |

503 is the status ``huggingface_hub`` retries on (``http_backoff``'s
default) and, for a metadata request that fails this way, the status after
which ``hf_hub_download`` falls back to a copy it already has; its
``X-Error-Code`` is none of the Hub's "not found" codes.
"""

from __future__ import annotations

from dataclasses import dataclass

from registry.errors import (
    InsufficientSpaceError,
    IntegrityError,
    NotCommittedError,
    ObjectNotFoundError,
    StorageError,
    StoragePermissionError,
    UnsafeEntryError,
)

#: seconds a client is told to wait before it retries a store failure
RETRY_AFTER = 5


@dataclass(frozen=True, slots=True)
class Failure:
    """How one store failure is answered: HTTP ``status``, the Hub's
    ``X-Error-Code`` (None: the route's own), ``Retry-After`` seconds (None:
    not retryable) and a one-line ``message``."""

    status: int
    code: str | None
    retry_after: int | None
    message: str

    def headers(self) -> dict[str, str]:
        """``Retry-After`` and ``X-Error-Code`` as response headers."""
        out = {}
        if self.retry_after is not None:
            out["Retry-After"] = str(self.retry_after)
        if self.code is not None:
            out["X-Error-Code"] = self.code
        return out


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def failure_of(exc: BaseException) -> Failure | None:
    """The answer to ``exc`` when it is a store's (or the cache disk's)
    failure, else None (not a store failure: the caller's own mapping).

    Absence (``ObjectNotFoundError``, ``NotCommittedError``) is None too:
    only a route knows what is absent (a repo, a revision, a file)."""
    if isinstance(exc, (ObjectNotFoundError, NotCommittedError, IntegrityError)):
        return None
    if isinstance(exc, InsufficientSpaceError):
        return Failure(507, "InsufficientStorage", None, _line(exc))
    if isinstance(exc, StoragePermissionError):
        return Failure(502, "StoreRefused", None,
                       f"the store refused this server's request: {_line(exc)}")
    if isinstance(exc, UnsafeEntryError):
        return None  # a link or special file inside a local root: not an outage
    if isinstance(exc, FileNotFoundError):
        return None
    if isinstance(exc, (StorageError, OSError)):
        return Failure(503, "StoreUnavailable", RETRY_AFTER,
                       f"the store cannot be read now, retry later: {_line(exc)}")
    return None
