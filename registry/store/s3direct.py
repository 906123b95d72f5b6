"""Ranged GETs of an S3 store read straight into caller memory, on many connections.

Why (issue 43, items 8-9). :class:`registry.store.s3.S3Store` speaks S3 through
s3fs: every request and every body byte goes through one asyncio event-loop
thread (aiohttp), and each block arrives as a new ``bytes`` object that the
caller copies again into place. A verified load of a 1 GiB release spent three
times as long as ``s5cmd cp`` that way. Here each reading thread has its own
synchronous botocore client (its own urllib3 connections), sends one ranged GET
and receives the body with ``readinto`` straight into the memory that will hold
the bytes (a tensor being built): one kernel-to-user copy, the GIL released
while the socket is read, no event loop in between.

The client is built from the same options as the store's s3fs filesystem
(credentials, endpoint, region, botocore config: timeouts, no payload signing,
one attempt: :class:`registry.load.pieces.PieceReader` retries a failed piece
from its start). Answers are checked as the store checks them (a ranged GET
must answer 206 with the asked ``Content-Range``); errors are translated into
``registry.errors`` (:mod:`registry.store.translate`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from registry.errors import StorageError
from registry.store.translate import s3_error_code

#: connections the client keeps (one request at a time per reading thread)
POOL_CONNECTIONS = 64


class DirectReader:
    """A synchronous botocore client of one :class:`~registry.store.s3.S3Store`,
    shared by the reading threads (botocore clients are thread-safe; each
    request takes a connection of its own from the client's pool)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._session: Any = None
        self._shared: Any = None

    def _client(self) -> Any:
        with self._lock:
            if self._shared is None:
                self._shared = self._new_client()
            return self._shared

    def _new_client(self) -> Any:
        import botocore.session
        from botocore.config import Config

        fs = self.store.fs
        if self._session is None:
            self._session = botocore.session.Session(profile=(fs.kwargs or {}).get("profile"))
        client_kwargs = dict(fs.client_kwargs or {})
        init: dict[str, Any] = {"aws_access_key_id": fs.key, "aws_secret_access_key": fs.secret,
                                "aws_session_token": fs.token, "endpoint_url": fs.endpoint_url}
        init = {k: v for k, v in init.items() if v is not None and k not in client_kwargs}
        if "use_ssl" not in client_kwargs:
            init["use_ssl"] = fs.use_ssl
        config = {k: v for k, v in fs._prepare_config_kwargs().items()
                  if k in Config.OPTION_DEFAULTS}
        config["max_pool_connections"] = POOL_CONNECTIONS
        if fs.anon:
            from botocore import UNSIGNED

            for k in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token"):
                init.pop(k, None)
                client_kwargs.pop(k, None)
            config["signature_version"] = UNSIGNED
        return self._session.create_client("s3", config=Config(**config), **init,
                                           **client_kwargs)

    def read_into(self, key: str, start: int, segments: list[tuple[int, int, memoryview]]
                  ) -> Iterator[memoryview]:
        """GET bytes ``[segments[0].start, segments[-1].end)`` of ``key`` and
        receive them into each segment's view in order, yielding each filled
        part (shorter at the object's end, then nothing more). The next
        segment is received while the caller holds the last one yielded, never
        further ahead: segments two apart may share memory.

        Raises:
            ObjectNotFoundError, StoragePermissionError: as the store's GET.
            StorageError: a failed request, a range the server ignored, or a
                connection lost mid-body.
        """
        if not segments:
            return
        end = segments[-1][1]
        store = self.store
        try:
            with store._translated(key):
                resp = self._client().get_object(Bucket=store.bucket, Key=store._key(key),
                                                 Range=f"bytes={start}-{end - 1}")
        except StorageError as e:
            # the server's answer, not words of the message: a message names the
            # endpoint, whose port may read 416 (a reset taken for the object's end)
            if s3_error_code(e) in ("InvalidRange", "416") or "not satisfiable" in str(e):
                return
            raise
        store._check_range(key, resp, start, end)
        body = resp["Body"]
        raw = getattr(body, "_raw_stream", None)
        fp = getattr(raw, "_fp", None)
        direct = fp is not None and hasattr(fp, "readinto") and not resp.get("ContentEncoding")
        # A helper thread receives while the caller hashes what already landed
        # (the socket keeps draining); it is joined before this returns, so it
        # never writes into the segments after the caller is done with them.
        filled: queue.SimpleQueue[Any] = queue.SimpleQueue()
        stop = threading.Event()
        # at most one segment ahead of the caller: segments may share memory
        # two apart (registry.load.pieces' scratch halves)
        credit = threading.Semaphore(2)

        def receive() -> None:
            try:
                for _s, _e, view in segments:
                    while not credit.acquire(timeout=0.5):
                        if stop.is_set():
                            return
                    got = 0
                    while got < len(view) and not stop.is_set():
                        n = fp.readinto(view[got:]) if direct else _copy_into(body, view[got:])
                        if not n:
                            break
                        got += n
                    if got:
                        filled.put(view[:got])
                    if got < len(view):
                        break
                filled.put(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                filled.put(exc)

        helper = threading.Thread(target=receive, name="s3-receive", daemon=True)
        helper.start()
        complete = False
        try:
            while True:
                item = filled.get()
                if item is None:
                    complete = True
                    return
                if isinstance(item, BaseException):
                    raise StorageError(f"{store.url_of(key)} in {store.where}: the connection "
                                       f"failed while reading bytes {start}-{end - 1}: {item}",
                                       key=key) from item
                yield item
                credit.release()  # the caller is done with that segment
        finally:
            stop.set()
            if not complete:
                body.close()  # ends a receive still waiting on the socket
            helper.join()
            if complete and direct:
                raw.release_conn()
            elif complete:
                body.close()


def _copy_into(body: Any, view: memoryview) -> int:
    block = body.read(min(len(view), 1 << 20))
    view[:len(block)] = block
    return len(block)


__all__ = ["DirectReader"]
