"""Uploads to Azure Blob Storage: the streaming writer behind ``AzureStore.open_write``.

An object smaller than one block is one Put Blob. A larger one is a block
blob: each full block is staged (Put Block) while the caller fills the next,
up to :data:`MAX_INFLIGHT` blocks at once across the store's writers, and
the blob appears only when Put Block List commits them, with the write's
condition (``If-None-Match: *`` for an exclusive write) and its write token.

Integrity, as the S3 store's per-part CRC32s give it there: every block is
sent with its MD5 (``validate_content``: ``Content-MD5``, which the service
checks before it keeps the block), and the committed blob's size must be
the number of bytes written. Staged blocks that are never committed are
discarded by the service after a week and are never visible.
"""

from __future__ import annotations

import base64
import io
import os
import threading
from collections import deque
from concurrent.futures import Future
from typing import Any

from azure.storage.blob import BlobBlock

from registry.errors import ObjectExistsError, StorageError
from registry.store.base import CommitsOnExit

#: bytes per staged block, and blocks in flight per store.
BLOCK = 8 * 1024 * 1024
MAX_INFLIGHT = 8
_SLOTS_LOCK = threading.Lock()


def _slots(store: Any) -> threading.BoundedSemaphore:
    """The store's budget of blocks in flight, across its writers (memory bound)."""
    with _SLOTS_LOCK:
        slots = store.__dict__.get("_block_slots")
        if slots is None:
            slots = store.__dict__["_block_slots"] = threading.BoundedSemaphore(MAX_INFLIGHT)
        return slots  # type: ignore[no-any-return]


class BlockWriter(CommitsOnExit):
    """``write`` copies into the block being filled; ``close`` commits the
    blob (durable on return); ``discard`` leaves nothing visible. ``etag``:
    the committed blob's ETag, quotes stripped (a listing's version token)."""

    # ``store``: a registry.store.azure.AzureStore (not imported: the store imports this module).
    def __init__(self, store: Any, key: str, *, exclusive: bool = False,
                 force_blocks: bool = False) -> None:
        self.store, self.key, self.exclusive = store, key, exclusive
        self._force = force_blocks
        self._token = os.urandom(16).hex()
        self._buf = bytearray()
        self._blocks: list[str] = []
        self._pending: deque[Future[Any]] = deque()
        self._size = 0
        self.closed = False
        self.etag: str | None = None

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        self._buf += view
        self._size += len(view)
        while len(self._buf) >= BLOCK:
            piece = bytes(self._buf[:BLOCK])
            del self._buf[:BLOCK]
            self._stage(piece)
        return len(view)

    def _stage(self, piece: bytes) -> None:
        block_id = base64.b64encode(f"{len(self._blocks):08d}-{self._token[:8]}".encode()).decode()
        self._blocks.append(block_id)
        while len(self._pending) >= MAX_INFLIGHT:
            self._reap()
        blob = self.store.blob(self.key)
        slots = _slots(self.store)
        slots.acquire()

        async def once() -> None:
            # A stream, not bytes: aiohttp warns (and would block its loop
            # copying) for a large bytes body.
            await blob.stage_block(block_id, io.BytesIO(piece), length=len(piece),
                                   validate_content=True, retry_total=0)

        try:
            fut = self.store.submit(once)
        except BaseException:
            slots.release()
            raise
        fut.add_done_callback(lambda _: slots.release())
        self._pending.append(fut)

    def _reap(self) -> None:
        fut = self._pending.popleft()
        with self.store._translated(self.key):
            fut.result()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if not self._blocks and not self._force:
                self._finish(lambda: self._put_whole())
            else:
                if self._buf or not self._blocks:
                    self._stage(bytes(self._buf))
                self._buf = bytearray()
                while self._pending:
                    self._reap()
                self._finish(lambda: self._commit())
        except BaseException:
            self.discard()
            raise

    def _put_whole(self) -> str:
        return self.store.upload(self.key, bytes(self._buf), token=None,
                                 write_token=self._token, conditional=self.exclusive)

    def _commit(self) -> str:
        blob = self.store.blob(self.key)
        kwargs: dict[str, Any] = {"metadata": {"registry_write": self._token}, "retry_total": 0}
        if self.exclusive:
            kwargs["headers"] = {"If-None-Match": "*"}
        blocks = [BlobBlock(block_id=b) for b in self._blocks]

        async def once() -> str:
            resp = await blob.commit_block_list(blocks, **kwargs)
            return str(resp["etag"]).strip('"')

        return self.store.run(once)

    def _finish(self, request: Any) -> None:
        """Make the blob visible; a refused condition is success only when the
        blob there carries this writer's token (a retried request whose first
        try landed), else another writer's blob is there."""
        store = self.store
        try:
            with store._translated(self.key):
                self.etag = request()
        except ObjectExistsError:
            if not store.own_write(self.key, self._token):
                raise ObjectExistsError(
                    f"{store.url_of(self.key)}: another object is already there; a writer "
                    "that lost its claim never replaces a file of a directory another writer "
                    "owns", key=self.key) from None
            self.etag = store.version_of(self.key)
        if not self._blocks:
            return  # one Put Blob: its body was the whole object
        size = store.info(self.key).size
        if size != self._size:
            raise StorageError(f"{store.url_of(self.key)} in {store.where}: the committed blob "
                               f"holds {size} bytes, {self._size} were written", key=self.key)

    def discard(self) -> None:
        """Stop staging; uncommitted blocks are never visible (the service
        drops them after a week)."""
        self.closed = True
        while self._pending:
            self._pending.popleft().cancel()

