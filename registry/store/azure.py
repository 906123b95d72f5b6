"""Azure Blob Storage store through adlfs: conditional headers for commit
markers, claims and pointers (issue 49).

What each guarantee rests on (docs/azure.md):

- conditional create (commit markers, claims): Put Blob with
  ``If-None-Match: *`` (``upload_blob(overwrite=False)``), refused with 409
  BlobAlreadyExists when a blob is at the name;
- compare-and-swap (``LATEST``, aliases): the version token is the blob's
  ETag; a replace sends ``If-Match: <ETag>`` (412 ConditionNotMet when the
  blob changed or was deleted meanwhile). The header is passed as a request
  header, not through ``upload_blob(etag=..., match_condition=...)``:
  azure-storage-blob's upload path has raised a TypeError on that pair in
  some releases, and an explicit header is the same request on every one;
- ranged reads: ``download_blob(offset, length)`` (the SDK checks the 206);
- large objects: blocks staged in parallel, each with its MD5 checked by the
  service (``validate_content``), committed by one Put Block List carrying
  the same condition (:mod:`registry.store.azureupload`).

Credentials are adlfs's: ``AZURE_STORAGE_CONNECTION_STRING``, or
``AZURE_STORAGE_ACCOUNT_NAME`` with ``AZURE_STORAGE_ACCOUNT_KEY``,
``AZURE_STORAGE_SAS_TOKEN``, a service principal (``AZURE_STORAGE_CLIENT_ID``
/ ``_SECRET`` / ``TENANT_ID``) or, with none of those, ``DefaultAzureCredential``
(managed identity, ``az login``...); or the same as storage options. None of
them is ever printed. Retries: azure-core's own are off on every call
(``retry_total=0``); the registry's policy retries, with Azure's transient
classes (:func:`is_transient`).
"""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import IO, Any, TypeVar

import adlfs
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from fsspec.asyn import sync

from registry.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    RegistryError,
    StorageError,
    StoragePermissionError,
    UsageError,
)
from registry.store import condprobe
from registry.store.base import CHUNK, ForkSafeFs, ObjectInfo, Store, key_parts
from registry.store.s3retry import RetryPolicy
from registry.store.translate import range_not_satisfiable, unreachable

T = TypeVar("T")
OPT_OUT_ENV = "REGISTRY_AZURE_SINGLE_WRITER"
#: blob metadata every conditional write carries (an identifier: Azure's rule
#: for metadata names); see the S3 store's ``registry-write``.
WRITE_TOKEN = "registry_write"
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: what must never reach a message: a SAS signature or an account key.
_SECRET = re.compile(r"(sig|AccountKey|SharedAccessSignature)=[^&;\s]+", re.IGNORECASE)


def is_transient(exc: BaseException) -> bool:
    """Whether an Azure request that raised ``exc`` may succeed when sent
    again: 408, 429 and 5xx answers (ServerBusy, OperationTimedOut,
    InternalError), connections refused or reset, answers cut short."""
    if isinstance(exc, (ServiceRequestError, ServiceResponseError, asyncio.TimeoutError,
                        ConnectionError)):
        return True
    if isinstance(exc, HttpResponseError):
        return exc.status_code in _TRANSIENT_STATUS
    return unreachable(exc) is not None


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "error_code", "") or "")


def _clean(text: str) -> str:
    return _SECRET.sub(lambda m: f"{m.group(1)}=(hidden)", text.split("\n", 1)[0])


