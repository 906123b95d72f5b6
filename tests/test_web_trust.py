"""`registry serve` against a web page in the operator's browser and a store
writer (issue 30, item 3): only its own names are answered (DNS rebinding is
refused), every answer carries the security headers, the API docs need nothing
from elsewhere, and a hostile store document is a clear error, never a 500 or
an unbounded read."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from registry.api import Registry
from registry.store import Store
from registry.web import create_app
from registry.web.security import CSP, allowed_hosts, host_of
from tests.web_util import built, serve

HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff",
           "referrer-policy": "no-referrer", "x-frame-options": "DENY"}


@pytest.fixture(scope="module")
def client(built: tuple[str, str]) -> Iterator[TestClient]:
    with Registry(*built) as reg, TestClient(create_app(reg), base_url="http://localhost",
                                             raise_server_exceptions=False) as c:
        yield c


def secured(r: object) -> None:
    for name, value in HEADERS.items():
        assert r.headers.get(name) == value, (name, r.headers)  # type: ignore[attr-defined]
    assert "frame-ancestors 'none'" in CSP and "script-src" not in CSP
    assert "unsafe-inline" not in CSP


@pytest.mark.parametrize("path", ["/", "/models/tiny", "/models/tiny/2", "/api/v1/models",
                                  "/api/v1/docs", "/static/registry.css", "/nosuch",
                                  "/api/v1/releases/tiny/9.9"])
def test_every_answer_carries_the_security_headers(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code in (200, 404)
    secured(r)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example",
                                  "localhost.evil.example", "[::2]:80"])
def test_a_foreign_host_is_refused_with_421(client: TestClient, host: str) -> None:
    api = client.get("/api/v1/models", headers={"Host": host})
    assert api.status_code == 421
    assert api.json()["error"]["class"] == "MisdirectedRequest"
    assert "DNS rebinding" in api.json()["error"]["message"]
    page = client.get("/models/tiny", headers={"Host": host})
    assert page.status_code == 421 and "tiny" not in page.text.split("You asked")[0]
    secured(page)


@pytest.mark.parametrize("host", ["localhost", "localhost:8080", "127.0.0.1:9", "[::1]:80",
                                  "LOCALHOST."])
def test_own_names_are_answered(client: TestClient, host: str) -> None:
    assert client.get("/api/v1/models", headers={"Host": host}).status_code == 200


def test_allowed_hosts_rules() -> None:
    assert allowed_hosts("127.0.0.1", ["reg.internal"]) >= {"reg.internal", "localhost",
                                                           "127.0.0.1", "::1"}
    assert "evil.example" not in allowed_hosts("127.0.0.1")
    assert host_of("[::1]:8080") == "::1" and host_of("Example.COM:80") == "example.com"
    for bad in ("http://x", "x:80", "x/y", ""):
        with pytest.raises(ValueError, match="--allowed-host"):
            allowed_hosts("127.0.0.1", [bad])


def test_api_docs_come_from_the_package_without_script(client: TestClient) -> None:
    r = client.get("/api/v1/docs")
    assert r.status_code == 200
    assert "/api/v1/models/{model_id}/releases" in r.text
    assert "<script" not in r.text.lower() and "<style" not in r.text.lower()
    assert not re.search(r"(src|href)=\"(https?:)?//", r.text), "nothing loaded from elsewhere"
    for page in ("/", "/models/tiny/1"):
        html = client.get(page).text.lower()
        assert "<script" not in html and "<style" not in html and " style=" not in html


def _release_prefix(store: str, version: str) -> Path:
    return Path(store) / "models" / "tiny" / version


def test_a_card_larger_than_its_manifest_says_is_refused_unread(
        built: tuple[str, str], client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _ = built
    card = _release_prefix(store, "3") / "MODEL_CARD.md"
    listed = card.stat().st_size
    card.write_bytes(b"# big\n" + b"x" * (8 << 20))  # the index still says `listed` bytes
    from registry.store.base import Store
    read: list[int] = []
    original = Store.read_bytes

    def spy(self: Store, key: str, *, limit: int | None = None) -> bytes:
        read.append(limit if limit is not None else -1)
        return original(self, key, limit=limit)
    monkeypatch.setattr(Store, "read_bytes", spy)
    r = client.get("/models/tiny/3")
    assert r.status_code == 502, r.text[:300]
    assert "MODEL_CARD.md" in r.text and "limit" in r.text
    assert listed in read  # the read was bounded by the manifest's size
    secured(r)


def test_bad_store_documents_are_clear_errors_never_500(built: tuple[str, str],
                                                        client: TestClient) -> None:
    store, _ = built
    rev = Path(store) / "ledger" / "revocations" / "books.json"
    saved = rev.read_bytes()
    try:
        for bad in (b"not json", b"[1, 2]", b'{"source_id": 1}'):
            rev.write_bytes(bad)
            page = client.get("/sources/books")
            assert page.status_code == 502 and "books.json" in page.text, page.text[:300]
            api = client.get("/api/v1/revocations")
            assert api.status_code == 502 and "books.json" in api.json()["error"]["message"]
            assert api.json()["error"]["class"] in ("DocumentError", "SchemaValidationError")
    finally:
        rev.write_bytes(saved)
    state = Path(store) / "runs" / "r1" / "ckpt" / "step-000030" / "trainer_state.json"
    doc = json.loads(state.read_text())
    state.write_text(json.dumps({**doc, "loss": 10 ** 400}))
    r = client.get("/runs/r1")
    assert r.status_code == 200, r.text[:300]  # the chart skips the loss it cannot draw


def test_real_server_refuses_rebinding_and_answers_allowed_host(built: tuple[str, str]) -> None:
    store, db = built
    with serve(store, db, "--allowed-host", "registry.test") as base:
        port = urlsplit(base).port
        for host, want in (("evil.example", 421), (f"evil.example:{port}", 421),
                           ("registry.test", 200), (f"127.0.0.1:{port}", 200)):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.putrequest("GET", "/api/v1/models", skip_host=True)
            conn.putheader("Host", host)
            conn.endheaders()
            resp = conn.getresponse()
            assert resp.status == want, (host, resp.status)
            assert resp.getheader("Content-Security-Policy") == CSP
            conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.putrequest("GET", "/api/v1/models", skip_host=True)
        conn.endheaders()
        assert conn.getresponse().status == 400  # no Host header at all
        conn.close()


def test_read_bytes_limit_on_every_backend(store: Store) -> None:
    from registry.errors import DocumentError

    s = store
    s.write_bytes("doc", b"x" * 1000)
    assert s.read_bytes("doc", limit=1000) == b"x" * 1000
    with pytest.raises(DocumentError, match="1000-byte|999-byte"):
        s.read_bytes("doc", limit=999)


def test_credentials_in_urls_never_reach_a_page_or_json(client: TestClient,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.api import Registry as Reg
    from registry.errors import IndexDatabaseError
    from registry.web import views

    def boom(*_: object, **__: object) -> None:
        raise IndexDatabaseError("postgresql+psycopg://admin:S3cretPW@db/x: cannot reach it")
    monkeypatch.setattr(views, "index_view", boom)
    monkeypatch.setattr(Reg, "ls", boom)
    for path in ("/", "/api/v1/models"):
        r = client.get(path)
        assert r.status_code == 503 and "S3cretPW" not in r.text, r.text[:300]
        assert "admin:***@db" in r.text
