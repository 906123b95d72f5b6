"""Google Cloud Storage store through gcsfs (issue 49; docs/gcs.md says what
each guarantee rests on): create-only uploads with ``ifGenerationMatch=0``,
compare-and-swap on the object's generation (``ifGenerationMatch=<generation>``),
checked ranged reads, resumable uploads for large objects
(:mod:`registry.store.gcsupload`).

Requests go through gcsfs's authenticated session (Application Default
Credentials, ``GOOGLE_APPLICATION_CREDENTIALS``, the metadata server,
``token=...``; ``STORAGE_EMULATOR_HOST`` for an emulator), not through its
upload helpers: ``simple_upload`` and ``initiate_upload`` know only
``ifGenerationMatch=0`` and take no metadata for the write token, so the store
builds its uploads (multipart, never ``uploadType=media``, whose preconditions
fake-gcs-server ignores). gcsfs's retry loop is bypassed (``_request.__wrapped__``):
one retry layer, :class:`registry.store.s3retry.RetryPolicy` with GCS's classes.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import datetime
from typing import IO, Any

import aiohttp
import gcsfs.core
from fsspec.asyn import sync
from gcsfs.retry import HttpError, validate_response

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
from registry.store.ranges import RangeReader, range_answer_ok  # reads through read_range
from registry.store.s3retry import RetryPolicy
from registry.store.translate import range_not_satisfiable, unreachable

OPT_OUT_ENV = "REGISTRY_GCS_SINGLE_WRITER"
#: user metadata every conditional write carries: a token unique to the write,
#: by which a retried request whose first answer was lost recognizes its own
#: object (the S3 store's ``registry-write``).
WRITE_TOKEN = "registry-write"
_TRANSIENT_CODES = frozenset({408, 429, 500, 502, 503, 504})


def is_transient(exc: BaseException) -> bool:
    """Whether a GCS request that raised ``exc`` may succeed when sent again:
    408, 429 and 5xx answers (gcsfs raises a 502 as requests' ProxyError),
    connections refused, reset or timed out, bodies cut short."""
    if isinstance(exc, HttpError):
        return str(exc.code) in {str(c) for c in _TRANSIENT_CODES}
    if type(exc).__name__ == "ProxyError":
        return True
    return isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)) or (
        unreachable(exc) is not None)


class GCSStore(condprobe.TokenWrites, ForkSafeFs, Store):
    """A store under ``gs://bucket[/prefix]``.

    Raises:
        UsageError: ``GOOGLE_APPLICATION_CREDENTIALS`` names no file.
    """

    condition_names = {"absent": "ifGenerationMatch=0",
                       "match": "ifGenerationMatch=<generation>",
                       "large": "ifGenerationMatch=0 on a resumable upload"}
    opt_out_env = OPT_OUT_ENV
    files_in_flight = 4

    def __init__(self, url: str, root: str, **storage_options: Any) -> None:
        options = dict(storage_options)
        self.single_writer = condprobe.single_writer(options, OPT_OUT_ENV)
        self.retry = RetryPolicy.from_options(options)
        options.setdefault("skip_instance_cache", True)
        named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        if named and "token" not in options and not os.path.isfile(named):
            # gcsfs would fall back to anonymous access without a word
            raise UsageError(f"GOOGLE_APPLICATION_CREDENTIALS={named}: no such file (name a "
                             "service-account key file, or unset it for Application Default "
                             "Credentials)")
        if os.environ.get("STORAGE_EMULATOR_HOST") and "token" not in options:
            options["token"] = "anon"  # an emulator takes none (as google-cloud-storage does)
        options.setdefault("project", os.environ.get("GOOGLE_CLOUD_PROJECT") or "registry")
        self._options = options
        super().__init__(url, self._new_fs(), root)
        self.bucket, _, self.prefix = self.root.partition("/")
        self.endpoint = self.fs._location
        self.probe_id = (self.endpoint, self.bucket)
        #: the store as a user knows it, in every error but "not found".
        self.where = f"{url} (bucket {self.bucket!r} at {self.endpoint})"
        self._bucket_seen = False

    def _new_fs(self) -> gcsfs.core.GCSFileSystem:
        # The core class, never ExtendedGcsFileSystem: its zonal-bucket check asks
        # the storage-control API before uploads (60 s against an emulator).
        return gcsfs.core.GCSFileSystem(**self._options)

    # -- raw requests --------------------------------------------------------------

    def _name(self, key: str) -> str:
        """The object name of ``key`` (key_parts: UnsafeEntryError for a bad key)."""
        segs = key_parts(key, where=self.url)
        return "/".join([self.prefix, *segs] if self.prefix else segs)

    async def _send(self, method: str, path: str, *args: str,
                    headers: dict[str, str] | None = None, data: Any = None,
                    json_body: Any = None, **params: Any) -> tuple[int, Any, bytes]:
        """One request through gcsfs's session and credentials, retried by
        ``self.retry``; returns (status, headers, body). gcsfs raises
        FileNotFoundError (404), FileExistsError (412), OSError (403) or
        HttpError for an error answer."""
        fs = self.fs
        raw = type(fs)._request.__wrapped__  # gcsfs's request without its retry loop

        async def once() -> tuple[int, Any, bytes]:
            status, hdrs, _, body = await raw(fs, method, path, *args, headers=headers,
                                              data=data, json=json_body, **params)
            return status, hdrs, body

        return await self.retry.run(once, transient=is_transient)

    def call(self, method: str, path: str, *args: str, **kwargs: Any) -> tuple[int, Any, bytes]:
        """:meth:`_send` on gcsfs's loop, blocking the calling thread."""
        out = sync(self.fs.loop, self._send, method, path, *args, **kwargs)
        return out  # type: ignore[no-any-return]

    def submit(self, method: str, path: str, *args: str, **kwargs: Any) -> Future[Any]:
        """:meth:`_send` on gcsfs's loop without waiting for it."""
        return asyncio.run_coroutine_threadsafe(self._send(method, path, *args, **kwargs),
                                                self.fs.loop)

    def object_json(self, key: str) -> dict[str, Any]:
        """The object resource of ``key`` (size, generation, md5Hash, metadata)."""
        with self._translated(key):
            _, _, body = self.call("GET", "b/{}/o/{}", self.bucket, self._name(key))
        return json.loads(body)  # type: ignore[no-any-return]

    def upload(self, key: str, data: bytes, *, token: str | None, write_token: str,
               conditional: bool = True) -> dict[str, Any]:
        """One multipart upload of ``data`` with ``write_token`` in its
        metadata: create-only when ``token`` is None and ``conditional``,
        else only while the generation is ``token``. Returns the new object
        resource. Raises FileExistsError (412) untranslated."""
        params: dict[str, Any] = {"uploadType": "multipart"}
        if conditional:
            params["ifGenerationMatch"] = "0" if token is None else token
        meta = json.dumps({"name": self._name(key), "metadata": {WRITE_TOKEN: write_token}})
        body = (b"--==0==\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                + meta.encode() + b"\r\n--==0==\r\nContent-Type: application/octet-stream\r\n\r\n"
                + bytes(data) + b"\r\n--==0==--")
        _, _, out = self.call(
            "POST", f"{self.endpoint}/upload/storage/v1/b/{gcsfs.core.quote(self.bucket)}/o",
            headers={"Content-Type": 'multipart/related; boundary="==0=="'},
            data=io.BytesIO(body), **params)
        return json.loads(out)  # type: ignore[no-any-return]

    @contextmanager
    def _translated(self, key: str) -> Iterator[None]:
        """Foreign errors as registry errors naming the store; a 404 is "not
        found" only once the bucket is known to exist."""
        try:
            yield
        except RegistryError:
            raise
        except FileNotFoundError:
            self.require_bucket()
            raise ObjectNotFoundError(f"{key}: not found", key=key) from None
        except FileExistsError:
            raise ObjectExistsError(f"{key}: already exists", key=key) from None
        except Exception as exc:
            raise self._error(exc, key) from exc

    def _error(self, exc: BaseException, key: str) -> StorageError:
        text = str(exc).split("\n", 1)[0]
        if text.startswith("Forbidden") or (isinstance(exc, HttpError) and exc.code == 401):
            return StoragePermissionError(
                f"{key} in {self.where}: access denied (check the credentials: Application "
                "Default Credentials or GOOGLE_APPLICATION_CREDENTIALS, and the bucket's IAM)",
                key=key)
        low = unreachable(exc)
        if low is not None or isinstance(exc, aiohttp.ClientConnectionError):
            return StorageError(f"{key} in {self.where}: cannot reach the endpoint "
                                f"({type(low or exc).__name__}); is the service up and "
                                "STORAGE_EMULATOR_HOST (or endpoint_url) right?", key=key)
        return StorageError(f"{key} in {self.where}: {type(exc).__name__}: {text}", key=key)

    def require_bucket(self) -> None:
        """Raise StorageError unless the bucket exists (a success is remembered)."""
        if self._bucket_seen:
            return
        try:
            self.call("GET", "b/{}", self.bucket)
        except FileNotFoundError:
            raise StorageError(f"{self.where}: the bucket does not exist (check the store "
                               "URL)", key="") from None
        except Exception as exc:
            raise self._error(exc, "") from exc
        self._bucket_seen = True

    # -- what the probe needs (condprobe.ProbedStore) ------------------------------

    def put_if(self, key: str, data: bytes, *, token: str | None) -> str:
        try:
            with self._translated(key):
                return str(self.upload(key, data, token=token, write_token="probe")["generation"])
        except ObjectExistsError:
            raise condprobe.Refused(f"{key}: precondition failed", key=key) from None

    def put_large_if_absent(self, key: str, data: bytes) -> None:
        from registry.store.gcsupload import GCSWriter

        writer = GCSWriter(self, key, exclusive=True, force_resumable=True, probing=True)
        try:
            writer.write(data)
            writer.close()
        except ObjectExistsError:
            raise condprobe.Refused(f"{key}: precondition failed", key=key) from None

    def version_of(self, key: str) -> str:
        return str(self.object_json(key)["generation"])

    @staticmethod
    def stale_version(current: str) -> str:
        return str(int(current) + 1) if current.isdigit() else "1"

    # -- primitives ----------------------------------------------------------------

    def own_write(self, key: str, write_token: str) -> bool:
        """Whether the object at ``key`` is the one a write with ``write_token`` made."""
        try:
            meta = self.object_json(key).get("metadata") or {}
        except StorageError:
            return False
        return bool(meta.get(WRITE_TOKEN) == write_token)

    def create(self, key: str, data: bytes) -> None:
        self._conditional(key, data, None)

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """The content and generation of one generation of ``key``: the
        generation is read first and the media GET pinned to it."""
        generation = self.version_of(key)
        with self._translated(key):
            _, _, body = self.call("GET", "b/{}/o/{}", self.bucket, self._name(key),
                                   alt="media", generation=generation)
        return body, generation

    def read_bytes(self, key: str, *, limit: int | None = None) -> bytes:
        """One streamed GET, stopped after ``limit`` bytes (see :meth:`Store.read_bytes`)."""
        return self.read_streamed(key, limit=limit)

    def _check_range(self, key: str, status: int, headers: Any, start: int, end: int,
                     whole: int | None = None) -> None:
        """A ranged GET must answer 206 with the requested ``Content-Range``
        (registry.store.ranges.range_answer_ok); a 200 with the whole object is
        taken only when the range asked for covers it (``whole``: its length)."""
        got = headers.get("Content-Range", "")
        if range_answer_ok(status, got, start, end) or (
                status == 200 and start == 0 and whole is not None and whole <= end):
            return
        raise StorageError(
            f"{self.url_of(key)} in {self.where}: a GET of bytes {start}-{end - 1} was "
            f"answered {status} with Content-Range {got or '(none)'}: the service or a "
            "proxy ignores Range requests, which the registry needs", key=key)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``: one checked ranged GET; empty at or past the end."""
        if end <= start:
            return b""
        try:
            with self._translated(key):
                status, headers, body = self.call(
                    "GET", "b/{}/o/{}", self.bucket, self._name(key), alt="media",
                    headers={"Range": f"bytes={start}-{end - 1}"})
        except StorageError as e:
            if range_not_satisfiable(e):
                return b""
            raise
        self._check_range(key, status, headers, start, end, whole=len(body))
        return body  # type: ignore[no-any-return]

    def _media(self, key: str, start: int | None = None, end: int | None = None) -> Any:
        """An open aiohttp response of a media GET of ``key`` (bytes
        ``[start, end)`` when given, checked as :meth:`read_range` does);
        None for a range at or past the end. Sent through gcsfs's session
        and credentials, retried until its headers arrive."""
        fs = self.fs
        url = fs._format_path("b/{}/o/{}", (self.bucket, self._name(key)))
        headers = {"Range": f"bytes={start}-{end - 1}"} if start is not None and end else None

        async def once() -> Any:
            await fs._set_session()
            resp = await fs.session.get(url, params=fs._get_params({"alt": "media"}),
                                        headers=fs._get_headers(headers),
                                        timeout=fs.requests_timeout)
            if resp.status >= 400:
                body = await resp.read()
                resp.release()
                validate_response(resp.status, body, url)
            return resp

        try:
            with self._translated(key):
                resp = sync(fs.loop, self.retry.run, once, transient=is_transient)
        except StorageError as e:
            if start is not None and range_not_satisfiable(e):
                return None
            raise
        if headers is not None:
            length = resp.headers.get("Content-Length")
            try:
                self._check_range(key, resp.status, resp.headers, start or 0, end or 0,
                                  whole=int(length) if length is not None else None)
            except StorageError:
                resp.release()
                raise
        return resp

    def _stream(self, key: str, resp: Any, chunk: int) -> Iterator[bytes]:
        """Blocks of ``chunk`` bytes (the last one shorter) of an open response; closes it."""
        async def fill() -> bytes:
            buf = bytearray()
            while len(buf) < chunk:
                block = await resp.content.read(chunk - len(buf))
                if not block:
                    break
                buf += block
            return bytes(buf)

        try:
            while True:
                with self._translated(key):
                    block = sync(self.fs.loop, fill)
                if not block:
                    return
                yield block
        finally:
            resp.release()

    def iter_range(self, key: str, start: int, end: int,
                   chunk: int = CHUNK) -> Iterator[bytes]:
        """One checked ranged GET, streamed in blocks of ``chunk`` bytes."""
        if end <= start:
            return
        resp = self._media(key, start, end)
        if resp is not None:
            yield from self._stream(key, resp, chunk)

    def iter_read(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """One GET, streamed in blocks of ``chunk`` bytes."""
        yield from self._stream(key, self._media(key), chunk)

    def open_read(self, key: str) -> IO[bytes]:
        reader = RangeReader(self, key, self.info(key).size)  # type: ignore[arg-type]
        return io.BufferedReader(reader, buffer_size=CHUNK)  # type: ignore[return-value]

    def open_write(self, key: str, *, exclusive: bool = False,
                   size: int | None = None) -> IO[bytes]:
        """A writer: one multipart upload for an object under one chunk, a
        resumable upload otherwise (:mod:`registry.store.gcsupload`)."""
        from registry.store.gcsupload import GCSWriter

        if exclusive:
            condprobe.require_preconditions(self)
        return GCSWriter(self, key, exclusive=exclusive)  # type: ignore[return-value]

    def info(self, key: str) -> ObjectInfo:
        obj = self.object_json(key)
        updated = obj.get("updated")
        mtime = (datetime.fromisoformat(updated.replace("Z", "+00:00")).timestamp()
                 if updated else None)
        return ObjectInfo(key, int(obj["size"]), mtime)

    def _list(self, prefix: str, delimiter: str) -> Iterator[dict[str, Any]]:
        """Every page of an object listing of ``prefix/``; an error is raised,
        never an empty answer."""
        base = self._name(prefix)
        params: dict[str, Any] = {"prefix": base + "/" if base else ""}
        if delimiter:
            params["delimiter"] = delimiter
        while True:
            with self._translated(prefix or "/"):
                try:
                    _, _, body = self.call("GET", "b/{}/o", self.bucket, **params)
                except FileNotFoundError:
                    self.require_bucket()
                    raise
            self._bucket_seen = True
            page = json.loads(body)
            yield page
            if not page.get("nextPageToken"):
                return
            params["pageToken"] = page["nextPageToken"]

    def list_dir(self, prefix: str) -> list[tuple[str, bool]]:
        """Zero-byte folder markers (names ending in ``/``) are skipped."""
        out: dict[str, bool] = {}
        for page in self._list(prefix, "/"):
            for p in page.get("prefixes", []):
                out[p.rstrip("/").rsplit("/", 1)[-1]] = True
            for o in page.get("items", []):
                if not o["name"].endswith("/"):
                    out.setdefault(o["name"].rsplit("/", 1)[-1], False)
        return sorted(out.items())

    def walk_versions(self, prefix: str) -> dict[str, tuple[int, str | None]]:
        """Each object's size and generation (the token a writer's ``etag`` holds)."""
        base = self._name(prefix)
        cut = len(base) + 1 if base else 0
        out: dict[str, tuple[int, str | None]] = {}
        for page in self._list(prefix, ""):
            for o in page.get("items", []):
                if not o["name"].endswith("/"):
                    out[o["name"][cut:]] = (int(o["size"]),
                                            str(o.get("generation") or "") or None)
        return dict(sorted(out.items()))

    def walk_files(self, prefix: str) -> dict[str, int]:
        return {path: size for path, (size, _) in self.walk_versions(prefix).items()}

    def delete(self, key: str) -> None:
        try:
            with self._translated(key):
                self.call("DELETE", "b/{}/o/{}", self.bucket, self._name(key))
        except ObjectNotFoundError:
            pass

    remove = delete  # what the probe calls (condprobe.ProbedStore)

    def delete_prefix(self, prefix: str) -> None:
        """Every object under ``prefix`` (folder markers too), 16 deletes in flight."""
        names = [o["name"] for page in self._list(prefix, "") for o in page.get("items", [])]
        for i in range(0, len(names), 16):
            batch = [self.submit("DELETE", "b/{}/o/{}", self.bucket, n) for n in names[i:i + 16]]
            for fut in batch:
                try:
                    with self._translated(prefix):
                        fut.result()
                except ObjectNotFoundError:
                    pass
        if prefix:
            self.delete(prefix)
