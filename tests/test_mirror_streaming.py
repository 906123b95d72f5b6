"""A cold file is sent piece by piece as each piece verifies (issue 51, item 3).

A real ``registry serve --mirror-cache`` fronts the session's moto S3 server
through the fault proxy, which holds the file's store stream after its first
pieces (``Action.hold``) for as long as a test needs. Nothing is timed:
while the store is held, a client has already read the first piece's bytes
and the mirror's cache still holds the fill as a partial (no blob), which a
mirror that waits for the whole file cannot do. Then the store is released
and every body is checked by its sha256; a later piece tampered in the
store cuts every response short (the client sees an error, never a short
body accepted as complete) and the fill is discarded.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.hub_util import PIECE, tiny_on_s3
from tests.support.faultproxy import Action, FaultProxy
from tests.test_hub_mirror import bytes_read, total
from tests.web_util import serve

W = "/registry/tiny/resolve/1/model.safetensors"
CLIENTS = 16
#: the server's S3 reads wait out a held stream (the default read timeout would
#: end the fill while a test inspects the server)
ENV = {"REGISTRY_S3_READ_TIMEOUT": "300"}
#: store bytes sent before the proxy holds the stream: three whole pieces
HELD_AT = 3 * PIECE


@pytest.fixture()
def release(s3_bucket: str, tmp_path: Path) -> tuple[str, Path, str]:
    url, src, digest = tiny_on_s3(s3_bucket, tmp_path, 5)
    assert (src / "model.safetensors").stat().st_size > HELD_AT + 2 * PIECE
    return url, src, digest


def _hold(proxy: FaultProxy, kind: str = "delay") -> threading.Event:
    """Hold every GetObject of the weights after HELD_AT bytes until set."""
    release = threading.Event()

    def rule(req: object) -> Action | None:
        if getattr(req, "op", "") == "GetObject" and \
                getattr(req, "key", "").endswith("model.safetensors"):
            return Action(kind, seconds=0.0, hold=release, hold_at=HELD_AT)
        return None
    proxy.rules.append(rule)
    return release


def _open(port: int, path: str = W, headers: dict[str, str] | None = None
          ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("GET", path, headers=headers or {})
    return conn, conn.getresponse()


def _read_exactly(r: http.client.HTTPResponse, n: int) -> bytes:
    out = b""
    while len(out) < n:
        block = r.read(n - len(out))
        assert block, f"the response ended after {len(out)} of {n} bytes"
        out += block
    return out


def _partials(cache: Path, sha256: str) -> list[Path]:
    return sorted((cache / "tmp").glob(f"{sha256}.*.incomplete"))


def _gauge(port: int, name: str) -> float:
    """One unlabelled sample of the server's ``/metrics``."""
    for line in _get(port, "/metrics")[1].decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"/metrics has no {name}")


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn, r = _open(port, path)
    try:
        return r.status, r.read()
    finally:
        conn.close()


