"""S3 store through s3fs: conditional PUTs for commit markers and pointers.

Endpoint and credentials come from the standard AWS environment variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, profiles) or from ``storage_options`` passed to
:func:`registry.store.open_store`; nothing is hard-coded.

Large objects are written with a multipart upload (:mod:`registry.store.s3upload`:
parts go out in parallel while the caller keeps producing the next one).
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from concurrent.futures import Future
from collections.abc import Iterator
import os
from contextlib import contextmanager
from typing import IO, Any

import s3fs
from fsspec.asyn import sync

from registry.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    PointerConflictError,
    StorageError,
)
from registry.host.sourcecheck import ObjectState, object_state
from registry.store import condprobe, s3session, s3upload
from registry.store.ranges import RangeReader, range_answer_ok
from registry.store.s3abort import abort_stale_uploads
from registry.store.base import CHUNK, ForkSafeFs, ObjectInfo, Store, key_parts
from registry.store.s3probe import OPT_OUT_ENV, etag_as_sent, require_conditional_writes
from registry.store.s3retry import RetryPolicy, timeouts
from registry.store.translate import s3_error_code, translate, translated


_RETRYABLE_CONDITIONAL = {"ConditionalRequestConflict", "409"}


class S3Store(ForkSafeFs, Store):
    """A store under ``s3://bucket[/prefix]``."""

    def __init__(self, url: str, root: str, **storage_options: Any) -> None:
        options: dict[str, Any] = {"use_listings_cache": False, "skip_instance_cache": True}
        options.update(storage_options)
        #: accept a server that ignores conditional writes (see s3probe).
        self.single_writer = condprobe.single_writer(options, OPT_OUT_ENV)
        # Bodies are not SHA256-signed (UNSIGNED-PAYLOAD): each part carries a
        # CRC32 the server checks, and the manifest's sha256 covers every byte
        # end to end. Over https botocore already skips payload signing when a
        # checksum is present; over http it would hash every byte a second
        # time, on the event loop. boto3's upload_file sends unsigned payloads
        # with a trailing CRC32 too. An explicit config_kwargs["s3"] wins.
        config = dict(options.get("config_kwargs") or {})
        s3_config = dict(config.get("s3") or {})
        s3_config.setdefault("payload_signing_enabled", False)
        config["s3"] = s3_config
        # One retry layer, ours (s3retry): botocore's and s3fs's are off.
        config.setdefault("retries", {"total_max_attempts": 1})
        timeouts(config)
        options["config_kwargs"] = config
        #: how each request is retried (s3retry: attempts, backoff).
        self.retry = RetryPolicy.from_options(options)
        self._options = options
        super().__init__(url, self._new_fs(), root)
        self.bucket, _, self.prefix = self.root.partition("/")
        #: parts in flight across every writer of this store (memory bound).
        self.part_slots = threading.BoundedSemaphore(s3upload.MAX_INFLIGHT)
        self._bucket_seen = False
        self.endpoint = ((options.get("client_kwargs") or {}).get("endpoint_url")
                         or options.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL")
                         or "AWS S3")
        #: the store as a user knows it, in every error but "not found".
        self.where = f"{url} (bucket {self.bucket!r} at {self.endpoint})"

    @contextmanager
    def _translated(self, key: str) -> Iterator[None]:
        """:func:`translated` naming this store; a 404 without an error code
        (HEAD answers have no body) is "not found" only once the bucket is
        known to exist: a missing bucket is a StorageError, never an absent
        object (issue 13 item 7)."""
        try:
            with translated(key, where=self.where):
                yield
        except ObjectNotFoundError as e:
            if s3_error_code(e) != "NoSuchKey":
                self.require_bucket()
            raise

    def require_bucket(self) -> None:
        """Raise StorageError unless the bucket exists and answers (checked
        once per store object; a success is remembered)."""
        if self._bucket_seen:
            return
        try:
            self.call("head_bucket")
        except Exception as exc:
            if s3_error_code(exc) in ("404", "NoSuchBucket") or isinstance(exc, FileNotFoundError):
                raise StorageError(f"{self.where}: the bucket does not exist (check the store "
                                   "URL)", key="") from None
            raise translate(exc, "", where=self.where) from exc
        self._bucket_seen = True

    # -- fork safety ---------------------------------------------------------------

    # s3fs "is not fork-safe" (base.ForkSafeFs): a forked child gets a fresh
    # filesystem and a fresh part budget (issue 13 item 4)

    def _new_fs(self) -> s3fs.S3FileSystem:
        return _filesystem(self._options)

    def _forked(self) -> None:
        self.part_slots = threading.BoundedSemaphore(s3upload.MAX_INFLIGHT)

    # -- raw calls ---------------------------------------------------------------

    def _key(self, key: str) -> str:
        """The object key of ``key``: the one key function of every request
        (registry.store.base.key_parts: a ``..``, ``.`` or empty segment is
        refused, UnsafeEntryError; the prefix was normalized by
        registry.store.parse_store_url)."""
        segs = key_parts(key, where=self.url)
        return "/".join([self.prefix, *segs] if self.prefix else segs)

    async def _call(self, method: str, **kwargs: Any) -> Any:
        fs = self.fs
        return await self.retry.run(
            lambda: fs._call_s3(method, Bucket=self.bucket, **kwargs), body=kwargs.get("Body"))

    def call(self, method: str, **kwargs: Any) -> Any:
        """One S3 API call on s3fs's loop, blocking the calling thread;
        retried by ``self.retry`` (s3retry)."""
        return sync(self.fs.loop, self._call, method, **kwargs)

    def submit(self, method: str, **kwargs: Any) -> Future[Any]:
        """Start one S3 API call on s3fs's loop without waiting for it
        (retried like :meth:`call`)."""
        return asyncio.run_coroutine_threadsafe(self._call(method, **kwargs), self.fs.loop)

    async def _get(self, key: str) -> tuple[bytes, str]:
        """GET and read the whole body, retried as one request (a body cut
        short is sent for again)."""
        fs = self.fs

        async def once() -> tuple[bytes, str]:
            resp = await fs._call_s3("get_object", Bucket=self.bucket, Key=self._key(key))
            async with resp["Body"] as body:
                data = await body.read()
            return data, resp["ETag"]

        return await self.retry.run(once)

    def _multipart_checksum(self) -> dict[str, str]:
        """Extra arguments of a multipart upload: CRC32 parts, as boto3 does,
        unless the client computes request checksums only when required."""
        client = sync(self.fs.loop, self.fs.set_session)
        if getattr(client.meta.config, "request_checksum_calculation", None) == "when_supported":
            return {"ChecksumAlgorithm": "CRC32"}
        return {}

    def _conditional_put(self, key: str, data: bytes, **condition: str) -> None:
        """PUT with a precondition and a write token (``WRITE_TOKEN``); retry
        S3's 409 ConditionalRequestConflict.

        Raises:
            ObjectExistsError: the precondition failed. Its ``retried`` attribute
                is True when the request had been sent more than once (here or by
                botocore), so the 412 may answer our own first attempt that
                landed: only then may a caller ask :meth:`own_write` with the
                error's ``token``.
        """
        require_conditional_writes(self)
        token = s3upload.write_token()
        if "IfMatch" in condition:
            condition = {**condition, "IfMatch": etag_as_sent(self, condition["IfMatch"])}
        for attempt in range(5):
            try:
                self.call("put_object", Key=self._key(key), Body=data,
                          Metadata={s3upload.WRITE_TOKEN: token}, **condition)
                return
            except Exception as exc:
                code = s3_error_code(exc)
                if code in _RETRYABLE_CONDITIONAL and attempt < 4:
                    time.sleep(0.05 * 2**attempt)
                    continue
                if code in ("PreconditionFailed", "412") or isinstance(exc, FileExistsError):
                    err = ObjectExistsError(f"{key}: precondition failed", key=key)
                    err.retried = (  # type: ignore[attr-defined]
                        attempt > 0 or s3upload._retries(exc) > 0)
                    err.token = token  # type: ignore[attr-defined]
                    raise err from exc
                with self._translated(key):
                    raise

    # -- primitives --------------------------------------------------------------

    def open_read(self, key: str) -> IO[bytes]:
        """A seekable reader whose every read is a ranged GET checked to
        answer 206 with the requested ``Content-Range`` (s3fs's own file
        takes a 200 with the whole object as the range), buffered by
        ``PART_SIZE`` bytes of read-ahead."""
        size = self.info(key).size
        return io.BufferedReader(RangeReader(self, key, size),  # type: ignore[return-value]
                                 buffer_size=s3upload.PART_SIZE)

    def _ranged_body(self, key: str, start: int, end: int) -> Any | None:
        """The body of a GET of bytes ``[start, end)``; None when ``start`` is
        at or past the end of the object (S3 answers 416)."""
        try:
            resp = self.call("get_object", Key=self._key(key), Range=f"bytes={start}-{end - 1}")
        except Exception as exc:
            if s3_error_code(exc) in ("InvalidRange", "416") or "not satisfiable" in str(exc):
                return None
            with self._translated(key):
                raise
        self._check_range(key, resp, start, end)
        return resp["Body"]

    def _check_range(self, key: str, resp: dict[str, Any], start: int, end: int) -> None:
        """A ranged GET must answer 206 with ``Content-Range: bytes
        start-last/total`` (``last`` = ``end - 1``, or the object's last byte):
        a server or proxy that ignores ``Range`` answers 200 with the whole
        object, which must never be taken for the range (issue 13 item 11)."""
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
        got = str(resp.get("ContentRange") or "")
        if not range_answer_ok(status, got, start, end):
            resp["Body"].close()
            raise StorageError(
                f"{self.url_of(key)} in {self.where}: a GET of bytes {start}-{end - 1} was "
                f"answered {status} with Content-Range {got or '(none)'}: the server or a "
                "proxy ignores Range requests, which the registry needs", key=key)

    def _stream(self, key: str, body: Any, chunk: int) -> Iterator[bytes]:
        """Yield ``body`` in blocks of at most ``chunk`` bytes; closes it."""
        try:
            while True:
                with self._translated(key):
                    block = sync(self.fs.loop, body.read, chunk)
                if not block:
                    return
                yield block
        finally:
            body.close()

    def read_range(self, key: str, start: int, end: int) -> bytes:
        body = self._ranged_body(key, start, end)
        if body is None:
            return b""

        async def _read() -> bytes:
            async with body:
                return await body.read()  # type: ignore[no-any-return]

        with self._translated(key):
            return sync(self.fs.loop, _read)  # type: ignore[no-any-return]

    def read_bytes(self, key: str, *, limit: int | None = None) -> bytes:
        """One streamed GET, stopped after ``limit`` bytes (see
        :meth:`Store.read_bytes`)."""
        return self.read_streamed(key, limit=limit)

    def iter_read(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """Stream ``key`` with one GET (not a ranged request per block, as a
        buffered s3fs file would): one round trip, and servers that read the
        whole object for every range request are not penalized."""
        with self._translated(key):
            resp = self.call("get_object", Key=self._key(key))
        yield from self._stream(key, resp["Body"], chunk)

    def iter_range(self, key: str, start: int, end: int,
                   chunk: int = CHUNK) -> Iterator[bytes]:
        """Stream bytes ``[start, end)`` with one ranged GET (nothing when
        ``start`` is at or past the end of the object)."""
        if end <= start:
            return
        body = self._ranged_body(key, start, end)
        if body is not None:
            yield from self._stream(key, body, chunk)

    def open_write(self, key: str, *, exclusive: bool = False,
                   size: int | None = None) -> IO[bytes]:
        """``size``: the object's size, or an upper bound on it, when known
        up front: every part but the last is ``s3upload.part_size_for(size)`` bytes;
        without it ``PART_SIZE`` (at most ``MAX_PARTS`` of them). Raises
        UsageError for an object over 5 TiB, before anything is sent, or
        when an upload of unknown size outgrows ``MAX_PARTS`` parts."""
        if exclusive:
            require_conditional_writes(self)
        return s3upload._MultipartWriter(self, key, exclusive=exclusive,  # type: ignore[return-value]
                                size=size)

    def abort_stale_uploads(self, older_than: float, *, dry_run: bool = False,
                            keep: Any = None, doomed: Any = None,
                            warn: Any = None, orphan: Any = None,
                            orphan_after: float = 0.0) -> list[str]:
        """Abort the multipart uploads under this store's prefix that nobody will
        complete (:func:`registry.store.s3abort.abort_stale_uploads`: by the
        server's clock; ``keep``, ``doomed``, ``orphan`` and ``warn`` as there)."""
        return abort_stale_uploads(self, older_than, dry_run=dry_run, keep=keep,
                                   doomed=doomed, warn=warn, orphan=orphan,
                                   orphan_after=orphan_after)

    def own_write(self, key: str, token: str, *, data: bytes | None = None,
                  etag: str | None = None) -> bool:
        """Whether the object at ``key`` is the one a write with ``token``
        made (a retried conditional request answered 412 or NoSuchUpload
        because its own first attempt landed). The write token decides; a
        server that keeps no user metadata falls back to ``etag`` (what an
        MD5 server would answer) or the content ``data``."""
        try:
            head = self.call("head_object", Key=self._key(key))
        except Exception:  # noqa: BLE001 - not there, or unreadable: not ours
            return False
        meta = {k.lower(): v for k, v in (head.get("Metadata") or {}).items()}
        if s3upload.WRITE_TOKEN in meta:
            return bool(meta[s3upload.WRITE_TOKEN] == token)
        if etag is not None and head.get("ETag") == etag:
            return True
        return data is not None and self._content(key) == data

    def _own_after(self, e: ObjectExistsError, key: str, data: bytes) -> bool:
        # Asked after every 412, not only after a retry we counted: the HTTP
        # client re-sends a request whose pooled connection dropped before
        # the answer (aiohttp does, under the same invocation), unseen here.
        # Without a token on the server, equal bytes count only after a retry.
        retried = bool(getattr(e, "retried", False))
        return self.own_write(key, getattr(e, "token", ""), data=data if retried else None)

    def create(self, key: str, data: bytes) -> None:
        try:
            self._conditional_put(key, data, IfNoneMatch="*")
        except ObjectExistsError as e:
            if not self._own_after(e, key, data):
                raise ObjectExistsError(f"{key}: already exists", key=key) from None

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        with self._translated(key):
            return sync(self.fs.loop, self._get, key)  # type: ignore[no-any-return]

    def _content(self, key: str) -> bytes | None:
        try:
            return self.read_versioned(key)[0]
        except ObjectNotFoundError:
            return None

    def swap(self, key: str, data: bytes, expected: str | None) -> None:
        # A 412 is a lost race -- unless the request was retried and our own
        # first attempt is what made the precondition fail; only then is
        # finding our write token in place proof of success (equal bytes are
        # not: two writers moving a counter write the same next value).
        # An If-Match on a key deleted meanwhile is a 404 (NoSuchKey) on AWS and
        # moto: the object changed, as the contract says, not a missing file.
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        try:
            self._conditional_put(key, data, **condition)
        except ObjectExistsError as e:
            if not self._own_after(e, key, data):
                raise PointerConflictError(key, expected=expected, actual="(changed)") from None
        except ObjectNotFoundError:
            if expected is None:
                raise
            raise PointerConflictError(key, expected=expected, actual=None) from None

    def object_state(self, key: str) -> ObjectState:
        """ETag, VersionId and every whole-object checksum of ``key`` (one HEAD
        with ``ChecksumMode=ENABLED``; registry.host.sourcecheck.object_state)."""
        with self._translated(key):
            resp = self.call("head_object", Key=self._key(key), ChecksumMode="ENABLED")
        return object_state(resp)

    def info(self, key: str) -> ObjectInfo:
        with self._translated(key):
            resp = self.call("head_object", Key=self._key(key))
        return ObjectInfo(key, int(resp["ContentLength"]), resp["LastModified"].timestamp())

    def _list(self, prefix: str, delimiter: str) -> Iterator[dict[str, Any]]:
        """Every page of a ListObjectsV2 of ``prefix/``. An error is raised,
        never an empty answer: only a listing the server answered is empty."""
        base = self._key(prefix)
        args: dict[str, Any] = {"Prefix": base + "/" if base else ""}
        if delimiter:
            args["Delimiter"] = delimiter
        while True:
            with self._translated(prefix or "/"):
                page = self.call("list_objects_v2", **args)
            self._bucket_seen = True
            yield page
            if not page.get("IsTruncated"):
                return
            args["ContinuationToken"] = page["NextContinuationToken"]

    def list_dir(self, prefix: str) -> list[tuple[str, bool]]:
        """Zero-byte "folder" markers (keys ending in ``/``, made by consoles'
        "Create folder") are not objects: they are skipped, and a folder that
        holds only a marker lists as empty."""
        out: dict[str, bool] = {}
        for page in self._list(prefix, "/"):
            for d in page.get("CommonPrefixes", []):
                out[d["Prefix"].rstrip("/").rsplit("/", 1)[-1]] = True
            for o in page.get("Contents", []):
                if not o["Key"].endswith("/"):
                    out.setdefault(o["Key"].rsplit("/", 1)[-1], False)
        return sorted(out.items())

    def walk_files(self, prefix: str) -> dict[str, int]:
        """Folder markers (keys ending in ``/``) are skipped."""
        base = self._key(prefix)
        cut = len(base) + 1 if base else 0
        out = {}
        for page in self._list(prefix, ""):
            for o in page.get("Contents", []):
                if not o["Key"].endswith("/"):
                    out[o["Key"][cut:]] = int(o["Size"])
        return dict(sorted(out.items()))

    def walk_versions(self, prefix: str) -> dict[str, tuple[int, str | None]]:
        base = self._key(prefix)
        cut = len(base) + 1 if base else 0
        out: dict[str, tuple[int, str | None]] = {}
        for page in self._list(prefix, ""):
            for o in page.get("Contents", []):
                if not o["Key"].endswith("/"):
                    out[o["Key"][cut:]] = (int(o["Size"]), str(o.get("ETag", "")).strip('"')
                                           or None)
        return dict(sorted(out.items()))

    def delete(self, key: str) -> None:
        with self._translated(key):
            self.call("delete_object", Key=self._key(key))

    def delete_prefix(self, prefix: str) -> None:
        """Folder markers under ``prefix`` go too."""
        keys = [o["Key"] for page in self._list(prefix, "") for o in page.get("Contents", [])]
        for i in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[i:i + 1000]]
            with self._translated(prefix):
                resp = self.call("delete_objects", Delete={"Objects": batch, "Quiet": True})
            if resp.get("Errors"):
                first = resp["Errors"][0]
                raise StorageError(f"{self.url_of(first.get('Key', prefix))} in {self.where}: "
                                   f"delete failed ({first.get('Code')})", key=prefix)
        self.delete(prefix)


def _filesystem(options: dict[str, Any]) -> s3fs.S3FileSystem:
    """An s3fs filesystem that does not retry (the store does: s3retry), on a
    botocore session that shares the process's parsed service models
    (s3session); a ``session`` in ``options`` is used as given."""
    fs = s3fs.S3FileSystem(**options)
    fs.retries = 1
    if fs.session is None:
        # What s3fs's set_session would create, owned by s3fs as before (a
        # refresh replaces it), with the shared loader.
        fs.session = s3session.new_session(**fs.kwargs)
        fs._session_is_owned = True
    return fs

