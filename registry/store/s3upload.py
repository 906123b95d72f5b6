"""Multipart uploads to S3: the streaming writer behind ``S3Store.open_write``.

Large objects are written with a multipart upload whose parts go out in
parallel on s3fs's event loop while the caller keeps producing (and hashing)
the next part, so hashing and network overlap. Memory is bounded by
``part_size * (max_inflight + 1)`` bytes. Part sizes follow S3's limits
(issue 13 item 2, :func:`part_size_for`). Every conditional write carries a
token (:data:`WRITE_TOKEN`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import uuid
import zlib
from collections import deque
from concurrent.futures import Future
from contextlib import AbstractContextManager
from threading import BoundedSemaphore
from typing import Any, Protocol

from registry.errors import ObjectExistsError, StorageError, UsageError
from registry.store.s3retry import attempts_of
from registry.store.translate import causes, s3_error_code
from registry.store.base import CommitsOnExit

#: boto3's TransferConfig defaults (8 MiB chunks, 10 at once): against the S3
#: test server they did as well as 16 MiB x 6 and hold less memory (88 MiB).
PART_SIZE = 8 * 1024 * 1024
MAX_INFLIGHT = 10
#: S3's limits on a multipart upload (issue 13 item 2).
MIN_PART, MAX_PART = 5 * 1024**2, 5 * 1024**3
MAX_PARTS, MAX_OBJECT = 10_000, 5 * 1024**4
#: Every part of an upload but the last has one size (Cloudflare R2 refuses
#: anything else; S3 allows it): chosen from the size, or an upper bound on
#: it, given to ``open_write``. Without either the parts are ``PART_SIZE``,
#: so such an upload holds at most ``MAX_PARTS * PART_SIZE`` bytes (78 GiB);
#: every writer of the registry that can bound its size passes the bound.

#: user metadata (``x-amz-meta-registry-write``) every conditional write
#: carries: a token unique to the write, by which a retried request whose
#: first answer was lost recognizes its own object, whatever the server's
#: ETags are (SSE-KMS and many S3-compatible servers: not an MD5).
WRITE_TOKEN = "registry-write"


class S3Store(Protocol):
    """What an upload needs of :class:`registry.store.s3.S3Store` (a protocol, so
    that the store imports this module and not the other way round)."""

    part_slots: BoundedSemaphore

    def call(self, method: str, **kwargs: Any) -> Any: ...

    def submit(self, method: str, **kwargs: Any) -> Future[Any]: ...

    def url_of(self, key: str) -> str: ...

    def own_write(self, key: str, token: str, *, data: bytes | None = None,
                  etag: str | None = None) -> bool: ...

    def _key(self, key: str) -> str: ...

    def _translated(self, key: str) -> AbstractContextManager[Any]: ...

    def _multipart_checksum(self) -> dict[str, str]: ...


def part_size_for(size: int) -> int:
    """The part size of an upload of at most ``size`` bytes:
    ``PART_SIZE``, or the smallest whole MiB that fits the file in
    ``MAX_PARTS`` parts.

    Raises:
        UsageError: ``size`` is over S3's 5 TiB object limit.
    """
    if size > MAX_OBJECT:
        raise UsageError(f"{size} bytes: over S3's limit of {MAX_OBJECT} bytes per object")
    need = -(-size // MAX_PARTS)
    mib = 1024 * 1024
    return min(MAX_PART, max(PART_SIZE, -(-need // mib) * mib))


def write_token() -> str:
    return uuid.uuid4().hex


def _retries(exc: BaseException) -> int:
    """How many times the request that ended in ``exc`` was re-sent (by the
    store's retry policy, or botocore's when a caller configured one)."""
    for seen in causes(exc):
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            botocore = int(response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0)
            return attempts_of(exc) - 1 + botocore
    return attempts_of(exc) - 1


class _MultipartWriter(CommitsOnExit):
    """Streaming writer: single PUT for small objects, parallel multipart otherwise.

    ``write`` returns as soon as the data is copied into the part being filled;
    a full part is handed to the upload as it is (an ``io.BytesIO`` that
    aiohttp streams from without copying it again) and a new one started. At
    most ``MAX_INFLIGHT`` parts are in flight across all writers of a store
    (``S3Store.part_slots``), so memory stays under
    ``PART_SIZE * (MAX_INFLIGHT + writers)`` bytes.

    Like boto3's ``upload_file``, a multipart upload declares CRC32 checksums
    when botocore computes request checksums anyway (its default,
    ``request_checksum_calculation="when_supported"``): S3 then checks every
    part and keeps a composite CRC32 of the object. The writer computes each
    part's CRC32 as the bytes arrive (zlib releases the GIL) and sends it with
    the part, so botocore does not re-read the part for it on the event loop,
    where it would hold up every other part in flight.
    """

    def __init__(self, store: S3Store, key: str, *, exclusive: bool = False,
                 size: int | None = None) -> None:
        self.store = store
        self.key = key
        self._fixed = part_size_for(size) if size is not None else PART_SIZE
        self._bounded = size is not None
        self._condition = {"IfNoneMatch": "*"} if exclusive else {}
        self._token = write_token()
        self._part = io.BytesIO()
        self._upload_id: str | None = None
        self._checksum: dict[str, str] = {}
        self._crc = 0
        self._parts: deque[tuple[int, Future[Any]]] = deque()
        self._done: list[dict[str, Any]] = []
        self.closed = False
        #: the ETag the server gave the completed object (quotes stripped):
        #: what a read-back before the commit compares against.
        self.etag: str | None = None

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        pos = 0
        while pos < n:
            target = self._part_size()
            take = min(target - self._part.tell(), n - pos)
            piece = view[pos:pos + take]
            self._part.write(piece)
            self._crc = zlib.crc32(piece, self._crc)
            pos += take
            if self._part.tell() >= target:
                self._send(self._part)
                self._part = io.BytesIO()
        return n

    def _part_size(self) -> int:
        """The size of every part but the last (one size: R2's rule)."""
        return self._fixed

    def _send(self, part: io.BytesIO) -> None:
        if len(self._done) + len(self._parts) >= MAX_PARTS:
            hint = ("" if self._bounded else
                    f"; its size was not given up front, which holds at most {MAX_PARTS} "
                    f"parts of {self._fixed} bytes: pass open_write(size=...) an upper bound")
            raise UsageError(f"{self.store.url_of(self.key)}: over {MAX_PARTS} parts "
                             f"(S3's limit); the upload is aborted{hint}")
        if self._upload_id is None:
            self._checksum = self.store._multipart_checksum()
            with self.store._translated(self.key):
                resp = self.store.call("create_multipart_upload", Key=self.store._key(self.key),
                                       Metadata={WRITE_TOKEN: self._token}, **self._checksum)
            self._upload_id = resp["UploadId"]
        number = len(self._done) + len(self._parts) + 1
        part.seek(0)
        checksum = dict(self._checksum)
        if checksum:
            checksum["ChecksumCRC32"] = base64.b64encode(self._crc.to_bytes(4, "big")).decode()
        self._crc = 0
        while len(self._parts) >= MAX_INFLIGHT:
            self._reap()
        slots = self.store.part_slots
        slots.acquire()  # freed as each part's request ends, whoever reaps it
        try:
            fut = self.store.submit("upload_part", Key=self.store._key(self.key),
                                    UploadId=self._upload_id, PartNumber=number, Body=part,
                                    **checksum)
        except BaseException:
            slots.release()
            raise
        fut.add_done_callback(lambda _: slots.release())
        self._parts.append((number, fut))

    def _reap(self) -> None:
        number, fut = self._parts.popleft()
        with self.store._translated(self.key):
            resp = fut.result()
        done = {"PartNumber": number, "ETag": resp["ETag"]}
        if self._checksum and "ChecksumCRC32" in resp:
            done["ChecksumCRC32"] = resp["ChecksumCRC32"]
        self._done.append(done)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        key = self.store._key(self.key)
        try:
            if self._upload_id is None:
                self._part.seek(0)
                self._finish("put_object", Key=key, Body=self._part,
                             Metadata={WRITE_TOKEN: self._token}, **self._condition)
                return
            if self._part.tell():
                self._send(self._part)
            self._part = io.BytesIO()
            while self._parts:
                self._reap()
            parts = sorted(self._done, key=lambda p: p["PartNumber"])
            self._finish("complete_multipart_upload", Key=key, UploadId=self._upload_id,
                         MultipartUpload={"Parts": parts}, **self._condition)
        except BaseException:
            self.discard()  # never leave a multipart upload open (billed, invisible)
            raise

    def _expected_etag(self) -> str:
        """The ETag S3 gives what this writer sent: the MD5 of a single PUT's
        body, or ``md5(part md5s)-<parts>`` for a multipart upload."""
        if self._upload_id is None:
            return '"' + hashlib.md5(self._part.getbuffer()).hexdigest() + '"'
        digests = b"".join(bytes.fromhex(p["ETag"].strip('"')) for p in sorted(
            self._done, key=lambda p: p["PartNumber"]))
        return f'"{hashlib.md5(digests).hexdigest()}-{len(self._done)}"'

    def _finish(self, method: str, **kwargs: Any) -> None:
        """The request that makes the object visible. A conditional one that
        fails (412, or NoSuchUpload for a completion) after it was sent more
        than once may be answering our own first attempt, which landed
        (a server that completed, then reported an error): the object then
        carries this writer's token (or, on a server that keeps no user
        metadata, exactly the ETag an MD5 server gives ours), and that is
        success, whatever form the server's ETags take."""
        try:
            with self.store._translated(self.key):
                resp = self.store.call(method, **kwargs)
            self.etag = str(resp.get("ETag") or "").strip('"') or None
            return
        except StorageError as e:
            code = s3_error_code(e)
            if code not in ("PreconditionFailed", "412", "NoSuchUpload"):
                raise
            retried = _retries(e) > 0 or code == "NoSuchUpload"
            if self.store.own_write(self.key, self._token,
                                    etag=self._expected_etag() if retried else None):
                self._upload_id = None  # completed: nothing to abort
                return
            if code == "NoSuchUpload":
                raise
            raise ObjectExistsError(
                f"{self.store.url_of(self.key)}: another object is already there; a writer "
                "that lost its claim never replaces a file of a directory another writer "
                "owns", key=self.key) from None
    def discard(self) -> None:
        self.closed = True
        for _, fut in self._parts:
            fut.cancel()
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            try:
                self.store.call("abort_multipart_upload", Key=self.store._key(self.key),
                                UploadId=upload_id)
            except Exception:  # best effort: the lifecycle rule reaps leftovers
                pass

