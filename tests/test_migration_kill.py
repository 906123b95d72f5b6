"""Migrations are atomic (issue 31 item 4): ``registry db upgrade`` and the
first command that migrates a fresh database, SIGKILLed at points spread over
their SQL (before a statement, before the commit), leave the schema at the
old revision or the new one -- never between -- on SQLite and Postgres, and
the next upgrade (or command) finishes the job. A SQLite schema that a
registry before this fix left half-applied is named with its repair, which
``index rebuild`` carries out."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from alembic import command
from sqlalchemy import create_engine, inspect, text

from registry.index import Index
from registry.index.db import _alembic_config, head_revision
from tests.conftest import REPO, run_cli
from tests.support.forkclient import python_run

OLD = "0003"


def _child(kill_at: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return python_run([sys.executable, "-m", "tests.support.migrate_child", str(kill_at),
                           *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)


def _points(r: subprocess.CompletedProcess[str]) -> int:
    m = re.search(r"points (\d+)", r.stderr)
    assert r.returncode == 0 and m, r.stderr
    return int(m.group(1))


def _spread(total: int, n: int = 4) -> list[int]:
    """About ``n`` kill points from the first statement to the last point."""
    return sorted({*range(1, total + 1, max(1, total // n)), total})


def _reset(db_url: str) -> None:
    eng = create_engine(db_url)
    try:
        if eng.dialect.name == "sqlite":
            eng.dispose()
            path = db_url.removeprefix("sqlite:///")
            for suffix in ("", "-wal", "-shm"):
                Path(path + suffix).unlink(missing_ok=True)
            return
        with eng.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
    finally:
        eng.dispose()


def _old_database(db_url: str) -> None:
    """A database at revision 0003 holding two models' releases."""
    _reset(db_url)
    idx = Index(db_url, check=False)
    try:
        with idx.engine.begin() as conn:
            command.upgrade(_alembic_config(conn), OLD)
            conn.execute(text("INSERT INTO models (id, model_id, release_count) VALUES "
                              "(1, 'a', 3), (2, 'b', 1)"))
            for pk, (model, version, created) in enumerate(
                    [(1, "v2", "2026-01-02"), (1, "v1", "2026-01-01"), (1, "v3", "2026-01-03"),
                     (2, "x", "2026-01-01")], start=1):
                conn.execute(text(
                    "INSERT INTO releases (id, model_pk, version, uri, manifest_sha256, bytes, "
                    "dtype, created_at, card_ok, ledger_ok, ledger_reason, evals_passed, "
                    "evals_reason) VALUES (:id, :m, :v, 'u', :sha, 1, 'f32', :c, true, true, "
                    "'', true, '')"), {"id": pk, "m": model, "v": version, "sha": "0" * 64,
                                       "c": created})
    finally:
        idx.close()


def _state(db_url: str) -> tuple[str | None, set[str], set[str], set[str]]:
    """(revision, tables, releases' columns, releases' indexes)."""
    eng = create_engine(db_url)
    try:
        insp = inspect(eng)
        tables = set(insp.get_table_names())
        rev = None
        if "alembic_version" in tables:
            with eng.connect() as conn:
                rev = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        cols = ({c["name"] for c in insp.get_columns("releases")} if "releases" in tables
                else set())
        idxs = ({i["name"] for i in insp.get_indexes("releases")} if "releases" in tables
                else set())
        return rev, tables, cols, idxs
    finally:
        eng.dispose()


def _seqs(db_url: str) -> list[tuple[str, int]]:
    eng = create_engine(db_url)
    try:
        with eng.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT version, seq FROM releases ORDER BY model_pk, seq"))]
    finally:
        eng.dispose()


def test_killed_db_upgrade_leaves_old_or_new(db_url: str) -> None:
    head = head_revision()
    _old_database(db_url)
    total = _points(_child(0, "db", "upgrade", "--db", db_url))
    assert _state(db_url)[0] == head
    for at in _spread(total):
        _old_database(db_url)
        r = _child(at, "db", "upgrade", "--db", db_url)
        assert r.returncode == -signal.SIGKILL, (at, r.stderr)
        rev, _, cols, idxs = _state(db_url)
        assert rev in (OLD, head), at
        # the schema is exactly the revision's: nothing of 0004 without its stamp
        assert ("seq" in cols) == (rev == head), (at, rev, cols)
        assert ("ix_releases_model_seq" in idxs) == (rev == head), (at, rev, idxs)
        idx = Index(db_url, check=False)
        try:
            assert idx.upgrade() == head
        finally:
            idx.close()
        # existing releases are ordered as the index had them, store untouched
        assert _seqs(db_url) == [("v1", 1), ("v2", 2), ("v3", 3), ("x", 1)], at


def test_killed_first_command_leaves_nothing_or_everything(db_url: str,
                                                           tmp_path: Path) -> None:
    head = head_revision()
    store = tmp_path / "store"
    store.mkdir()
    args = ("ls", "--db", db_url, "--store", str(store))
    _reset(db_url)
    total = _points(_child(0, *args))
    full = _state(db_url)[1]
    for at in _spread(total, 3):
        _reset(db_url)
        r = _child(at, *args)
        assert r.returncode == -signal.SIGKILL, (at, r.stderr)
        rev, tables, _, _ = _state(db_url)
        assert (rev, tables) in ((None, set()), (head, full)), (at, rev, tables)
        Index(db_url).close()  # the next use migrates (or finds it done)
        assert _state(db_url)[:2] == (head, full)


def test_a_half_applied_sqlite_schema_names_its_repair(tmp_path: Path) -> None:
    """What a registry before this fix left after a kill: 0004's column added,
    the stamp still at 0003 and the migration unable to finish. ``ls`` says to
    upgrade; the upgrade, if it cannot finish, names ``index rebuild``, which
    moves the file aside and rebuilds."""
    db = f"sqlite:///{tmp_path / 'index.db'}"
    _old_database(db)
    eng = create_engine(db)
    with eng.begin() as conn:  # a column of 0004 under another type: no upgrade fixes it
        conn.execute(text("ALTER TABLE releases ADD COLUMN seq TEXT NOT NULL DEFAULT 'x'"))
        conn.execute(text("CREATE TABLE ix_releases_model_seq (a INTEGER)"))
    eng.dispose()
    store = tmp_path / "store"
    store.mkdir()
    r = run_cli("ls", "--db", db, "--store", str(store))
    assert r.returncode == 9 and "registry db upgrade" in r.stderr, r.stderr
    r = run_cli("db", "upgrade", "--db", db)
    assert r.returncode == 8 and "Traceback" not in r.stderr, r.stderr
    assert f"registry index rebuild --db {db}" in r.stderr
    r = run_cli("index", "rebuild", "--db", db, "--store", str(store))
    assert r.returncode == 0 and "moved the damaged index aside" in r.stdout, r.stderr
    assert _state(db)[0] == head_revision()
    assert list(tmp_path.glob("index.db.damaged-*"))


def test_an_old_half_applied_0003_finishes(tmp_path: Path) -> None:
    """0003 killed by an older registry after its ALTER (committed) and before
    its stamp: the migration is idempotent, so `db upgrade` finishes it."""
    db = f"sqlite:///{tmp_path / 'index.db'}"
    idx = Index(db, check=False)
    with idx.engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0002")
        conn.execute(text("ALTER TABLE models ADD COLUMN release_count INTEGER NOT NULL "
                          "DEFAULT 0"))
    idx.close()
    idx = Index(db, check=False)
    try:
        assert idx.upgrade() == head_revision()
    finally:
        idx.close()
