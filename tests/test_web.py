"""`registry serve`: pages, the JSON API (same documents as the CLI's --json),
bad input, read-only, the token; in process (TestClient) and as a real server."""

from __future__ import annotations

import base64
import http.client
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient
from tests.support.clirunner import CliRunner

from registry.api import Registry
from registry.cli import app as cli_app
from registry.web import create_app
from tests.conftest import run_cli
from tests.web_util import EVIL, build, built, ledger_row, serve, summary2


@pytest.fixture(scope="module")
def client(built: tuple[str, str]) -> Iterator[TestClient]:
    with Registry(*built) as reg, TestClient(create_app(reg), base_url="http://localhost") as c:
        yield c


def cli_json(built: tuple[str, str], *args: str, store_only: bool = False) -> Any:
    store, db = built
    extra = ["--store", store] + ([] if store_only else ["--db", db])
    if db.startswith("sqlite"):
        r = CliRunner().invoke(cli_app, [*args, *extra, "--json"])
        assert r.exit_code in (0, 1), r.output
        return json.loads(r.stdout)
    # a real process: the CLI leaves closing its Postgres connections to the exit
    p = run_cli(*args, *extra, "--json")
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)


# -- the JSON API: the CLI's documents -----------------------------------------

API_VS_CLI = [
    ("/api/v1/models", ["ls"], False),
    ("/api/v1/models/tiny/releases", ["ls", "tiny"], False),
    ("/api/v1/models/tiny/passing", ["query", "tiny", "--passing"], False),
    ("/api/v1/models/tiny/passing?latest=true&require=copy/loss<=1.3",
     ["query", "tiny", "--passing", "--latest", "--require", "copy/loss<=1.3"], False),
    ("/api/v1/models/tiny/aliases", ["alias", "ls", "tiny"], True),
    ("/api/v1/models/tiny/aliases/prod/log", ["alias", "log", "tiny", "prod"], True),
    ("/api/v1/models/tiny/diff?a=1&b=prod", ["diff", "tiny@1", "tiny@prod"], False),
    ("/api/v1/releases/tiny/1", ["show", "tiny@1"], False),
    ("/api/v1/releases/tiny/prod", ["show", "tiny@prod"], False),
    ("/api/v1/releases/tiny/1/gates", ["gate", "check", "tiny@1"], True),
    ("/api/v1/releases/tiny/3/gates?require=copy/accuracy>=0.99",
     ["gate", "check", "tiny@3", "--require", "copy/accuracy>=0.99"], True),
    ("/api/v1/sources/wiki/releases", ["query", "--source", "wiki"], False),
    ("/api/v1/revocations", ["ledger", "ls"], True),
    ("/api/v1/runs/r1/checkpoints", ["ckpt", "ls", "r1"], True),
]


@pytest.mark.parametrize(("path", "cli", "store_only"), API_VS_CLI,
                         ids=[p for p, _, _ in API_VS_CLI])
def test_api_serves_the_cli_json_documents(client: TestClient, built: tuple[str, str],
                                           path: str, cli: list[str], store_only: bool) -> None:
    r = client.get(path)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    expected = cli_json(built, *cli, store_only=store_only)
    assert expected, "an empty document compares nothing"
    assert r.json() == expected


def test_api_documents_say_what_the_registry_says(client: TestClient) -> None:
    models = client.get("/api/v1/models").json()
    assert models == [{"model_id": "tiny", "releases": 3, "newest": "3",
                       "newest_passing": "3", "aliases": ["prod"]}]
    gates = client.get("/api/v1/releases/tiny/1/gates").json()
    assert not gates["passed"]
    reasons = {g["gate"]: g["reason"] for g in gates["gates"] if not g["passed"]}
    assert "books is revoked in the live ledger" in reasons["ledger"]
    assert reasons["policy:copy/accuracy>=0.92"] == "copy/accuracy=0.9, required >= 0.92"
    ckpts = client.get("/api/v1/runs/r1/checkpoints").json()
    assert ckpts["latest"] == 30 and [s["step"] for s in ckpts["steps"]] == [10, 20, 30]


