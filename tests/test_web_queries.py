"""How `registry serve` reads the index: a bounded number of SQL statements per
page whatever the number of releases (issue 20: pages in <= 200 ms p95 with
100k releases; an N+1 or an unpaged list fails here, not only in the
benchmark), keyset pages, the kept release count, and nothing mutable cached."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, insert, select

from registry.api import Registry
from registry.index.db import head_revision
from registry.index.record import record_release
from registry.index.schema import Model, Policy, Release
from registry.web import create_app, views
from tests.web_util import build, ledger_row, summary2

#: no page or API route may run more statements than this, at any size
MAX_STATEMENTS = 7
PATHS = ["/", "/models/tiny", "/models/tiny?before=3", "/models/tiny?after=1",
         "/models/tiny/1", "/models/tiny/prod", "/sources/wiki", "/sources/wiki?before=tiny@3",
         "/sources/books", "/runs/r1", "/api/v1/models", "/api/v1/models/tiny/releases",
         "/api/v1/models/tiny/passing", "/api/v1/models/tiny/passing?latest=true",
         "/api/v1/models/tiny/diff?a=1&b=prod", "/api/v1/releases/tiny/prod",
         "/api/v1/sources/books/releases", "/api/v1/runs/r1/checkpoints"]
#: pages that exist only once the index is large
BIG_PATHS = ["/models/big", "/models/big?before=100.0", "/models/big?after=100.0",
             "/models/model-001", "/sources/src-popular",
             "/api/v1/models/big/passing?latest=true"]


def web_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "web_bench", Path(__file__).resolve().parent.parent / "bench" / "web_bench.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def counting(reg: Registry) -> Iterator[list[str]]:
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)
    event.listen(reg.index.engine, "before_cursor_execute", seen)
    try:
        yield statements
    finally:
        event.remove(reg.index.engine, "before_cursor_execute", seen)


def statements_of(client: TestClient, reg: Registry, path: str) -> int:
    with counting(reg) as statements:
        r = client.get(path)
    assert r.status_code == 200, (path, r.text[:300])
    return len(statements)


def test_statements_per_page_do_not_grow_with_releases(tmp_path: Path, db_url: str) -> None:
    store = str(tmp_path / "store")
    build(store, db_url)
    with Registry(store, db_url) as reg, TestClient(create_app(reg), base_url="http://localhost") as client:
        small = {p: statements_of(client, reg, p) for p in PATHS}
        web_bench().populate(reg, 400)  # 100 more models, 1,000 sources
        with reg.index.engine.begin() as conn:  # a policy on every model (no query per model)
            pks = conn.scalars(select(Model.id).where(Model.model_id != "tiny")).all()
            conn.execute(insert(Policy), [{"model_pk": pk, "position": 0,
                                           "metric": "copy/accuracy", "op": ">=",
                                           "value": 0.5} for pk in pks])
        large = {p: statements_of(client, reg, p) for p in PATHS + BIG_PATHS}
    assert {p: large[p] for p in PATHS} == small
    assert max(large.values()) <= MAX_STATEMENTS, large


@pytest.fixture
def fresh(tmp_path: Path) -> tuple[str, str]:
    store, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'index.db'}"
    build(store, db)
    return store, db


def test_mutable_facts_show_at_once_the_release_files_come_from_the_cache(
        fresh: tuple[str, str]) -> None:
    """A revocation, an alias move and a policy change show on the next
    request; the release's own files are read from the store once."""
    with Registry(*fresh) as reg, TestClient(create_app(reg), base_url="http://localhost") as client:
        page = client.get("/models/tiny/3").text
        assert "tiny@3 PASS" in text_of(page) and "REVOKED" not in page
        reg.set_alias("tiny", "prod", "3")
        reg.revoke("news", "consent withdrawn")
        reg.set_policy("tiny", ["copy/accuracy>=0.96"])
        reads: list[str] = []
        read_bytes = reg.store.read_bytes
        reg.store.read_bytes = lambda key, **kw: (reads.append(key), read_bytes(key, **kw))[1]  # type: ignore[method-assign]
        t = text_of(client.get("/models/tiny/3").text)
        assert "tiny@3 FAIL" in t and "REVOKED: consent withdrawn" in t
        assert "tiny@3 FAIL prod → 3" in text_of(client.get("/models/tiny/prod").text)
        assert "consent withdrawn" in text_of(client.get("/sources/news").text)
        assert "news" in text_of(client.get("/").text)
        assert "copy/accuracy>=0.96" in text_of(client.get("/models/tiny").text)
        assert not [k for k in reads if k.endswith(("MODEL_CARD.md", "ledger.json"))], reads


