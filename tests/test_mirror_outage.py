"""The mirror through a store outage (issue 51, items 1, 2 and 6).

``registry serve --mirror-cache`` runs as a real process in front of the
session's moto S3 server through the fault proxy, whose log is the count of
requests the store got; the proxy takes the store down (connections reset),
makes it answer 500, or slows it. Every check is on status codes, headers,
the bytes' sha256 and the proxy's request log, never on a time.
"""

from __future__ import annotations

import hashlib
import http.client
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import run_cli
from tests.hub_util import index_db, publish, release_files, srcs
from tests.support.faultproxy import Action, FaultProxy
from tests.web_util import serve

REPO = "registry/tiny"
#: a failing store fails fast: one try, short timeouts
FAST = {"REGISTRY_S3_ATTEMPTS": "1", "REGISTRY_S3_RETRY_DELAY": "0",
        "REGISTRY_S3_CONNECT_TIMEOUT": "2", "REGISTRY_S3_READ_TIMEOUT": "10"}

DOWN = Action("reset")
FAILING = Action("error", status=500, code="InternalError")


def get(base: str, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection: status, headers (lower-case names), body."""
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        body = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body
    finally:
        conn.close()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hub_routes(rev: str) -> list[tuple[str, str]]:
    """(method, path) of every Hub route, for release ``rev`` of the test repo."""
    return [("GET", f"/api/models/{REPO}"), ("GET", f"/api/models/{REPO}/revision/{rev}"),
            ("GET", f"/api/models/{REPO}/tree/{rev}"),
            ("HEAD", f"/{REPO}/resolve/{rev}/config.json"),
            ("GET", f"/{REPO}/resolve/{rev}/config.json"),
            ("GET", f"/{REPO}/resolve/{rev}/model.safetensors"),
            ("GET", f"/{REPO}/resolve/{rev}/MANIFEST.json")]


def store_requests(proxy: FaultProxy) -> int:
    return len(list(proxy.log))


def _mirror(url: str, proxy: FaultProxy, tmp_path: Path, *flags: str) -> AbstractContextManager[str]:
    """``registry serve --mirror-cache`` of ``url`` with ``flags``, its store
    reads through ``proxy`` and failing fast (a context manager: the base URL)."""
    return serve(url, index_db(tmp_path), "--mirror-cache", str(tmp_path / "m"), *flags,
                 env={"AWS_ENDPOINT_URL": proxy.endpoint, **FAST})


def assert_serves(base: str, rev: str, files: dict[str, str]) -> None:
    """Each of ``files`` (name: sha256) is served whole at revision ``rev``."""
    for name, digest in files.items():
        status, _, body = get(base, f"/{REPO}/resolve/{rev}/{name}")
        assert status == 200 and sha(body) == digest, name


@pytest.mark.parametrize("fault", ["down", "500"])
def test_an_outage_is_a_retryable_503_on_every_route_never_a_missing_model(
        s3_bucket: str, proxy: FaultProxy, srcs: dict[str, Path], tmp_path: Path,
        fault: str) -> None:
    url = f"s3://{s3_bucket}/root"
    publish(url, srcs["1"], "tiny", "1")
    assert run_cli("alias", "set", "tiny", "prod", "1", "--store", url).returncode == 0
    assert run_cli("index", "rebuild", "--store", url, "--db", index_db(tmp_path)).returncode == 0
    with _mirror(url, proxy, tmp_path, "--fresh-for", "0", "--stale-for", "0") as base:
        # the store up: absence is still a 404 with the Hub's code
        status, headers, _ = get(base, "/api/models/registry/nope")
        assert (status, headers.get("x-error-code")) == (404, "RepoNotFound")
        proxy.rules.append(lambda r: DOWN if fault == "down" else FAILING)
        for method, path in [*hub_routes("prod"), *hub_routes("1")]:
            status, headers, body = get(base, path, method)
            assert status == 503, (path, status, body)
            assert headers.get("x-error-code") == "StoreUnavailable", (path, headers)
            assert int(headers["retry-after"]) > 0, (path, headers)
        # the JSON API and the pages: the same mapping where they read the store
        status, headers, body = get(base, "/api/v1/releases/tiny/1")
        assert status == 503 and int(headers["retry-after"]) > 0, (status, body)
        assert b"StorageError" in body
        assert store_requests(proxy) > 0
        # the store back: every route answers again, same server
        proxy.rules.clear()
        files = release_files(url, "tiny", "1")
        assert_serves(base, "prod", files)


def test_a_slow_store_delays_but_never_fails_a_request(
        s3_bucket: str, proxy: FaultProxy, srcs: dict[str, Path], tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/root"
    publish(url, srcs["1"], "tiny", "1")
    files = release_files(url, "tiny", "1")
    with _mirror(url, proxy, tmp_path, "--fresh-for", "600") as base:
        proxy.rules.append(lambda r: Action("delay", seconds=0.3))
        for method, path in hub_routes("1"):
            status, _, body = get(base, path, method)
            assert status == 200, (path, status, body)
        assert_serves(base, "1", files)


def test_verified_bytes_are_served_from_the_cache_with_no_store_request(
        s3_bucket: str, proxy: FaultProxy, srcs: dict[str, Path], tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/root"
    publish(url, srcs["1"], "tiny", "1")
    assert run_cli("alias", "set", "tiny", "prod", "1", "--store", url).returncode == 0
    files = release_files(url, "tiny", "1")
    with _mirror(url, proxy, tmp_path, "--fresh-for", "3600") as base:
        for rev in ("prod", "1"):
            for name in files:
                assert get(base, f"/{REPO}/resolve/{rev}/{name}")[0] == 200
            for method, path in hub_routes(rev):
                assert get(base, path, method)[0] == 200, path
        proxy.reset()
        for _ in range(3):
            for rev in ("prod", "1"):
                for name, digest in files.items():
                    status, headers, body = get(base, f"/{REPO}/resolve/{rev}/{name}")
                    assert status == 200 and sha(body) == digest, name
                    assert "x-registry-stale" not in headers
                for method, path in hub_routes(rev):
                    assert get(base, path, method)[0] == 200, path
        assert store_requests(proxy) == 0, [(r.op, r.key) for r in proxy.log]


def test_an_outage_serves_what_was_verified_stale_within_the_bound_and_never_past_a_revocation(
        s3_bucket: str, proxy: FaultProxy, srcs: dict[str, Path], tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/root"
    publish(url, srcs["1"], "tiny", "1")
    publish(url, srcs["2"], "tiny", "2", sources=("books",))
    publish(url, srcs["1"], "tiny", "3")
    assert run_cli("alias", "set", "tiny", "prod", "1", "--store", url).returncode == 0
    one = release_files(url, "tiny", "1")
    with _mirror(url, proxy, tmp_path, "--fresh-for", "0", "--stale-for", "3600") as base:
        for name in one:
            assert get(base, f"/{REPO}/resolve/prod/{name}")[0] == 200
        assert get(base, f"/{REPO}/resolve/2/config.json")[0] == 200  # passes now
        assert run_cli("ledger", "revoke", "books", "--reason", "withdrawn", "--store",
                       url).returncode == 0
        for _ in range(120):  # the gate verdict is kept GATE_TTL seconds, then read again
            status, headers, _ = get(base, f"/{REPO}/resolve/2/config.json")
            if status != 200:
                break
            threading.Event().wait(0.25)
        assert (status, headers.get("x-error-code")) == (403, "GatedRepo")  # seen
        proxy.rules.append(lambda r: DOWN)
        proxy.log.clear()
        for name, digest in one.items():
            status, headers, body = get(base, f"/{REPO}/resolve/prod/{name}")
            assert status == 200 and sha(body) == digest, name
            assert int(headers["x-registry-stale"]) >= 0
            assert "Stale" in headers["warning"]
        assert store_requests(proxy) > 0  # it asked (fresh-for 0), the store did not answer
        # the revocation it saw holds through the outage
        status, headers, _ = get(base, f"/{REPO}/resolve/2/config.json")
        assert (status, headers.get("x-error-code")) == (403, "GatedRepo")
        # a release it never verified cannot be served: an outage, not "no such release"
        status, headers, _ = get(base, f"/{REPO}/resolve/3/config.json")
        assert status == 503 and headers.get("x-error-code") == "StoreUnavailable"
    with _mirror(url, proxy, tmp_path, "--fresh-for", "0", "--stale-for", "0") as base:
        # no stale bound: nothing is decided without the store, though the bytes are cached
        status, headers, _ = get(base, f"/{REPO}/resolve/prod/config.json")
        assert status == 503 and int(headers["retry-after"]) > 0


def _relay(port: int, upstream: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.relay_child", str(port),
                             upstream], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None and not proc.stdout.closed:
        proc.stdout.close()


def test_sixteen_downloads_through_a_store_killed_and_restarted(
        s3_bucket: str, proxy: FaultProxy, srcs: dict[str, Path], tmp_path: Path) -> None:
    """The store's endpoint is a relay process: killed, then started again on
    its port while 16 clients download; a client retries a 503 as a Hub
    client does. Cached files are served through the outage; the others are
    503 until the store is back, then right, each byte read once."""
    url = f"s3://{s3_bucket}/root"
    publish(url, srcs["1"], "tiny", "1")
    publish(url, srcs["2"], "tiny", "2")
    one, two = release_files(url, "tiny", "1"), release_files(url, "tiny", "2")
    relay, port = _relay(0, proxy.endpoint)
    try:
        with serve(url, index_db(tmp_path), "--mirror-cache", str(tmp_path / "m"),
                   env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", **FAST}) as base:
            for name in one:
                assert get(base, f"/{REPO}/resolve/1/{name}")[0] == 200
            assert get(base, f"/api/models/{REPO}/revision/2")[0] == 200  # facts of 2 seen
            _stop(relay)
            proxy.log.clear()
            refused = threading.Semaphore(0)
            statuses: list[int] = []

            def client(i: int) -> str:
                rev, files = ("1", one) if i % 2 else ("2", two)
                name = "model.safetensors" if i % 4 < 2 else "config.json"
                told = False
                while True:
                    status, headers, body = get(base, f"/{REPO}/resolve/{rev}/{name}")
                    statuses.append(status)
                    if status == 200:
                        assert sha(body) == files[name]
                        if not told:
                            refused.release()
                        return name
                    assert status == 503 and int(headers["retry-after"]) > 0, (status, body)
                    assert headers["x-error-code"] == "StoreUnavailable"
                    if not told:
                        told = True
                        refused.release()
                    threading.Event().wait(0.2)

            with ThreadPoolExecutor(16) as pool:
                futures = [pool.submit(client, i) for i in range(16)]
                for _ in range(16):  # every client served, or refused once: store back
                    refused.acquire()
                relay2, _ = _relay(port, proxy.endpoint)
                try:
                    assert len([f.result() for f in futures]) == 16
                finally:
                    _stop(relay2)
            assert set(statuses) <= {200, 503} and 503 in statuses
            weights = two["model.safetensors"]
            got = [r for r in proxy.log if r.op == "GetObject" and r.key.endswith(
                "tiny/2/model.safetensors")]
            assert got, "release 2's weights came from the store once it was back"
            assert all("1/model" not in r.key for r in proxy.log)  # 1 is served from cache
            assert (tmp_path / "m" / "blobs" / "sha256" / weights).exists()
    finally:
        _stop(relay)