def test_openapi_documents_every_api_route(client: TestClient) -> None:
    spec = client.get("/api/v1/openapi.json").json()
    assert set(spec["paths"]) == {
        "/api/v1/models", "/api/v1/models/{model_id}/releases",
        "/api/v1/models/{model_id}/passing", "/api/v1/models/{model_id}/aliases",
        "/api/v1/models/{model_id}/aliases/{alias}/log", "/api/v1/models/{model_id}/diff", "/api/v1/releases/{model_id}/{ref}",
        "/api/v1/releases/{model_id}/{ref}/gates", "/api/v1/sources/{source_id}/releases",
        "/api/v1/revocations", "/api/v1/runs/{run_id}/checkpoints", "/api/v1/hub/stats",
        "/api/v1/search"}
    assert all(set(ops) == {"get"} for ops in spec["paths"].values())
    assert client.get("/api/v1/docs").status_code == 200


@pytest.mark.parametrize(("path", "status", "cls", "code", "named"), [
    ("/api/v1/releases/tiny/9.9", 404, "NotCommittedError", 3, "9.9"),
    ("/api/v1/releases/nosuch/1", 404, "NotCommittedError", 3, "nosuch"),
    ("/api/v1/models/nosuch/releases", 404, "UnknownModelError", 3, "nosuch"),
    ("/api/v1/releases/tiny/bad%20name", 400, "InvalidNameError", 2, "bad name"),
    ("/api/v1/models/-x/passing", 400, "InvalidNameError", 2, "-x"),
    ("/api/v1/sources/wiki.tmp/releases", 400, "InvalidNameError", 2, "wiki.tmp"),
    ("/api/v1/releases/tiny/1/gates?require=accuracy~1", 400, "UsageError", 2, "accuracy~1"),
    ("/api/v1/models/tiny/passing?latest=maybe", 400, "UsageError", 2, "latest"),
    ("/api/v1/nothing-here", 404, "NotFound", 3, "/api/v1/nothing-here"),
    ("/api/v1/runs/nosuch/checkpoints", 404, "ObjectNotFoundError", 3, "nosuch"),
])
def test_api_errors_are_the_cli_error_document(client: TestClient, path: str, status: int,
                                               cls: str | None, code: int | None,
                                               named: str | None) -> None:
    r = client.get(path)
    assert r.status_code == status, r.text
    if cls is None:
        assert r.json() == []
        return
    err = r.json()["error"]
    assert err["class"] == cls and err["exit_code"] == code
    assert named in err["message"] and "\n" not in err["message"]
    assert err["meaning"] == {2: "bad arguments or names", 3: "not found"}[code]


# -- pages ---------------------------------------------------------------------

def text_of(html: str) -> str:
    """The page's text, tags dropped and entities decoded (what a reader sees)."""
    import html as h
    inline = re.sub(r"</?(?:a|b|span|code|em|strong)\b[^>]*>", "", html)
    return h.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", inline)))


