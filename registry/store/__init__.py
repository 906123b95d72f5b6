"""Stores: where every byte and every committed fact lives (DESIGN sections 1 and 3).

``open_store(url)`` picks the backend from the URL; callers then use only the
:class:`Store` primitives and its capability flags.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

from registry.errors import InvalidStoreURLError, UsageError
from registry.store.base import CHUNK, ObjectInfo, Store, join
from registry.store.local import LocalStore
from registry.store.memory import MemoryStore

DEFAULT_STORE = "./artifacts"

#: False inside a command line run: a memory:// store would vanish with the process.
_MEMORY_ALLOWED: ContextVar[bool] = ContextVar("memory_stores_allowed", default=True)


def refuse_memory_stores() -> Callable[[], None]:
    """Make :func:`open_store` refuse ``memory://`` URLs (the CLI calls this: what
    a command writes there is gone when it exits, and the index would list it).
    Returns the function that allows them again."""
    previous = _MEMORY_ALLOWED.get()
    _MEMORY_ALLOWED.set(False)

    def allow_again() -> None:
        _MEMORY_ALLOWED.set(previous)
    return allow_again


def open_store(url: str | None = None, **storage_options: Any) -> Store:
    """Open the store at ``url``.

    Args:
        url: a local path, ``file://path``, ``s3://bucket[/prefix]`` or
            ``memory://name``. None: ``$REGISTRY_STORE``, else ``./artifacts``.
        storage_options: passed to the fsspec filesystem (s3fs: ``endpoint_url``,
            ``key``, ``secret``, ``client_kwargs``...); S3 also takes
            ``single_writer`` (registry.store.s3probe), ``retry_attempts`` and
            ``retry_delay`` (seconds; registry.store.s3retry).

    Raises:
        InvalidStoreURLError: unknown protocol, or ``s3://`` without a bucket.
        UsageError: ``memory://`` from the command line (:func:`refuse_memory_stores`).
    """
    url = url or os.environ.get("REGISTRY_STORE") or DEFAULT_STORE
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        path = parts.path if scheme == "file" else url
        return LocalStore(url, os.path.expanduser(path))
    if scheme in ("s3", "s3a"):
        if not parts.netloc:
            raise InvalidStoreURLError(f"{url}: an s3:// URL needs a bucket")
        from registry.store.s3 import S3Store  # s3fs loads only when S3 is used

        return S3Store(url, f"{parts.netloc}{parts.path}", **storage_options)
    if scheme == "memory":
        if not _MEMORY_ALLOWED.get():
            raise UsageError(f"{url}: memory:// stores live only inside one process; the "
                             "command line needs a folder, file:// or s3:// URL")
        return MemoryStore(url, f"{parts.netloc}{parts.path}")
    raise InvalidStoreURLError(f"{url}: unsupported store protocol {scheme!r} "
                               "(use a local path, file://, s3:// or memory://)")


def __getattr__(name: str) -> Any:
    if name == "S3Store":
        from registry.store.s3 import S3Store

        return S3Store
    raise AttributeError(name)


__all__ = ["CHUNK", "DEFAULT_STORE", "LocalStore", "MemoryStore", "ObjectInfo", "S3Store",
           "Store", "join", "open_store", "refuse_memory_stores"]