@contextlib.contextmanager
def _mirror(url: str, proxy: FaultProxy, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """``registry serve --mirror-cache`` of ``url``, its store reads through
    ``proxy``, once the config has been served (the release's facts are warm):
    (port, cache folder)."""
    cache = tmp_path / "m"
    with serve(url, f"sqlite:///{tmp_path / 'i.db'}", "--mirror-cache", str(cache),
               env=ENV | {"AWS_ENDPOINT_URL": proxy.endpoint}) as base:
        port = int(base.rsplit(":", 1)[1])
        assert _get(port, "/registry/tiny/resolve/1/config.json")[0] == 200
        yield port, cache


def test_first_piece_goes_out_before_the_fill_ends_and_16_clients_get_right_bytes(
        release: tuple[str, Path, str], proxy: FaultProxy, tmp_path: Path) -> None:
    url, src, digest = release
    data = (src / "model.safetensors").read_bytes()
    with _mirror(url, proxy, tmp_path) as (port, cache):
        config_size = (src / "config.json").stat().st_size
        release_store = _hold(proxy)
        proxy.log.clear()
        opened = [_open(port) for _ in range(CLIENTS)]
        try:
            # every client has the first piece's bytes while the store is held
            for _conn, r in opened:
                assert r.status == 200
                assert r.getheader("Content-Length") == str(len(data))
                assert _read_exactly(r, PIECE) == data[:PIECE]
            # ... and the fill is still running: a partial, no blob yet
            assert _partials(cache, digest), list((cache / "tmp").iterdir())
            assert not (cache / "blobs" / "sha256" / digest).exists()
            # a range inside the verified pieces is answered while the store is held
            conn, r = _open(port, headers={"Range": f"bytes={PIECE + 5}-{2 * PIECE + 6}"})
            assert r.status == 206
            assert r.read() == data[PIECE + 5:2 * PIECE + 7]
            conn.close()
            # the JSON API answers while 16 clients wait on the held fill
            answered = sum(_get(port, "/api/v1/models")[0] == 200 for _ in range(5))
            assert answered == 5
            assert _partials(cache, digest)  # still held: nothing above waited for the fill
            # the cache admin and /metrics show the fill in progress and the free space
            ls = json.loads(run_cli("cache", "ls", "--cache", str(cache), "--json").stdout)
            assert ls["totals"]["partial_fills"] == 1 and ls["totals"]["partial_bytes"] > 0
            assert ls["disk"]["free_bytes"] > 0 and ls["disk"]["disk_bytes"] > 0
            assert _gauge(port, "registry_mirror_cache_partial_fills") == 1
            assert _gauge(port, "registry_mirror_cache_size_bytes") == config_size
        finally:
            release_store.set()

        def rest(i: int) -> str:
            conn, r = opened[i]
            try:
                return hashlib.sha256(data[:PIECE] + r.read()).hexdigest()
            finally:
                conn.close()

        with ThreadPoolExecutor(CLIENTS) as pool:
            assert list(pool.map(rest, range(CLIENTS))) == [digest] * CLIENTS
        # a client arriving later reads the blob; the store sent each byte once
        assert hashlib.sha256(_get(port, W)[1]).hexdigest() == digest
        proxy.wait_idle()
        assert total(bytes_read(proxy, "tiny/1/model.safetensors"), len(data)) == len(data)
        assert not _partials(cache, digest)
        assert _gauge(port, "registry_mirror_cache_partial_fills") == 0
        assert _gauge(port, "registry_mirror_cache_files") == 2
        assert _gauge(port, "registry_mirror_cache_size_bytes") == config_size + len(data)
        assert _gauge(port, "registry_mirror_cache_free_bytes") > 0
        text = run_cli("cache", "ls", "--cache", str(cache)).stdout
        assert "disk: " in text and " free of " in text, text


def test_a_tampered_later_piece_cuts_every_response_and_the_fill_is_discarded(
        release: tuple[str, Path, str], proxy: FaultProxy, tmp_path: Path) -> None:
    url, src, digest = release
    data = (src / "model.safetensors").read_bytes()
    with _mirror(url, proxy, tmp_path) as (port, cache):
        release_store = _hold(proxy, "corrupt")  # the last byte flipped: the last piece is bad
        opened = [_open(port) for _ in range(4)]
        try:
            for _conn, r in opened:
                assert r.status == 200
                assert _read_exactly(r, PIECE) == data[:PIECE]  # verified pieces only
            assert _partials(cache, digest)
        finally:
            release_store.set()
        for conn, r in opened:
            with pytest.raises(http.client.IncompleteRead) as cut:
                r.read()
            # never a byte of the bad piece: the response stops before it
            last = len(data) - (len(data) % PIECE or PIECE)
            assert PIECE + len(cut.value.partial) <= last
            assert data[:PIECE] + cut.value.partial == data[:PIECE + len(cut.value.partial)]
            conn.close()
        proxy.wait_idle()
        # the fill was discarded: no blob, no partial
        assert not (cache / "blobs" / "sha256" / digest).exists()
        assert not _partials(cache, digest)
        # the next request fills again from the same bad store: cut again, or refused
        conn, r = _open(port)
        try:
            if r.status == 200:
                with pytest.raises(http.client.IncompleteRead):
                    r.read()
            else:
                assert r.status == 409, r.read()
        finally:
            conn.close()
        proxy.wait_idle()
        assert not (cache / "blobs" / "sha256" / digest).exists()
