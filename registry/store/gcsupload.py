"""Uploads to GCS: the streaming writer behind ``GCSStore.open_write``.

An object smaller than one chunk goes up as one multipart upload. A larger one
is a resumable upload: GCS takes a resumable session's chunks in order, one
at a time, so "parallel" here means the next chunk is filled (and hashed)
while the previous one is on the wire; several files go up at once
(``GCSStore.files_in_flight``). Chunks start at ``CHUNK`` (8 MiB) and double
up to ``MAX_CHUNK`` (64 MiB): a large file goes up in few requests (gcsfs
sends 50 MiB chunks, google-cloud-storage 100 MiB), and fake-gcs-server,
which hashes the whole upload so far again at every chunk, does not spend
time quadratic in 8 MiB steps (docs/decisions.md, "GCS chunk size").
Memory: two chunks per writer, at most 128 MiB.

Integrity, as the S3 store's per-part CRC32s give it there: every chunk's
answer must say the service holds exactly the bytes sent so far (a short
``Range`` is sent again from where it ends), and the finished object's
``crc32c`` and size must be the CRC32C and length of every byte written; an
object that does not match is deleted (only that generation) and the write
fails. An exclusive write sets ``ifGenerationMatch=0`` on the session, which
GCS checks when the last chunk lands (and, where the probe found that
ignored, looks for an object at the name before the last chunk).

CRC32C, not MD5: GCS gives every object a ``crc32c`` (a composite object has
no ``md5Hash``), and google-crc32c (a dependency of gcsfs, through
google-cloud-storage) computes it in C with the CPU's CRC instruction, about
ten times faster than MD5 here: MD5 was the largest client-side cost of a commit
after the SHA-256 the protocol needs anyway.
"""

from __future__ import annotations

import base64
import io
import json
import os
from concurrent.futures import Future
from typing import Any

import gcsfs.core
import google_crc32c

from registry.errors import ObjectExistsError, ObjectNotFoundError, StorageError
from registry.store import condprobe
from registry.store.base import CommitsOnExit

#: bytes of a resumable upload's first chunk, doubled at each chunk up to
#: ``MAX_CHUNK`` (both multiples of 256 KiB, as GCS requires); an object
#: under ``CHUNK`` is one multipart upload.
CHUNK = 8 * 1024 * 1024
MAX_CHUNK = 64 * 1024 * 1024