class AzureStore(condprobe.TokenWrites, ForkSafeFs, Store):
    """A store under ``az://container[/prefix]``."""

    condition_names = {"absent": "If-None-Match: *", "match": "If-Match: <ETag>",
                       "large": "If-None-Match: * on Put Block List"}
    opt_out_env = OPT_OUT_ENV
    files_in_flight = 4

    def __init__(self, url: str, root: str, **storage_options: Any) -> None:
        options = dict(storage_options)
        self.single_writer = condprobe.single_writer(options, OPT_OUT_ENV)
        self.retry = RetryPolicy.from_options(options)
        options.setdefault("skip_instance_cache", True)
        self._options = options
        self.url = url  # named by _new_fs's error
        super().__init__(url, self._new_fs(), root)
        self.container, _, self.prefix = self.root.partition("/")
        client = self.fs.service_client
        self.endpoint = str(getattr(client, "primary_endpoint", "") or client.url).rstrip("/")
        self.endpoint = _clean(self.endpoint.split("?", 1)[0])
        self.probe_id = (self.endpoint, self.container)
        self.where = f"{url} (container {self.container!r} at {self.endpoint})"
        self._container_seen = False

    def _new_fs(self) -> adlfs.AzureBlobFileSystem:
        try:
            return adlfs.AzureBlobFileSystem(**self._options)
        except ValueError:
            raise UsageError(
                f"{self.url}: no Azure credentials found: set AZURE_STORAGE_CONNECTION_STRING, "
                "or AZURE_STORAGE_ACCOUNT_NAME with a key, SAS token or DefaultAzureCredential "
                "(see docs/azure.md)") from None

    # -- raw calls -----------------------------------------------------------------

    def _name(self, key: str) -> str:
        segs = key_parts(key, where=self.url)
        return "/".join([self.prefix, *segs] if self.prefix else segs)

    def blob(self, key: str) -> Any:
        """The aio BlobClient of ``key``."""
        return self.fs.service_client.get_blob_client(self.container, self._name(key))

    def container_client(self) -> Any:
        return self.fs.service_client.get_container_client(self.container)

    def run(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` on adlfs's loop, retried by ``self.retry``."""
        return sync(self.fs.loop, self.retry.run, attempt,  # type: ignore[no-any-return]
                    transient=is_transient)

    def submit(self, attempt: Callable[[], Awaitable[T]]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(
            self.retry.run(attempt, transient=is_transient), self.fs.loop)

    @contextmanager
    def _translated(self, key: str) -> Iterator[None]:
        """Azure errors as registry errors naming the store, never a secret."""
        try:
            yield
        except RegistryError:
            raise
        except ResourceNotFoundError as exc:
            if _code(exc) == "ContainerNotFound":
                raise StorageError(f"{self.where}: the container does not exist (check the "
                                   "store URL)", key=key) from None
            raise ObjectNotFoundError(f"{key}: not found", key=key) from None
        except (ResourceExistsError, ResourceModifiedError) as exc:
            raise ObjectExistsError(f"{key}: precondition failed ({_code(exc) or 'conflict'})",
                                    key=key) from None
        except ClientAuthenticationError:
            raise StoragePermissionError(
                f"{key} in {self.where}: access denied (check AZURE_STORAGE_CONNECTION_STRING or "
                "the account's credentials and their role on the container)", key=key) from None
        except HttpResponseError as exc:
            if exc.status_code == 403:
                raise StoragePermissionError(f"{key} in {self.where}: access denied "
                                             f"({_code(exc)})", key=key) from None
            raise StorageError(f"{key} in {self.where}: {exc.status_code} {_code(exc)}",
                               key=key) from None
        except Exception as exc:
            if unreachable(exc) is not None or isinstance(exc, ServiceRequestError):
                raise StorageError(f"{key} in {self.where}: cannot reach the endpoint "
                                   f"({type(exc).__name__}); is the service up and the "
                                   "connection string's BlobEndpoint right?", key=key) from None
            raise StorageError(f"{key} in {self.where}: {type(exc).__name__}: "
                               f"{_clean(str(exc))}", key=key) from None

    def upload(self, key: str, data: bytes, *, token: str | None, write_token: str,
               conditional: bool = True) -> str:
        """One Put Blob of ``data``: create-only when ``token`` is None (and
        ``conditional``), else only while the ETag is ``token``. Returns the
        new ETag (quotes stripped). Raises the SDK's errors untranslated."""
        blob = self.blob(key)
        kwargs: dict[str, Any] = {"metadata": {WRITE_TOKEN: write_token}, "retry_total": 0}
        if not conditional:
            kwargs["overwrite"] = True
        elif token is None:
            kwargs["overwrite"] = False  # the SDK sends If-None-Match: *
        else:
            kwargs["overwrite"] = True
            kwargs["headers"] = {"If-Match": f'"{token}"'}

        async def once() -> str:
            resp = await blob.upload_blob(io.BytesIO(data), length=len(data), **kwargs)
            return str(resp["etag"]).strip('"')

        return self.run(once)

    # -- what the probe needs (condprobe.ProbedStore) ------------------------------

    def put_if(self, key: str, data: bytes, *, token: str | None) -> str:
        try:
            with self._translated(key):
                return self.upload(key, data, token=token, write_token="probe")
        except ObjectExistsError:
            raise condprobe.Refused(f"{key}: precondition failed", key=key) from None

    def put_large_if_absent(self, key: str, data: bytes) -> None:
        from registry.store.azureupload import BlockWriter

        writer = BlockWriter(self, key, exclusive=True, force_blocks=True)
        try:
            writer.write(data)
            writer.close()
        except ObjectExistsError:
            raise condprobe.Refused(f"{key}: precondition failed", key=key) from None

    def version_of(self, key: str) -> str:
        return self._properties(key)[0]

    @staticmethod
    def stale_version(current: str) -> str:
        return "0x8D000000000000" if current != "0x8D000000000000" else "0x8D000000000001"

    def remove(self, key: str) -> None:
        self.delete(key)

    # -- primitives ----------------------------------------------------------------

    def _properties(self, key: str) -> tuple[str, int, float | None, dict[str, str]]:
        """(ETag, size, mtime, metadata) of ``key``."""
        blob = self.blob(key)

        async def once() -> Any:
            return await blob.get_blob_properties(retry_total=0)

        with self._translated(key):
            props = self.run(once)
        mtime = props.last_modified.timestamp() if props.last_modified else None
        return str(props.etag).strip('"'), int(props.size), mtime, dict(props.metadata or {})

    def own_write(self, key: str, write_token: str) -> bool:
        """Whether the blob at ``key`` is the one a write with ``write_token`` made."""
        try:
            return self._properties(key)[3].get(WRITE_TOKEN) == write_token
        except StorageError:
            return False

    def create(self, key: str, data: bytes) -> None:
        try:
            self._conditional(key, data, None)
        except ObjectExistsError:
            raise ObjectExistsError(f"{key}: already exists", key=key) from None

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """One GET: the body and the ETag of the same blob version."""
        blob = self.blob(key)

        async def once() -> tuple[bytes, str]:
            stream = await blob.download_blob(retry_total=0)
            data = await stream.readall()
            return data, str(stream.properties.etag).strip('"')

        with self._translated(key):
            return self.run(once)

    def _download(self, key: str, start: int | None = None, end: int | None = None) -> Any:
        """An aio StorageStreamDownloader of ``key`` (bytes ``[start, end)``
        when given), its first GET answered; None for a range at or past the
        end (416). Retried until that first answer arrives."""
        blob = self.blob(key)
        length = end - start if start is not None and end is not None else None

        async def once() -> Any:
            return await blob.download_blob(offset=start, length=length, max_concurrency=1,
                                            retry_total=0)

        try:
            with self._translated(key):
                return self.run(once)
        except StorageError as e:
            if start is not None and range_not_satisfiable(e):
                return None
            raise

    def _chunks(self, key: str, stream: Any, start: int, end: int | None,
                chunk: int) -> Iterator[bytes]:
        """The downloader's blocks, cut to at most ``chunk`` bytes; the byte
        count must be the range's (the SDK's ``size``: the range, capped at
        the blob's size from the first answer's Content-Range)."""
        want = int(stream.size)
        if end is not None and want > end - start:
            raise StorageError(f"{self.url_of(key)} in {self.where}: a read of bytes {start}-"
                               f"{end - 1} was answered with {want} bytes", key=key)
        got = 0
        blocks = stream.chunks()
        while True:
            with self._translated(key):
                try:
                    block = sync(self.fs.loop, blocks.__anext__)
                except StopAsyncIteration:
                    break
            got += len(block)
            for i in range(0, len(block), chunk):
                yield block[i:i + chunk]
        if got != want:
            raise StorageError(f"{self.url_of(key)} in {self.where}: a read of bytes {start}-"
                               f"{start + want - 1} returned {got} bytes", key=key)

    def read_bytes(self, key: str, *, limit: int | None = None) -> bytes:
        """One download, stopped after ``limit`` bytes (see :meth:`Store.read_bytes`)."""
        return self.read_streamed(key, limit=limit)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` (fewer at the end, none past it)."""
        return b"".join(self.iter_range(key, start, end)) if end > start else b""

    def iter_range(self, key: str, start: int, end: int,
                   chunk: int = CHUNK) -> Iterator[bytes]:
        """One ranged download, streamed in blocks of at most ``chunk`` bytes."""
        if end <= start:
            return
        stream = self._download(key, start, end)
        if stream is not None:
            yield from self._chunks(key, stream, start, end, chunk)

    def iter_read(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """One download, streamed in blocks of at most ``chunk`` bytes."""
        yield from self._chunks(key, self._download(key), 0, None, chunk)

    def open_read(self, key: str) -> IO[bytes]:
        from registry.store.ranges import RangeReader  # reads through self.read_range

        reader = RangeReader(self, key, self.info(key).size)  # type: ignore[arg-type]
        return io.BufferedReader(reader, buffer_size=CHUNK)  # type: ignore[return-value]

    def open_write(self, key: str, *, exclusive: bool = False,
                   size: int | None = None) -> IO[bytes]:
        """One Put Blob for an object under one block, staged blocks committed
        by Put Block List otherwise (:mod:`registry.store.azureupload`)."""
        from registry.store.azureupload import BlockWriter

        if exclusive:
            condprobe.require_preconditions(self)
        return BlockWriter(self, key, exclusive=exclusive)  # type: ignore[return-value]

    def info(self, key: str) -> ObjectInfo:
        _, size, mtime, _ = self._properties(key)
        return ObjectInfo(key, size, mtime)

    def _listing(self, prefix: str, delimiter: str) -> list[Any]:
        """Every entry of a listing of ``prefix/`` (blobs, and with a
        delimiter the folders), retried whole; an error is raised, never an
        empty answer (a missing container is a StorageError)."""
        base = self._name(prefix)
        start = base + "/" if base else ""
        client = self.container_client()

        async def once() -> list[Any]:
            if delimiter:
                return [e async for e in client.walk_blobs(name_starts_with=start,
                                                           delimiter=delimiter,
                                                           retry_total=0)]
            return [e async for e in client.list_blobs(name_starts_with=start, retry_total=0)]

        with self._translated(prefix or "/"):
            return self.run(once)

    def list_dir(self, prefix: str) -> list[tuple[str, bool]]:
        """Zero-byte folder markers (names ending in ``/``) are skipped."""
        out: dict[str, bool] = {}
        for e in self._listing(prefix, "/"):
            name = str(e.name)
            if name.endswith("/"):
                if hasattr(e, "size") and not hasattr(e, "prefix"):
                    continue  # a marker blob
                out[name.rstrip("/").rsplit("/", 1)[-1]] = True
            else:
                out.setdefault(name.rsplit("/", 1)[-1], False)
        return sorted(out.items())

    def walk_versions(self, prefix: str) -> dict[str, tuple[int, str | None]]:
        """Each blob's size and ETag (the token a writer's ``etag`` holds)."""
        base = self._name(prefix)
        cut = len(base) + 1 if base else 0
        return dict(sorted(
            (str(b.name)[cut:], (int(b.size), str(b.etag or "").strip('"') or None))
            for b in self._listing(prefix, "") if not str(b.name).endswith("/")))

    def walk_files(self, prefix: str) -> dict[str, int]:
        return {path: size for path, (size, _) in self.walk_versions(prefix).items()}

    def delete(self, key: str) -> None:
        blob = self.blob(key)

        async def once() -> None:
            try:
                await blob.delete_blob(retry_total=0)
            except ResourceNotFoundError as exc:
                if _code(exc) == "ContainerNotFound":
                    raise

        with self._translated(key):
            self.run(once)

    def delete_prefix(self, prefix: str) -> None:
        """Every blob under ``prefix`` (folder markers too), 16 deletes in flight."""
        names = [str(b.name) for b in self._listing(prefix, "")]
        client = self.container_client()

        def deleter(name: str) -> Callable[[], Awaitable[None]]:
            async def once() -> None:
                try:
                    await client.delete_blob(name, retry_total=0)
                except ResourceNotFoundError:
                    pass
            return once

        for i in range(0, len(names), 16):
            futures = [self.submit(deleter(n)) for n in names[i:i + 16]]
            for fut in futures:
                with self._translated(prefix):
                    fut.result()
        if prefix:
            self.delete(prefix)