def test_models_page(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    t = text_of(r.text)
    assert re.search(r"tiny 3 3 3 prod", t), t
    assert "r1 3 30" in t
    assert "books" in t and "revoked: the publisher withdrew the licence" in t


def test_model_page_shows_gates_reasons_and_charts(client: TestClient) -> None:
    r = client.get("/models/tiny")
    assert r.status_code == 200
    t = text_of(r.text)
    rows = re.findall(r"<tr>\s*<td><a href=\"/models/tiny/(\w+)\">.*?</tr>", r.text, re.S)
    assert rows == ["3", "2", "1"]  # newest first
    assert "1 FAIL ledger: source books is revoked in the live ledger (the publisher " \
           "withdrew the licence) policy:copy/accuracy>=0.92: copy/accuracy=0.9, required " \
           ">= 0.92 f32" in t
    assert re.search(r"2 PASS bf16 [\d.]+ KiB \S+ prod", t), t
    charts = re.findall(r"<figure>.*?</figure>", r.text, re.S)
    assert [re.search(r"<b>(.*?)</b>", c).group(1) for c in charts] == ["copy/accuracy",
                                                                      "copy/loss"]
    acc = charts[0]
    # one value per version, oldest first; the summary's threshold and the policy, dashed
    assert re.findall(r"<title>copy/accuracy @ (\w+): ([\d.]+)</title>", acc) == [
        ("1", "0.9"), ("2", "0.95"), ("3", "0.97")]
    assert acc.count('stroke-dasharray') == 4  # 2 threshold lines + 2 legend marks
    assert "policy copy/accuracy&gt;=0.92" in acc


def test_version_page(client: TestClient, built: tuple[str, str]) -> None:
    r = client.get("/models/tiny/1")
    assert r.status_code == 200
    t = text_of(r.text)
    assert "tiny@1 FAIL" in t
    assert f"registry pull tiny@1 --store {built[0]}" in t
    for gate in ("model_card PASS", "ledger FAIL source books is revoked in the live ledger",
                 "evals PASS", "policy:copy/accuracy>=0.92 FAIL"):
        assert gate in t, gate
    assert "copy accuracy 0.9 0.5 higher 100 pass" in t
    ledger = re.search(r'<table id="ledger">.*?</table>', r.text, re.S).group(0)
    assert re.search(r'<tr class="revoked">\s*<td><a href="/sources/books">', ledger)
    assert "REVOKED: the publisher withdrew the licence" in text_of(ledger)
    assert "wiki wiki corpus CC-BY-4.0 train, eval live" in text_of(ledger)
    files = text_of(re.search(r'<table id="files">.*?</table>', r.text, re.S).group(0))
    show = json.loads(json.dumps(client.get("/api/v1/releases/tiny/1").json()))
    for f in show["manifest"]:
        assert f"{f['path']} " in files and f["sha256"] in files
    assert 'id="signer"' not in r.text  # nothing is signed (signing is not built yet)
    # the card: its markdown rendered, its markup shown as text, never as markup
    card = re.search(r'<div class="card" id="card">(.*?)</div>', r.text, re.S).group(1)
    assert "<h1>tiny 1</h1>" in card and "<table>" in card
    assert "<script" not in card and "<img" not in card
    assert EVIL in text_of(card)
    r2 = client.get("/models/tiny/prod")
    assert "tiny@2 PASS" in text_of(r2.text) and "prod → 2" in text_of(r2.text)
    heads = text_of(re.search(r'<table id="heads">.*?</table>', r2.text, re.S).group(0))
    assert "heads/sentiment.json sentiment 8 l0, l1 mean" in heads
    assert 'href="/runs/r1"' in r2.text


def test_signer_row_names_the_key_that_signed(tmp_path: Path) -> None:
    """A release published with --sign-key shows its signer's fingerprint
    (model.sig); an unsigned one has no signer row."""
    pytest.importorskip("model_signing")
    from registry.trust.keys import generate

    store, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    build(store, db)
    priv, _, fingerprint = generate(tmp_path / "release.pem")
    with Registry(store, db) as reg:
        reg.create_release("r1", 30, "tiny", "4", ledger=[ledger_row("wiki")],
                           eval_summary=summary2(0.97, 1.2), sign_key=priv)
    with Registry(store, db) as reg, TestClient(create_app(reg), base_url="http://localhost") as c:
        t = text_of(c.get("/models/tiny/4").text)
        assert f"signer key {fingerprint} (not verified here) (model.sig)" in t
        assert 'id="signer"' not in c.get("/models/tiny/2").text


def test_signer_row_names_the_certificate_that_signed(tmp_path: Path) -> None:
    """A release signed with a certificate from a local CA shows the
    certificate's subject, fingerprint and issuer."""
    pytest.importorskip("model_signing")
    from registry.trust.local_ca import issue, make_ca

    store, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    build(store, db)
    make_ca(tmp_path / "ca.pem", subject="CN=Web CA")
    key, cert, c = issue(tmp_path / "bot.pem", ca_key=tmp_path / "ca.pem", subject="CN=bot")
    with Registry(store, db) as reg:
        reg.create_release("r1", 30, "tiny", "4", ledger=[ledger_row("wiki")],
                           eval_summary=summary2(0.97, 1.2), sign_key=key, sign_cert=cert,
                           cert_chain=[tmp_path / "ca.crt"])
    with Registry(store, db) as reg, TestClient(create_app(reg), base_url="http://localhost") as client:
        t = text_of(client.get("/models/tiny/4").text)
        assert (f"signer certificate CN=bot ({c.fingerprint}, issued by CN=Web CA; not "
                "verified here) (model.sig)") in t


def test_source_page(client: TestClient) -> None:
    t = text_of(client.get("/sources/books").text)
    assert "Data source books REVOKED" in t
    assert "the publisher withdrew the licence" in t
    assert "tiny@1" in t and "tiny@2" not in t
    t = text_of(client.get("/sources/wiki").text)
    assert "Data source wiki live" in t
    assert all(f"tiny@{v}" in t for v in ("1", "2", "3"))


def test_run_page(client: TestClient) -> None:
    r = client.get("/runs/r1")
    t = text_of(r.text)
    assert "LATEST → step 30" in t
    steps = text_of(re.search(r'<table id="steps">.*?</table>', r.text, re.S).group(0))
    assert re.search(r"30 LATEST [\d.]+ KiB 1\.7500 .* 20 [\d.]+ KiB 2\.5000 .* 10 "
                     r"[\d.]+ KiB 3\.2500", steps), steps
    assert re.findall(r"<title>loss @ (\d+): ([\d.]+)</title>", r.text) == [
        ("10", "3.25"), ("20", "2.5"), ("30", "1.75")]


@pytest.mark.parametrize(("path", "status", "named"), [
    ("/models/nosuch", 404, "nosuch"),
    ("/models/tiny/9.9", 404, "9.9"),
    ("/models/tiny/staging", 404, "staging"),
    ("/sources/nosuch", 404, "nosuch"),
    ("/runs/nosuch", 404, "nosuch"),
    ("/models/bad%20name", 400, "bad name"),
    ("/models/tiny/refs", 400, "refs"),
    ("/runs/r1.lock", 400, "r1.lock"),
    ("/sources/-wiki", 400, "-wiki"),
    ("/models/tiny?before=9.9", 404, "9.9"),
    ("/models/tiny?after=..", 400, ".."),
    ("/sources/wiki?before=tiny@9.9", 404, "tiny@9.9"),
    ("/sources/wiki?after=tiny", 400, "tiny"),
    ("/models/tiny?before=3&after=1", 400, "not both"),
    ("/sources/wiki?before=tiny@3&after=tiny@1", 400, "not both"),
    ("/no/such/page", 404, "/no/such/page"),
])
def test_pages_name_what_was_asked(client: TestClient, path: str, status: int,
                                   named: str) -> None:
    r = client.get(path)
    assert r.status_code == status
    assert r.headers["content-type"].startswith("text/html")
    message = text_of(re.search(r'<p id="message">(.*?)</p>', r.text, re.S).group(1))
    assert named in message, message


# -- a real server: traversal on the wire, read-only, the token -----------------

def raw_get(base: str, path: str, headers: dict[str, str] | None = None,
            method: str = "GET") -> tuple[int, str]:
    """Send ``path`` byte for byte (no client normalizes it)."""
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.putrequest(method, path, skip_accept_encoding=True)
    for k, v in (headers or {}).items():
        conn.putheader(k, v)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    return resp.status, body


TRAVERSALS = ["/models/../../etc/passwd", "/models/tiny/..", "/models/%2e%2e/tiny",
              "/models/tiny/%2E%2E%2F%2E%2E%2Fetc", "/models/..%2fstore", "/runs/r1%5c..%5c",
              "/sources/wiki%00", "/api/v1/releases/tiny/..%2F..%2Fledger",
              "/api/v1/runs/%2e%2e/checkpoints", "/models/tiny/.%2e/1", "/./models/tiny"]


def snapshot(store: str, db: str) -> tuple[dict[str, bytes], list[Any]]:
    files = {str(p.relative_to(store)): p.read_bytes() for p in Path(store).rglob("*")
             if p.is_file()}
    con = sqlite3.connect(db.removeprefix("sqlite:///"))
    rows = [con.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in (
        "models", "releases", "release_files", "ledger_sources", "release_sources",
        "revocations", "eval_results", "aliases", "policies", "checkpoints")]
    con.close()
    return files, rows


def test_live_server_refuses_traversal_writes_nothing_and_lists_every_link(
        built: tuple[str, str]) -> None:
    before = snapshot(*built)
    with serve(*built) as base:
        for path in TRAVERSALS:
            status, body = raw_get(base, path)
            assert status == 400, (path, status, body)
            assert "etc/passwd" not in body or "root:" not in body
        status, body = raw_get(base, "/api/v1/models/%2e%2e/releases")
        assert json.loads(body)["error"]["class"] == "InvalidNameError"
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, body = raw_get(base, "/api/v1/models", method=method)
            assert status == 405, (method, body)
            assert "read-only" in json.loads(body)["error"]["message"]
            status, _ = raw_get(base, "/models/tiny", method=method)
            assert status == 405
        seen = crawl(base)
        assert {"/", "/models/tiny", "/models/tiny/1", "/models/tiny/prod", "/sources/books",
                "/runs/r1", "/api/v1/docs"} <= seen
    assert snapshot(*built) == before


def crawl(base: str, headers: dict[str, str] | None = None) -> set[str]:
    """Walk every same-site link from the index page; assert none is 404/500."""
    seen: set[str] = set()
    todo = ["/"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        status, body = raw_get(base, path, headers)
        assert status == 200, (path, status, body[:300])
        if path.startswith("/api/"):
            continue
        for href in re.findall(r'href="([^"]+)"', body):
            href = href.replace("&amp;", "&")
            if href.startswith("/") and not href.startswith("//"):
                todo.append(href)
            else:
                assert href.startswith("http"), href
    return seen


def test_token_file(built: tuple[str, str], tmp_path: Path) -> None:
    token = "s3cr3t-token-value"
    (tmp_path / "token").write_text(token + "\n")
    with serve(*built, "--token-file", str(tmp_path / "token")) as base:
        status, body = raw_get(base, "/api/v1/models")
        assert status == 401 and json.loads(body)["error"]["class"] == "Unauthorized"
        assert raw_get(base, "/")[0] == 401
        assert raw_get(base, "/api/v1/models", {"Authorization": "Bearer wrong"})[0] == 401
        status, body = raw_get(base, "/api/v1/models", {"Authorization": f"Bearer {token}"})
        assert status == 200 and json.loads(body)[0]["model_id"] == "tiny"
        basic = base64.b64encode(f"anyone:{token}".encode()).decode()
        assert raw_get(base, "/models/tiny", {"Authorization": f"Basic {basic}"})[0] == 200
        assert crawl(base, {"Authorization": f"Bearer {token}"}) >= {"/models/tiny/1"}


@pytest.mark.parametrize(("args", "message"), [
    (["--host", "0.0.0.0"], "--host 0.0.0.0: serving beyond this machine needs --token-file"),
    (["--token-file", "/nonexistent/token"], "--token-file /nonexistent/token: cannot read"),
    (["--port", "70000"], "65535"),
])
def test_serve_refuses_bad_options(built: tuple[str, str], tmp_path: Path, args: list[str],
                                   message: str) -> None:
    r = CliRunner().invoke(cli_app, ["serve", "--store", built[0], "--db", built[1], *args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr
    assert isinstance(r.exception, SystemExit)  # a clean exit, no traceback


def test_serve_on_a_port_in_use_is_one_line(built: tuple[str, str]) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        r = CliRunner().invoke(cli_app, ["serve", "--store", built[0], "--db", built[1],
                                         "--port", str(port)])
    assert r.exit_code == 2, r.output
    assert f"--port {port}: cannot listen there" in r.stderr
    assert isinstance(r.exception, SystemExit)  # a clean exit, no traceback


def test_empty_token_file_is_refused(built: tuple[str, str], tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n\n")
    r = CliRunner().invoke(cli_app, ["serve", "--store", built[0], "--db", built[1],
                                     "--token-file", str(tmp_path / "token")])
    assert r.exit_code == 2 and "holds no token" in r.stderr


# -- S3 and Postgres -------------------------------------------------------------

@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_pages_and_api_on_s3_and_postgres(s3_bucket: str, db_url: str) -> None:
    store = f"s3://{s3_bucket}/registry"
    build(store, db_url)
    with Registry(store, db_url) as reg, TestClient(create_app(reg), base_url="http://localhost") as c:
        for path in ("/", "/models/tiny", "/models/tiny/1", "/models/tiny/prod",
                     "/sources/books", "/sources/wiki", "/runs/r1"):
            assert c.get(path).status_code == 200, path
        t = text_of(c.get("/models/tiny/1").text)
        assert "REVOKED: the publisher withdrew the licence" in t and EVIL in t
        assert "LATEST → step 30" in text_of(c.get("/runs/r1").text)
        assert c.get("/api/v1/releases/tiny/prod").json() == cli_json(
            (store, db_url), "show", "tiny@prod")
        assert c.get("/api/v1/runs/r1/checkpoints").json() == cli_json(
            (store, db_url), "ckpt", "ls", "r1", store_only=True)
        assert c.get("/models/tiny/9.9").status_code == 404


@pytest.mark.parametrize("args", [
    ["gate", "check", "tiny@1", "--require", "accuracy~1"],
    ["query", "tiny", "--passing", "--require", "accuracy=>1"],
    ["policy", "set", "tiny", "--require", "accuracy>=nan"],
    ["policy", "set", "tiny", "--require", ">=0.5"],
])
def test_a_bad_require_is_a_usage_error_not_a_broken_policy(built: tuple[str, str],
                                                             tmp_path: Path,
                                                             args: list[str]) -> None:
    """Found by the API: a bad --require was blamed on policy.json (exit 5)."""
    store = tmp_path / "store"
    import shutil
    shutil.copytree(built[0], store)
    db = f"sqlite:///{tmp_path / 'i.db'}"
    shutil.copy(built[1].removeprefix("sqlite:///"), tmp_path / "i.db")
    policy = (store / "models/tiny/policy.json").read_bytes()
    r = CliRunner().invoke(cli_app, [*args, "--store", str(store),
                                     *([] if args[0] == "gate" else ["--db", db])])
    assert r.exit_code == 2, r.output
    assert "expected METRIC>=VALUE" in r.stderr or "not a finite number" in r.stderr
    assert "policy.json" not in r.stderr
    assert (store / "models/tiny/policy.json").read_bytes() == policy


def test_web_bench_harness(tmp_path: Path) -> None:
    """bench/web_bench.py at a tiny size: every page answers and is timed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "web_bench", Path(__file__).resolve().parent.parent / "bench" / "web_bench.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "results-web.json"
    assert bench.main(["--releases", "200", "--requests", "2", "--postgres", "none",
                       "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["sqlite"]["releases"] == 203
    assert set(doc["sqlite"]["pages"]) == set(bench.PAGES)
    assert all(p["n"] == 2 and 0 < p["p50_ms"] <= p["p95_ms"] for p in
               doc["sqlite"]["pages"].values())
    assert len(doc["targets"]) == len(bench.PAGES)
