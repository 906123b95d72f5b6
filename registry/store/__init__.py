"""Stores: where every byte and every committed fact lives (DESIGN sections 1 and 3).

``open_store(url)`` picks the backend from the URL; callers then use only the
:class:`Store` primitives and its capability flags.


Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, protocol.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any
from urllib.parse import unquote, urlsplit

from registry.errors import InvalidStoreURLError, UsageError
from registry.store.base import CHUNK, ObjectInfo, Store, join
from registry.store.local import LocalStore

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
        url: a local path, ``file://path``, ``s3://bucket[/prefix]``,
            ``gs://bucket[/prefix]``, ``az://container[/prefix]`` (also
            ``abfs://``) or ``memory://name``. None: ``$REGISTRY_STORE``, else ``./artifacts``.
        storage_options: passed to the fsspec filesystem (s3fs: ``endpoint_url``,
            ``key``, ``secret``, ``client_kwargs``...); S3 also takes
            ``single_writer`` (registry.store.s3probe), ``retry_attempts`` and
            ``retry_delay`` (seconds; registry.store.s3retry). GCS (gcsfs:
            ``token``, ``project``, ``endpoint_url``) and Azure (adlfs:
            ``account_name``, ``connection_string``, ``credential``...) take
            ``single_writer`` (registry.store.condprobe) and the retry options.

    Raises:
        InvalidStoreURLError: unknown protocol, or ``s3://`` without a bucket.
        UsageError: ``memory://`` from the command line (:func:`refuse_memory_stores`).
    """
    url = url or os.environ.get("REGISTRY_STORE") or DEFAULT_STORE
    scheme, root, canonical = parse_store_url(url)
    if scheme == "file":
        return LocalStore(url, root)
    if scheme == "s3":
        from registry.store.s3 import S3Store  # s3fs loads only when S3 is used

        return S3Store(canonical, root, **storage_options)
    if scheme == "gs":
        from registry.store.gcs import GCSStore  # gcsfs loads only when GCS is used

        return GCSStore(canonical, root, **storage_options)
    if scheme == "az":
        from registry.store.azure import AzureStore  # adlfs loads only when Azure is used

        netloc = urlsplit(url).netloc
        if "@" in netloc:  # abfs://container@account.dfs.core.windows.net/prefix
            storage_options.setdefault("account_name", netloc.split("@", 1)[1].split(".", 1)[0])
        return AzureStore(canonical, root, **storage_options)
    if not _MEMORY_ALLOWED.get():
        raise UsageError(f"{url}: memory:// stores live only inside one process; the "
                         "command line needs a folder, file:// or s3:// URL")
    from registry.store.memory import MemoryStore  # fsspec: loaded when used

    return MemoryStore(url, root)


def parse_store_url(url: str) -> tuple[str, str, str]:
    """The one reading of a store URL: ``(scheme, root, canonical URL)``, where
    scheme is ``file``, ``s3`` or ``memory``.

    Every spelling of one place gives one root (docs/confinement.md): a local
    path is made absolute (``~`` expanded, relative to the current directory);
    ``file://`` takes an absolute path (``file:///srv/a%20b`` is ``/srv/a b``:
    percent-escapes are decoded, as RFC 8089 says); ``s3://bucket//prefix``,
    ``s3://bucket/prefix/`` and ``s3://bucket/prefix//`` are all
    ``s3://bucket/prefix`` (empty segments dropped: S3 listings would strip
    them, existence checks would not).

    Raises:
        InvalidStoreURLError: an unknown protocol; ``s3://`` without a bucket;
            a ``.`` or ``..`` segment in an S3 prefix; a ``?`` or ``#`` in a
            ``file://`` or ``s3://`` URL (never dropped); ``file://`` with a host
            other than ``localhost`` or a relative path; an empty path.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        if not url.strip():
            raise InvalidStoreURLError("store URL: empty")
        root = os.path.abspath(os.path.expanduser(url))
        return "file", root, root
    if scheme in ("file", "s3", "s3a", *_CLOUD) and ("?" in url or "#" in url):
        raise InvalidStoreURLError(f"{url}: a {scheme}:// URL takes no '?' or '#' part "
                                   "(write a literal one as %3F or %23)")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidStoreURLError(
                f"{url}: a file:// URL needs an absolute path (file:///srv/store); "
                f"{parts.netloc!r} would be a host name")
        path = unquote(parts.path)
        if not path.startswith("/") or "\0" in path:
            raise InvalidStoreURLError(f"{url}: a file:// URL needs an absolute path")
        root = os.path.normpath(path)
        return "file", root, "file://" + root
    if scheme in ("s3", "s3a"):
        if not parts.netloc:
            raise InvalidStoreURLError(f"{url}: an s3:// URL needs a bucket")
        segs = [p for p in parts.path.split("/") if p]
        if any(p in (".", "..") for p in segs):
            raise InvalidStoreURLError(f"{url}: a '.' or '..' segment in an S3 prefix names "
                                       "no single prefix (S3 keys are literal)")
        root = "/".join([parts.netloc, *segs])
        return "s3", root, f"s3://{root}"
    if scheme in _CLOUD:
        return _cloud_url(url, scheme, parts.netloc, parts.path)
    if scheme == "memory":
        return "memory", f"{parts.netloc}{parts.path}", url
    raise InvalidStoreURLError(f"{url}: unsupported store protocol {scheme!r} "
                               "(use a local path, file://, s3://, gs://, az:// or memory://)")


#: the GCS and Azure Blob schemes (issue 49): gs://bucket/prefix, az://container/prefix;
#: abfs[s]://container/prefix and abfs[s]://container@account.dfs.core.windows.net/prefix
#: (adlfs's spellings) are az:// URLs.
_CLOUD = ("gs", "gcs", "az", "abfs", "abfss")


def _cloud_url(url: str, scheme: str, netloc: str, path: str) -> tuple[str, str, str]:
    """``(scheme, root, canonical)`` of a GCS or Azure URL: ``gs`` or ``az``,
    ``bucket/prefix`` with empty segments dropped, ``gs://...`` / ``az://...``.
    The account of an ``abfs://container@account.<host>`` URL is the store's
    ``account_name`` (:func:`open_store`), not part of the root."""
    kind = "gs" if scheme in ("gs", "gcs") else "az"
    container = netloc.split("@", 1)[0] if kind == "az" else netloc
    if not container:
        raise InvalidStoreURLError(f"{url}: a {scheme}:// URL needs a "
                                   f"{'bucket' if kind == 'gs' else 'container'}")
    segs = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in segs):
        raise InvalidStoreURLError(f"{url}: a '.' or '..' segment in a {scheme}:// prefix names "
                                   "no single prefix (object names are literal)")
    root = "/".join([container, *segs])
    return kind, root, f"{kind}://{root}"


def __getattr__(name: str) -> Any:
    if name == "S3Store":
        from registry.store.s3 import S3Store

        return S3Store
    if name == "MemoryStore":  # fsspec's memory filesystem: ~0.1 s to import
        from registry.store.memory import MemoryStore

        return MemoryStore
    raise AttributeError(name)


__all__ = ["CHUNK", "DEFAULT_STORE", "LocalStore", "MemoryStore", "ObjectInfo", "S3Store",
           "Store", "join", "open_store", "parse_store_url", "refuse_memory_stores"]