def test_keyset_pages_walk_every_version_both_ways(fresh: tuple[str, str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    with Registry(*fresh) as reg, TestClient(create_app(reg), base_url="http://localhost") as client:
        def walk(path: str, rel: str) -> list[list[str]]:
            pages = []
            while path:
                html = client.get(path).text
                pages.append(re.findall(r'<tr>\s*<td><a href="/models/tiny/([^"]+)">', html))
                m = re.search(rf'<a href="([^"]+)" rel="{rel}">', html)
                path = m.group(1).replace("&amp;", "&") if m else ""
            return pages
        assert walk("/models/tiny", "next") == [["3", "2"], ["1"]]
        assert walk("/models/tiny?before=2", "prev") == [["1"], ["3", "2"]]
        html = client.get("/sources/wiki").text
        assert "2 of 3 rows" in text_of(html)
        older = re.search(r'<a href="([^"]+)" rel="next">', html)
        assert older and older.group(1) == "/sources/wiki?before=tiny%402"
        assert re.findall(r'>(tiny@\d)<', client.get(older.group(1)).text) == ["tiny@1"]


def test_release_count_is_kept_with_the_rows(fresh: tuple[str, str]) -> None:
    with Registry(*fresh) as reg:
        def counts() -> tuple[int, int]:
            return reg.index.read(lambda s: (
                s.scalar(select(Model.release_count).where(Model.model_id == "tiny")),
                s.scalar(select(func.count()).select_from(Release))))
        assert counts() == (3, 3) and reg.ls()[0]["releases"] == 3
        reg.index.run(lambda s: record_release(s, reg.store, "tiny", "2"))  # re-indexed
        assert counts() == (3, 3)
        reg.rebuild_index()
        assert counts() == (3, 3)
        reg.create_release("r1", 30, "tiny", "4", ledger=[ledger_row("wiki")],
                           eval_summary=summary2(0.99, 1.0))
        assert counts() == (4, 4) and reg.ls()[0]["releases"] == 4


def text_of(html: str) -> str:
    """The page's text, tags dropped and entities decoded (as in test_web)."""
    import html as h
    inline = re.sub(r"</?(?:a|b|span|code|em|strong)\b[^>]*>", "", html)
    return h.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", inline)))


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_connection_the_server_dropped_is_retried_once(tmp_path: Path, db_url: str) -> None:
    """No pre-ping round trip per request: a pooled connection the server
    closed (a restart) fails its first statement, and the read or the write is
    replayed once on a new connection."""
    from sqlalchemy import create_engine, text

    store = str(tmp_path / "store")
    build(store, db_url)
    admin = create_engine(db_url, isolation_level="AUTOCOMMIT")

    def drop_connections() -> None:
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
    try:
        with Registry(store, db_url) as reg:
            assert reg.ls()[0]["releases"] == 3
            drop_connections()
            assert reg.ls()[0]["releases"] == 3
            drop_connections()
            reg.revoke("wiki", "dropped connection test")
            assert not reg.index_errors, reg.index_errors
            assert "wiki" in {r["source_id"] for r in reg.revocations()}
    finally:
        admin.dispose()


def test_migration_0003_counts_the_releases_already_indexed(tmp_path: Path,
                                                             db_url: str) -> None:
    """An index made before 0003 gets its models' counts when upgraded."""
    from alembic import command
    from sqlalchemy import create_engine

    from registry.index import Index
    from registry.index.db import _alembic_config

    store = str(tmp_path / "store")
    build(store, db_url)
    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            command.downgrade(_alembic_config(conn), "0002")
        index = Index(db_url, check=False)  # as `registry db upgrade`
        try:
            assert index.upgrade() == head_revision()  # through 0003, and on to the head
        finally:
            index.close()
        with Registry(store, db_url) as reg:
            assert reg.ls()[0]["releases"] == 3
            assert reg.index.read(lambda s: s.scalar(
                select(Model.release_count).where(Model.model_id == "tiny"))) == 3
    finally:
        engine.dispose()