class GCSWriter(CommitsOnExit):
    """``write`` copies into the chunk being filled; a full chunk is sent
    while the caller goes on. ``close`` finishes the object (durable on
    return); ``discard`` cancels the session. ``etag`` is the finished
    object's generation (what a listing's version token is)."""

    # ``store``: a registry.store.gcs.GCSStore (not imported: the store imports this module).
    def __init__(self, store: Any, key: str, *, exclusive: bool = False,
                 force_resumable: bool = False, probing: bool = False) -> None:
        self.store, self.key, self.exclusive = store, key, exclusive
        self._force = force_resumable
        self._probing = probing
        self._token = "probe" if probing else os.urandom(16).hex()
        self._buf = bytearray()
        self._chunk = CHUNK  # the size of the next chunk sent
        self._crc = google_crc32c.Checksum()  # of every piece sent (bytes: it takes no view)
        self._sent = 0
        self._session: str | None = None
        self._inflight: tuple[Future[Any], int, bytes] | None = None
        self.closed = False
        self.etag: str | None = None

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        self._buf += view
        while len(self._buf) >= self._chunk + 1:  # keep one byte back: the last chunk says the size
            with memoryview(self._buf) as whole:
                piece = bytes(whole[:self._chunk])  # one copy, not a slice then a copy
            self._crc.update(piece)
            del self._buf[:self._chunk]
            self._send(piece)
            self._chunk = min(self._chunk * 2, MAX_CHUNK)
        return len(view)

    # -- the resumable session -----------------------------------------------------

    def _open_session(self) -> None:
        params: dict[str, Any] = {"uploadType": "resumable"}
        if self.exclusive:
            params["ifGenerationMatch"] = "0"
        store = self.store
        url = (f"{store.endpoint}/upload/storage/v1/b/{gcsfs.core.quote(store.bucket)}/o"
               f"?name={gcsfs.core.quote(store._name(self.key))}")
        with store._translated(self.key):
            _, headers, _ = store.call(
                "POST", url, headers={"X-Upload-Content-Type": "application/octet-stream"},
                json_body={"name": store._name(self.key),
                           "metadata": {"registry-write": self._token}}, **params)
        location = headers.get("Location")
        if not location:
            raise StorageError(f"{store.url_of(self.key)} in {store.where}: the service "
                               "opened no resumable upload session (no Location)", key=self.key)
        self._session = location

    def _put(self, data: bytes, offset: int, total: int | None) -> Future[Any]:
        last = offset + len(data) - 1
        span = f"bytes {offset}-{last}" if data else "bytes *"
        return self.store.submit("PUT", self._session or "", headers={
            "Content-Range": f"{span}/{total if total is not None else '*'}",
            "Content-Length": str(len(data))}, data=io.BytesIO(data))

    def _settle(self) -> Any:
        """Wait for the chunk in flight; send again what the service did not
        keep. Returns the final answer's object resource, or None."""
        if self._inflight is None:
            return None
        fut, offset, data = self._inflight
        self._inflight = None
        while True:
            with self.store._translated(self.key):
                status, headers, body = fut.result()
            if status in (200, 201):
                return json.loads(body)
            kept = headers.get("Range", "")
            held = int(kept.rsplit("-", 1)[1]) + 1 if kept else 0
            if held >= offset + len(data):
                return None
            if held < offset:
                raise StorageError(f"{self.store.url_of(self.key)} in {self.store.where}: the "
                                   f"service lost bytes of a resumable upload (holds {held}, "
                                   f"had {offset})", key=self.key)
            data, offset = data[held - offset:], held
            fut = self._put(data, offset, None)

    def _send(self, piece: bytes) -> None:
        if self._session is None:
            self._open_session()
        self._settle()
        self._inflight = (self._put(piece, self._sent, None), self._sent, piece)
        self._sent += len(piece)

    # -- finishing -----------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self._session is None and not self._force:
                obj = self._simple()
            else:
                if self._session is None:
                    self._open_session()
                self._settle()
                if self.exclusive and not self._probing and not condprobe.large_conditions(
                        self.store):
                    self._refuse_if_present()
                total = self._sent + len(self._buf)
                last = bytes(self._buf)
                self._crc.update(last)
                self._inflight = (self._put(last, self._sent, total), self._sent, last)
                try:
                    obj = self._settle()
                except ObjectExistsError:
                    obj = self._own_or_raise()
                self._session = None
            self._check(obj)
        except BaseException:
            self.discard()
            raise

    def _refuse_if_present(self) -> None:
        """Where the service ignores ``ifGenerationMatch=0`` on resumable
        uploads (fake-gcs-server; condprobe step 5): look before the last
        chunk. Not atomic; the commit's read-back of every file's generation
        is what catches a writer that lands over another's file."""
        try:
            self.store.object_json(self.key)
        except ObjectNotFoundError:
            return
        raise ObjectExistsError(
            f"{self.store.url_of(self.key)}: another object is already there; a writer that "
            "lost its claim never replaces a file of a directory another writer owns",
            key=self.key)

    def _simple(self) -> dict[str, Any]:
        store = self.store
        try:
            with store._translated(self.key):
                data = bytes(self._buf)
                self._crc.update(data)
                return store.upload(self.key, data, token=None,
                                    write_token=self._token, conditional=self.exclusive)
        except ObjectExistsError:
            return self._own_or_raise()

    def _own_or_raise(self) -> dict[str, Any]:
        """After a 412: the object is ours when it carries this writer's token
        (a retried request whose first try landed), else another writer's."""
        if self.store.own_write(self.key, self._token):
            return self.store.object_json(self.key)
        raise ObjectExistsError(
            f"{self.store.url_of(self.key)}: another object is already there; a writer that "
            "lost its claim never replaces a file of a directory another writer owns",
            key=self.key) from None

    def _check(self, obj: dict[str, Any] | None) -> None:
        """The finished object must hold exactly what was written."""
        store = self.store
        if obj is None:
            obj = store.object_json(self.key)
        size = self._sent + len(self._buf)
        want = base64.b64encode(self._crc.digest()).decode()
        got = obj.get("crc32c")
        if int(obj.get("size", -1)) != size or got != want:
            try:
                store.call("DELETE", "b/{}/o/{}", store.bucket, store._name(self.key),
                           ifGenerationMatch=str(obj.get("generation")))
            except Exception:  # noqa: BLE001 - best effort; the write fails anyway
                pass
            raise StorageError(
                f"{store.url_of(self.key)} in {store.where}: the stored object does not hold "
                f"what was written ({obj.get('size')} bytes, crc32c {got}; sent {size} "
                f"bytes, crc32c {want}); removed", key=self.key)
        self.etag = str(obj.get("generation") or "") or None

    def discard(self) -> None:
        """Cancel the resumable session, if one is open (best effort: an
        abandoned session expires after a week and holds nothing visible)."""
        self.closed = True
        if self._inflight is not None:
            self._inflight[0].cancel()
            self._inflight = None
        session, self._session = self._session, None
        if session is not None:
            try:
                self.store.call("DELETE", session)
            except Exception:  # noqa: BLE001 - GCS answers 499 to a cancel
                pass

