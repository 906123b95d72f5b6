"""The SQL index (DESIGN sections 5-6) on SQLite and on PostgreSQL (``db_url``).

Schema: a new database is brought to the Alembic head on first use; the ORM
metadata and the migrated schema agree (``alembic.autogenerate.compare_metadata``);
the migrations have one head and downgrade/upgrade cleanly; a database whose
schema is behind is refused with IndexOutOfDateError naming ``registry db
upgrade`` (API and CLI, no traceback); ``registry db upgrade`` works.

Writes: every fact committed through the Registry facade (checkpoint, release
from a checkpoint and from a directory, alias moves, revocation, policy) is a
row in the index right after its store commit (read back with plain
SQLAlchemy). When the index cannot be written (SQLite file in a missing
directory; the Postgres database dropped mid-way) the store commit stands, an
IndexWriteWarning is emitted and ``registry index rebuild`` repairs the index.

Rebuild: a populated store (two models, f32/bf16/int4 releases, an imported
release, aliases, a policy, revocations, checkpoints) on local disk and S3
answers every query through the CLI (``--json``); the database is then emptied
(every table dropped), ``registry index rebuild`` runs, and every answer is
byte-identical. The bulk of the queries run through the real CLI application
(``registry.cli.app``) in one fresh child process per phase, each with its own
argv (one process per query would cost ~40 process starts per case); the
commands whose process behaviour matters (rebuild, revoke, policy, errors)
run as real ``python -m registry`` processes.

Semantics: a revocation makes a version stop passing at once; ``--require``
thresholds; per-model policy; the index's passing set equals
``registry.gating.gates.evaluate`` on the store (``ModelRelease.check``) for a zoo of
releases (failing evals, bad ledgers, missing card, sources revoked later,
policy failures -- releases a gate would refuse are committed directly with the
commit protocol, as an import by another tool would); ``diff``.

Manifests get ``created_at`` from a fake clock (one second per manifest) where
the newest-first order matters, so the order never depends on how fast the
machine is; :func:`test_same_second_releases_keep_their_order_after_rebuild`
freezes the clock on purpose.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, MetaData, create_engine, inspect, select, text

from registry.refs.alias_history import read_head
from registry.api import IndexWriteWarning, Registry
from registry.protocol.commit import DirectoryWriter
from registry.errors import IndexOutOfDateError
from registry.gating.gates import passed
from registry.index import Index
from registry.index import schema as t
from registry.index.db import SCHEMA_HEAD, _alembic_config, head_revision
from registry.index.queries import checkpoints
from registry.release import ModelRelease
from registry.store import Store, open_store
from registry.protocol.verify import read_manifest, verify_directory
from tests.ckpt_util import save
from tests.conftest import POSTGRES, run_cli, run_cli_batch
from tests.release_util import head, ledger_row, summary, summary2

W = np.random.default_rng(7).standard_normal((8, 64), dtype=np.float32)
B = np.linspace(-1, 1, 8, dtype=np.float32)
TABLES = {"models", "releases", "release_files", "ledger_sources", "release_sources",
          "revocations", "eval_results", "aliases", "policies", "checkpoints",
          "yanks", "tombstones", "release_tags", "alias_moves"}


# -- helpers -------------------------------------------------------------------------


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every manifest built in this process is one second newer than the last."""
    now = [datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)]

    def tick() -> str:
        now[0] += timedelta(seconds=1)
        return now[0].strftime("%Y-%m-%dT%H:%M:%SZ")

    monkeypatch.setattr("registry.protocol.manifest.utc_now", tick)


@contextmanager
def engine(db_url: str) -> Iterator[Engine]:
    eng = create_engine(db_url)
    try:
        yield eng
    finally:
        eng.dispose()


def fetch(db_url: str, stmt: Any) -> list[tuple[Any, ...]]:
    """Rows of ``stmt`` read with a fresh engine (no Registry code involved)."""
    with engine(db_url) as eng, eng.connect() as conn:
        return [tuple(r) for r in conn.execute(stmt)]


def execute(db_url: str, *statements: str) -> None:
    with engine(db_url) as eng, eng.begin() as conn:
        for s in statements:
            conn.execute(text(s))


def drop_all_tables(db_url: str) -> None:
    """Empty the database: every table, alembic_version included."""
    with engine(db_url) as eng:
        md = MetaData()
        md.reflect(eng)
        md.drop_all(eng)
        assert inspect(eng).get_table_names() == []


def is_postgres(db_url: str) -> bool:
    return db_url.startswith("postgresql")


def pg_admin(sql: str) -> None:
    with engine(POSTGRES) as eng:
        with eng.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
            conn.execute(text(sql))


def params(scale: float) -> dict[str, np.ndarray]:
    return {"w": W * scale, "b": B * scale}


def checkpoint(reg: Registry, run_id: str = "r1", steps: Sequence[int] = (10,),
               keep: int = 0) -> None:
    with reg.checkpoint_manager(run_id, keep_ckpts=keep, async_save=False) as m:
        for step in steps:
            save(m, step, params=params(1.0 + step / 100),
                 generation_config={"max_new_tokens": 8})


def versions(rows: list[dict[str, Any]]) -> list[str]:
    return [r["version"] for r in rows]


def model_dir(store: Store, tmp_path: Path, name: str, src: str = "models/tiny/1") -> Path:
    """A plain model directory (a Hugging Face style export) copied out of a release."""
    d = tmp_path / name
    d.mkdir()
    for f in ("model.safetensors", "config.json"):
        (d / f).write_bytes(store.read_bytes(f"{src}/{f}"))
    return d


def forge_release(store: Store, model_id: str, version: str, *, card: str | None = "# card\n",
                  ledger: Any = None, evals: Any = None, src: str = "models/tiny/1") -> None:
    """Commit a release directory with the commit protocol but without ModelRelease's
    gates: what an import by another tool, or an older registry, leaves in the store.
    ``ledger``/``evals``: a document (dumped as JSON), raw ``bytes``, or None (absent)."""
    with DirectoryWriter(store, f"models/{model_id}/{version}", kind="release",
                         meta={"model_id": model_id, "version": version,
                               "source": {"uri": f"file:///imports/{model_id}-{version}"}}) as w:
        for f in ("model.safetensors", "config.json"):
            w.write_bytes(f, store.read_bytes(f"{src}/{f}"))
        if card is not None:
            w.write_bytes("MODEL_CARD.md", card.encode())
        for name, doc in (("ledger.json", ledger), ("evals/summary.json", evals)):
            if doc is not None:
                w.write_bytes(name, doc if isinstance(doc, bytes) else json.dumps(doc).encode())
        w.commit()


#: Runs CLI commands through the real application (typer app, argument parsing,
#: error boundary, JSON printing) in one fresh process: one JSON list of argv in
#: on stdin, one JSON list of [exit code, stdout, stderr] out.
def cli_batch(commands: list[list[str]]) -> list[str]:
    """stdout of every command (each must exit 0, with no traceback), run
    one after another in one real process (conftest.run_cli_batch)."""
    results = run_cli_batch(commands)
    for r in results:
        assert r.returncode == 0, (r.args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr, (r.args, r.stderr)
    return [r.stdout for r in results]


def assert_clean_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A non-zero exit with one ``error:`` line (with --json: one error document)
    naming ``needles``, and no traceback."""
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    if r.stderr.startswith("{"):
        doc = json.loads(r.stderr)
        assert doc["error"]["exit_code"] == r.returncode
        said = doc["error"]["message"]
    else:
        assert r.stderr.startswith("error: "), r.stderr
        said = r.stderr
    for n in needles:
        assert n in said, r.stderr


# -- 1. schema and migrations -------------------------------------------------------


def test_new_database_is_created_at_head(db_url: str) -> None:
    head = head_revision()
    with Registry(open_store("memory://idx-new"), db=db_url) as reg:
        assert reg.ls() == []  # first use creates the schema
    assert fetch(db_url, text("SELECT version_num FROM alembic_version")) == [(head,)]
    with engine(db_url) as eng:
        names = set(inspect(eng).get_table_names())
    assert names == TABLES | {"alembic_version"}
    assert set(t.Base.metadata.tables) == TABLES
    idx = Index(db_url)  # a second open of a database at head changes nothing
    try:
        assert idx.current_revision() == head
    finally:
        idx.close()
    assert fetch(db_url, text("SELECT count(*) FROM alembic_version")) == [(1,)]


def test_orm_metadata_matches_the_migrated_schema(db_url: str) -> None:
    Index(db_url).close()
    with engine(db_url) as eng, eng.connect() as conn:
        mc = MigrationContext.configure(conn, opts={"compare_type": True,
                                                    "compare_server_default": True})
        diff = compare_metadata(mc, t.Base.metadata)
    assert diff == []


def test_one_head_and_a_clean_downgrade_upgrade_cycle(db_url: str) -> None:
    script = ScriptDirectory.from_config(_alembic_config(None))
    heads = script.get_heads()
    assert heads == [head_revision()]
    # The index opens a database stamped SCHEMA_HEAD without loading alembic:
    # a new migration must move it, or databases would stay unmigrated.
    assert heads == [SCHEMA_HEAD]
    chain = list(script.walk_revisions())
    assert chain[-1].down_revision is None  # one line of history down to base
    assert len({r.revision for r in chain}) == len(chain)
    Index(db_url).close()
    with engine(db_url) as eng:
        with eng.begin() as conn:
            command.downgrade(_alembic_config(conn), "base")
        assert set(inspect(eng).get_table_names()) <= {"alembic_version"}
        with eng.begin() as conn:
            command.upgrade(_alembic_config(conn), "head")
        with eng.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == heads[0]
            assert compare_metadata(MigrationContext.configure(conn), t.Base.metadata) == []


BEHIND = {
    # a database stamped by a registry version this one does not know
    "unknown-older-revision": "UPDATE alembic_version SET version_num = '0000_older'",
    # tables present but the revision row lost
    "empty-version-table": "DELETE FROM alembic_version",
}


def close_refused_index(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """Dispose the engine of an Index whose constructor raised. The library leaves
    it open (see test_refused_index_leaves_no_connection_open); without this its
    pooled connection would be closed by the garbage collector, with a
    ResourceWarning, in whichever test happens to run then."""
    for entry in excinfo.traceback:
        obj = entry.locals.get("self")
        if isinstance(obj, Index):
            obj.close()


def open_connections(db_url: str) -> int:
    """Connections this test process holds open to the database."""
    if is_postgres(db_url):
        name = db_url.rsplit("/", 1)[1]
        return fetch(db_url, text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = :d "
            "AND pid <> pg_backend_pid()").bindparams(d=name))[0][0]
    path = db_url.removeprefix("sqlite:///")
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir()
               if os.path.realpath(fd) in (path, f"{path}-wal", f"{path}-shm"))


@pytest.mark.parametrize("how", sorted(BEHIND))
def test_database_behind_is_refused(db_url: str, how: str, tmp_path: Path) -> None:
    Index(db_url).close()
    execute(db_url, BEHIND[how])
    with pytest.raises(IndexOutOfDateError, match="registry db upgrade") as e:
        Index(db_url)
    close_refused_index(e)
    with Registry(open_store("memory://idx-behind"), db=db_url) as reg:
        with pytest.raises(IndexOutOfDateError, match="registry db upgrade") as e:
            reg.passing("tiny")
        close_refused_index(e)
    (tmp_path / "s").mkdir()  # an existing (empty) store: the index is what refuses
    r = run_cli("query", "tiny", "--passing", "--json", "--store", str(tmp_path / "s"),
                "--db", db_url)
    assert_clean_error(r, "registry db upgrade")
    assert r.returncode == 9 and r.stdout == ""
    # refused, not repaired behind the user's back
    assert len(fetch(db_url, text("SELECT * FROM alembic_version"))) == (
        1 if how == "unknown-older-revision" else 0)


def test_refused_index_leaves_no_connection_open(db_url: str) -> None:
    """Index() raising IndexOutOfDateError must not leave its pool (and an open
    connection) behind: a long-lived service retrying would leak one each time."""
    Index(db_url).close()
    execute(db_url, BEHIND["unknown-older-revision"])
    assert open_connections(db_url) == 0
    with pytest.raises(IndexOutOfDateError) as e:
        Index(db_url)
    try:
        assert open_connections(db_url) == 0
    finally:
        close_refused_index(e)


@pytest.mark.parametrize("how", sorted(BEHIND))
def test_db_upgrade_that_cannot_proceed_fails_cleanly(db_url: str, how: str) -> None:
    """Following the advice of IndexOutOfDateError must never end in a traceback."""
    Index(db_url).close()
    execute(db_url, BEHIND[how])
    r = run_cli("db", "upgrade", "--db", db_url)
    assert_clean_error(r)


def test_db_upgrade_on_a_fresh_database(db_url: str, tmp_path: Path) -> None:
    head = head_revision()
    r = run_cli("db", "upgrade", "--db", db_url)
    assert r.returncode == 0, r.stderr
    assert f"at revision {head}" in r.stdout
    assert fetch(db_url, text("SELECT version_num FROM alembic_version")) == [(head,)]
    with engine(db_url) as eng:
        assert set(inspect(eng).get_table_names()) == TABLES | {"alembic_version"}
    r = run_cli("db", "upgrade", "--db", db_url)  # idempotent
    assert r.returncode == 0, r.stderr
    assert fetch(db_url, text("SELECT version_num FROM alembic_version")) == [(head,)]
    with Registry(str(tmp_path / "store"), db=db_url) as reg:
        assert reg.ls() == []


# -- 2. write paths -----------------------------------------------------------------


def release_row(db_url: str, model_id: str, version: str) -> dict[str, Any]:
    with engine(db_url) as eng, eng.connect() as conn:
        row = conn.execute(select(t.Release.__table__).join(t.Model).where(
            t.Model.model_id == model_id, t.Release.version == version)).one()
        return dict(row._mapping)


def test_every_write_lands_in_the_index(db_url: str, tmp_path: Path, clock: None) -> None:
    store_url = str(tmp_path / "store")
    with Registry(store_url, db=db_url) as reg:
        store = reg.store
        # checkpoint commit via Registry.checkpoint_manager
        checkpoint(reg, "r1", (10, 20))
        for step in (10, 20):
            m = read_manifest(store, f"runs/r1/ckpt/step-{step:06d}")
            assert fetch(db_url, select(
                t.Checkpoint.run_id, t.Checkpoint.uri, t.Checkpoint.manifest_sha256,
                t.Checkpoint.bytes, t.Checkpoint.created_at).where(t.Checkpoint.step == step)) \
                == [("r1", store.url_of(f"runs/r1/ckpt/step-{step:06d}"), m.digest,
                     m.total_size, m.created_at)]

        # release from a checkpoint
        r1 = reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row("wiki"),
                                ledger_row("books", allowed_uses=["train"])],
                                eval_summary=summary(0.9))
        ck = read_manifest(store, "runs/r1/ckpt/step-000010")
        row = release_row(db_url, "tiny", "1")
        assert {k: row[k] for k in ("version", "uri", "manifest_sha256", "bytes", "dtype",
                                    "source_run_id", "source_step", "source_uri",
                                    "source_manifest_sha256", "created_at", "card_ok",
                                    "ledger_ok", "evals_passed", "suite", "suite_version")} == {
            "version": "1", "uri": store.url_of("models/tiny/1"),
            "manifest_sha256": r1.manifest.digest, "bytes": r1.manifest.total_size,
            "dtype": "f32", "source_run_id": "r1", "source_step": 10, "source_uri": None,
            "source_manifest_sha256": ck.digest, "created_at": r1.manifest.created_at,
            "card_ok": True, "ledger_ok": True, "evals_passed": True, "suite": "smoke",
            "suite_version": "1"}
        assert fetch(db_url, select(t.ReleaseFile.path, t.ReleaseFile.bytes,
                                    t.ReleaseFile.sha256)
                     .where(t.ReleaseFile.release_pk == row["id"])
                     .order_by(t.ReleaseFile.path)) == [
            (e.path, e.size, e.sha256) for e in r1.manifest.files]
        assert fetch(db_url, select(t.LedgerSource.source_id, t.LedgerSource.license,
                                    t.ReleaseSource.allowed_uses, t.ReleaseSource.revoked_in_file)
                     .join(t.ReleaseSource, t.ReleaseSource.source_pk == t.LedgerSource.id)
                     .where(t.ReleaseSource.release_pk == row["id"])
                     .order_by(t.LedgerSource.source_id)) == [
            ("books", "CC-BY-4.0", "train", False), ("wiki", "CC-BY-4.0", "train,eval", False)]
        assert fetch(db_url, select(t.EvalResult.task, t.EvalResult.metric, t.EvalResult.value,
                                    t.EvalResult.n, t.EvalResult.threshold,
                                    t.EvalResult.higher_is_better, t.EvalResult.passed)
                     .where(t.EvalResult.release_pk == row["id"])) == [
            ("copy", "accuracy", 0.9, 100, 0.5, True, True)]

        # a bf16 release of another step
        r2 = reg.create_release("r1", 20, "tiny", "2", dtype="bf16",
                                ledger=[ledger_row("wiki")], eval_summary=summary2(0.8, 1.5))
        row2 = release_row(db_url, "tiny", "2")
        assert (row2["dtype"], row2["source_step"], row2["manifest_sha256"]) == (
            "bf16", 20, r2.manifest.digest)
        assert sorted(fetch(db_url, select(t.EvalResult.task_metric, t.EvalResult.value)
                            .where(t.EvalResult.release_pk == row2["id"]))) == [
            ("copy/accuracy", 0.8), ("copy/loss", 1.5)]

        # publish of an existing model directory
        d = model_dir(store, tmp_path, "export")
        r3 = reg.publish(d, "tiny", "3", ledger=[ledger_row("news")], eval_summary=summary(0.7))
        row3 = release_row(db_url, "tiny", "3")
        assert (row3["source_uri"], row3["source_run_id"], row3["source_step"], row3["dtype"],
                row3["manifest_sha256"]) == (str(d), None, None, "f32", r3.manifest.digest)
        assert len(fetch(db_url, select(t.Model.model_id))) == 1

        # alias, then an alias move: one row that follows the pointer
        alias_q = (select(t.Model.model_id, t.Alias.alias, t.Alias.version)
                   .join(t.Model, t.Model.id == t.Alias.model_pk))
        reg.set_alias("tiny", "prod", "1")
        assert fetch(db_url, alias_q) == [("tiny", "prod", "1")]
        assert reg.set_alias("tiny", "prod", "2") == "1"
        assert fetch(db_url, alias_q) == [("tiny", "prod", "2")]

        # revocation: written to the store (ledger/) and then the index
        assert versions(reg.passing("tiny")) == ["3", "2", "1"]
        rev, created = reg.revoke("books", "license withdrawn")
        assert created and store.exists("ledger/revocations/books.json")
        assert fetch(db_url, select(t.Revocation.source_id, t.Revocation.revoked_at,
                                    t.Revocation.reason)) == [
            ("books", rev.revoked_at, "license withdrawn")]
        assert versions(reg.passing("tiny")) == ["3", "2"]

        # policy: stored in the store, then the index, in order
        reg.set_policy("tiny", ["accuracy>=0.75", "copy/loss<=2"])
        assert store.exists("models/tiny/policy.json")
        assert fetch(db_url, select(t.Policy.position, t.Policy.metric, t.Policy.op,
                                    t.Policy.value).order_by(t.Policy.position)) == [
            (0, "accuracy", ">=", 0.75), (1, "copy/loss", "<=", 2.0)]
        assert versions(reg.passing("tiny")) == ["2"]
        reg.set_policy("tiny", [])
        assert fetch(db_url, select(t.Policy.metric)) == []
        assert reg.index_errors == []


def test_failing_index_write_keeps_the_store_commit(db_url: str, tmp_path: Path,
                                                    clock: None) -> None:
    store_url = str(tmp_path / "store")
    if is_postgres(db_url):
        broken_url = db_url
        reg = Registry(store_url, db=broken_url)
        checkpoint(reg)  # indexed normally (a warning would fail the test)
        assert len(fetch(db_url, select(t.Checkpoint.id))) == 1
        pg_admin(f'DROP DATABASE "{db_url.rsplit("/", 1)[1]}" WITH (FORCE)')  # mid-way
    else:
        broken_url = f"sqlite:///{tmp_path / 'no-such-dir' / 'index.db'}"
        reg = Registry(store_url, db=broken_url)
        with pytest.warns(IndexWriteWarning, match="registry index rebuild"):
            checkpoint(reg)
    store = reg.store
    assert verify_directory(store, "runs/r1/ckpt/step-000010", full=True).ok

    with pytest.warns(IndexWriteWarning, match=r"models/tiny/1 is committed in the store"):
        rel = reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row("wiki")],
                                 eval_summary=summary(0.9))
    assert verify_directory(store, "models/tiny/1", full=True).ok
    assert read_manifest(store, "models/tiny/1").digest == rel.manifest.digest
    with pytest.warns(IndexWriteWarning, match="registry index rebuild"):
        reg.create_release("r1", 10, "tiny", "2", dtype="bf16", ledger=[ledger_row("books")],
                           eval_summary=summary(0.8))
    with pytest.warns(IndexWriteWarning, match="alias tiny@prod"):
        reg.set_alias("tiny", "prod", "1")
    with pytest.warns(IndexWriteWarning, match="revocation of books"):
        reg.revoke("books", "withdrawn")
    with pytest.warns(IndexWriteWarning, match="policy of tiny"):
        reg.set_policy("tiny", ["accuracy>=0.85"])
    assert len(reg.index_errors) == (5 if is_postgres(db_url) else 6)
    assert read_head(store, "tiny", "prod").version == "1"
    assert store.exists("ledger/revocations/books.json")
    assert verify_directory(store, "models/tiny/2", full=True).ok
    reg.close()

    # repair the database server side, then rebuild from the store alone
    if is_postgres(db_url):
        pg_admin(f'CREATE DATABASE "{db_url.rsplit("/", 1)[1]}"')
    else:
        (tmp_path / "no-such-dir").mkdir()
    r = run_cli("index", "rebuild", "--json", "--store", store_url, "--db", broken_url)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"models": 1, "releases": 2, "aliases": 1,
                                    "checkpoints": 1, "revocations": 1, "alias_moves": 1,
                                    "tombstones": 0, "yanks": 0, "tagged": 0, "report": []}
    r = run_cli("query", "tiny", "--passing", "--json", "--store", store_url,
                "--db", broken_url)
    assert r.returncode == 0, r.stderr
    assert versions(json.loads(r.stdout)) == ["1"]  # 2 used books (revoked), 2 < 0.85
    with Registry(store_url, db=broken_url) as reg2:
        assert reg2.show("tiny", "1")["aliases"] == ["prod"]
        assert [x["source_id"] for x in reg2.revocations()] == ["books"]
        assert [g["gate"] for g in reg2.show("tiny", "2")["gates"]][-1] == "policy:accuracy>=0.85"
        assert len(checkpoints_of(reg2, "r1")) == 1


def checkpoints_of(reg: Registry, run_id: str) -> list[dict[str, Any]]:
    return reg.index.run(lambda s: checkpoints(s, run_id))


# -- 3. rebuild ---------------------------------------------------------------------


def populate(reg: Registry, tmp_path: Path) -> None:
    """Two models, f32/bf16/int4 releases and an import, aliases, a policy,
    revocations, checkpoints of two runs -- all through the facade."""
    checkpoint(reg, "r1", (10, 20))
    checkpoint(reg, "r2", (5,))
    wiki, books = ledger_row("wiki"), ledger_row("books", license="CC0-1.0")
    news = ledger_row("news", license="MIT", allowed_uses=["train"])
    reg.create_release("r1", 10, "tiny", "1.9", ledger=[wiki, books], eval_summary=summary(0.9),
                       tokenizer_config={"chat_template": "{{x}}"})
    reg.create_release("r1", 20, "tiny", "1.10", dtype="bf16", ledger=[wiki],
                       eval_summary=summary2(0.8, 1.0), heads=[head(input_dim=8)])
    reg.create_release("r1", 20, "tiny", "2.0", ledger=[books], eval_summary=summary(0.95))
    reg.create_release("r1", 20, "tiny", "2.1", dtype="int4", group_size=32, ledger=[wiki],
                       eval_summary=summary2(0.92, 0.5))
    reg.create_release("r2", 5, "other", "a", ledger=[news], eval_summary=summary(0.7))
    reg.create_release("r2", 5, "other", "b", dtype="bf16", ledger=[news, wiki],
                       eval_summary=summary(0.85))
    reg.publish(model_dir(reg.store, tmp_path, "export", "models/other/a"), "other",
                "imported", ledger=[news], eval_summary=summary(0.8))
    reg.set_alias("tiny", "prod", "1.9")
    reg.set_alias("tiny", "prod", "1.10")
    reg.set_alias("tiny", "staging", "2.0")
    reg.set_alias("other", "prod", "a")
    reg.set_policy("other", ["accuracy>=0.75"])
    reg.revoke("books", "license withdrawn")
    reg.revoke("unused", "never used by a release")


def queries(store_url: str, db_url: str) -> list[list[str]]:
    s = ["--json", "--store", store_url, "--db", db_url]
    return [[*q, *s] for q in (
        ["query", "tiny", "--passing"],
        ["query", "tiny", "--passing", "--require", "accuracy>=0.85"],
        ["query", "tiny", "--passing", "--latest"],
        ["query", "tiny", "--passing", "--require", "copy/loss<=0.8", "--latest"],
        ["query", "other", "--passing"],
        ["query", "other", "--passing", "--require", "copy/accuracy>=0.81"],
        ["query", "--source", "wiki"],
        ["query", "--source", "books"],
        ["query", "--source", "news"],
        ["show", "tiny@1.9"],
        ["show", "tiny@prod"],
        ["show", "tiny@2.1"],
        ["show", "other@a"],
        ["show", "other@imported"],
        ["ls"],
        ["ls", "tiny"],
        ["ls", "other"],
        ["diff", "tiny@1.9", "tiny@1.10"],
        ["diff", "other@a", "other@prod"],
        ["diff", "tiny@2.1", "tiny@staging"],
    )] + [["ledger", "ls", "--json", "--store", store_url]]


def test_rebuild_answers_every_query_identically(durable_store_url: str, db_url: str,
                                                 tmp_path: Path, clock: None) -> None:
    with Registry(durable_store_url, db=db_url) as reg:
        populate(reg, tmp_path)
        before_ckpts = {r: checkpoints_of(reg, r) for r in ("r1", "r2")}
        assert reg.index_errors == []
    qs = queries(durable_store_url, db_url)
    before = cli_batch(qs)
    docs = [json.loads(o) for o in before]
    # the answers are the expected ones, not merely the same twice
    assert versions(docs[0]) == ["2.1", "1.10"]  # 1.9 and 2.0 used the revoked books
    assert versions(docs[1]) == ["2.1"]
    assert versions(docs[2]) == ["2.1"]
    assert versions(docs[3]) == ["2.1"]
    assert versions(docs[4]) == ["imported", "b"]  # a fails the policy accuracy>=0.75
    assert versions(docs[5]) == ["b"]
    assert [(r["model_id"], r["version"]) for r in docs[6]] == [
        ("other", "b"), ("tiny", "1.9"), ("tiny", "1.10"), ("tiny", "2.1")]
    assert [r["version"] for r in docs[7]] == ["1.9", "2.0"]
    assert all(r["live_revoked"] for r in docs[7])
    assert docs[10]["version"] == "1.10" and docs[10]["dtype"] == "bf16"
    assert docs[11]["dtype"] == "int4 (1 of 2 tensors)" and docs[12]["passed"] is False
    assert docs[13]["source"]["uri"] and docs[13]["source"]["run_id"] is None
    assert docs[14] == [{"model_id": "other", "newest": "imported", "newest_passing": "imported",
                         "releases": 3, "aliases": ["prod"]},
                        {"model_id": "tiny", "newest": "2.1", "newest_passing": "2.1",
                         "releases": 4, "aliases": ["prod", "staging"]}]
    assert "heads/sentiment.json" in docs[17]["added"]
    assert [r["source_id"] for r in docs[20]] == ["books", "unused"]

    drop_all_tables(db_url)
    r = run_cli("index", "rebuild", "--json", "--store", durable_store_url, "--db", db_url)
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout)
    counts.pop("report")  # what rebuild skipped, kept or removed, with reasons (issue 31)
    assert counts == {"models": 2, "releases": 7, "aliases": 3,
                      "checkpoints": 3, "revocations": 2, "alias_moves": 4, "tombstones": 0,
                      "yanks": 0, "tagged": 0}
    after = cli_batch(qs)
    for q, a, b in zip(qs, before, after, strict=True):
        assert a == b, q
    with Registry(durable_store_url, db=db_url) as reg:
        assert {r: checkpoints_of(reg, r) for r in ("r1", "r2")} == before_ckpts


def test_same_second_releases_keep_their_order_after_rebuild(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """created_at has one-second resolution: releases published within one second
    (a script publishing 9 then 10) must be ordered the same by the incremental
    index and by a rebuild -- the index is a function of the store."""
    store_url = str(tmp_path / "store")
    monkeypatch.setattr("registry.protocol.manifest.utc_now", lambda: "2026-11-29T12:00:00Z")
    with Registry(store_url, db=db_url) as reg:
        checkpoint(reg)
        for v in ("9", "10"):
            reg.create_release("r1", 10, "tiny", v, ledger=[ledger_row()],
                               eval_summary=summary())

        def answers() -> list[Any]:
            return [reg.passing("tiny"), reg.passing("tiny", latest=True), reg.ls("tiny"),
                    reg.ls()]

        before = answers()
        reg.rebuild_index()
        assert answers() == before


def test_retention_removes_checkpoints_from_the_index(db_url: str, tmp_path: Path) -> None:
    """keep_ckpts deletes old steps from the store; the index must follow (as a
    rebuild would), not keep listing checkpoints that no longer exist."""
    with Registry(str(tmp_path / "store"), db=db_url) as reg:
        checkpoint(reg, "r1", (10, 20, 30), keep=2)
        assert reg.store.subdirs("runs/r1/ckpt") == ["step-000020", "step-000030"]
        incremental = checkpoints_of(reg, "r1")
        reg.rebuild_index()
        rebuilt = checkpoints_of(reg, "r1")
        assert [c["step"] for c in rebuilt] == [20, 30]
        assert incremental == rebuilt


# -- 4. gate semantics --------------------------------------------------------------


def test_revocation_stops_passing_at_once(db_url: str, tmp_path: Path, clock: None) -> None:
    store_url = str(tmp_path / "store")
    s = ["--store", store_url, "--db", db_url]
    with Registry(store_url, db=db_url) as reg:
        checkpoint(reg)
        reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row("wiki")],
                           eval_summary=summary())
        reg.create_release("r1", 10, "tiny", "2", ledger=[ledger_row("books")],
                           eval_summary=summary())
        reg.set_alias("tiny", "prod", "1")
        assert versions(reg.passing("tiny")) == ["2", "1"]
        r = run_cli("ledger", "revoke", "wiki", "--reason", "takedown request", "--json", *s)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["created"] is True
        # no rebuild: the next query already excludes it
        r = run_cli("query", "tiny", "--passing", "--json", *s)
        assert r.returncode == 0, r.stderr
        assert versions(json.loads(r.stdout)) == ["2"]
        assert versions(reg.passing("tiny")) == ["2"]
        assert versions(reg.passing("tiny", latest=True)) == ["2"]
        doc = reg.show(*reg.resolve("tiny@prod"))
        assert doc["passed"] is False
        ledger = next(g for g in doc["gates"] if g["gate"] == "ledger")
        assert not ledger["passed"] and "takedown request" in ledger["reason"]
        assert doc["sources"][0]["revoked"] is True
        assert [(x["version"], x["live_revoked"]) for x in reg.releases_for_source("wiki")] \
            == [("1", True)]
        assert [(x["version"], x["passing"]) for x in reg.ls("tiny")] == [
            ("2", True), ("1", False)]
        assert passed(reg.gate_check("tiny", "1")) is False  # the store agrees


def test_require_thresholds(db_url: str, tmp_path: Path, clock: None) -> None:
    store_url = str(tmp_path / "store")
    with Registry(store_url, db=db_url) as reg:
        checkpoint(reg)
        for v, acc, loss in (("a", 0.6, 2.5), ("b", 0.8, 1.0), ("c", 0.95, 2.0)):
            reg.create_release("r1", 10, "tiny", v, ledger=[ledger_row()],
                               eval_summary=summary2(acc, loss))
        cases = {
            (): ["c", "b", "a"],
            ("accuracy>=0.8",): ["c", "b"],  # inclusive
            ("accuracy>=0.8", "accuracy<=0.9"): ["b"],
            ("copy/accuracy>=0.9",): ["c"],
            ("loss<=2",): ["c", "b"],
            ("copy/loss<=1.5", "accuracy>=0.5"): ["b"],
            (" accuracy >= 0.8 ",): ["c", "b"],  # spaces allowed
            ("f1>=0",): [],  # a metric no release has never passes
            ("accuracy<=1e300",): ["c", "b", "a"],  # (infinity is refused: issue 31)
        }
        for req, want in cases.items():
            assert versions(reg.passing("tiny", require=req)) == want, req
        assert versions(reg.passing("tiny", require=["accuracy>=0.8"], latest=True)) == ["c"]
        assert reg.passing("tiny", require=["accuracy>=0.99"], latest=True) == []
    r = run_cli("query", "tiny", "--passing", "--require", "accuracy>=0.7", "--require",
                "loss<=1.5", "--json", "--store", store_url, "--db", db_url)
    assert r.returncode == 0, r.stderr
    assert versions(json.loads(r.stdout)) == ["b"]


def test_malformed_require_is_a_usage_error(db_url: str, tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    with Registry(store_url, db=db_url) as reg:
        checkpoint(reg)
        reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row()], eval_summary=summary())
    r = run_cli("query", "tiny", "--passing", "--require", "accuracy>0.8", "--json",
                "--store", store_url, "--db", db_url)
    assert_clean_error(r, "accuracy>0.8")
    assert r.returncode == 2


def test_policy_is_per_model(db_url: str, tmp_path: Path, clock: None) -> None:
    store_url = str(tmp_path / "store")
    with Registry(store_url, db=db_url) as reg:
        checkpoint(reg)
        for model in ("tiny", "other"):
            for v, acc in (("low", 0.7), ("high", 0.9)):
                reg.create_release("r1", 10, model, v, ledger=[ledger_row()],
                                   eval_summary=summary(acc))
        r = run_cli("policy", "set", "tiny", "--require", "accuracy>=0.8", "--store", store_url,
                    "--db", db_url)
        assert r.returncode == 0, r.stderr
        assert versions(reg.passing("tiny")) == ["high"]
        assert versions(reg.passing("other")) == ["high", "low"]
        assert [g["gate"] for g in reg.show("tiny", "low")["gates"]] == [
            "model_card", "ledger", "evals", "policy:accuracy>=0.8"]
        assert reg.show("tiny", "low")["passed"] is False
        assert [g["gate"] for g in reg.show("other", "low")["gates"]] == [
            "model_card", "ledger", "evals"]
        # policy and --require add up
        assert versions(reg.passing("other", require=["accuracy>=0.8"])) == ["high"]
        assert versions(reg.passing("tiny", require=["accuracy<=0.85"])) == []
        reg.set_policy("other", ["copy/accuracy>=0.95"])
        assert versions(reg.passing("other")) == []
        assert versions(reg.passing("tiny")) == ["high"]
        reg.set_policy("tiny", [])
        assert versions(reg.passing("tiny")) == ["high", "low"]
        assert [(m["model_id"], m["newest_passing"]) for m in reg.ls()] == [
            ("other", None), ("tiny", "high")]


REQUIRES: list[tuple[str, ...]] = [(), ("accuracy>=0.85",), ("copy/accuracy<=0.95",),
                                   ("f1>=0.1",), ("accuracy<=1e300", "copy/loss<=1.5")]


def assert_index_agrees_with_gates(reg: Registry) -> set[tuple[str, str, bool]]:
    """For every committed release and every extra requirement: in the index's
    passing set iff registry.gating.gates.evaluate (ModelRelease.check) passes on the store;
    show's gates are evaluate's gates. Returns (model, version, passing) with no extra."""
    store = reg.store
    check = ModelRelease(store)
    seen = set()
    for model_id in store.subdirs("models"):
        releases = [v for v in store.subdirs(f"models/{model_id}")
                    if store.exists(f"models/{model_id}/{v}/MANIFEST.json")]
        for req in REQUIRES:
            index_ok = set(versions(reg.passing(model_id, require=req)))
            for v in releases:
                gates = check.check(model_id, v, require=req)
                assert (v in index_ok) == passed(gates), (model_id, v, req, gates)
                if not req:
                    seen.add((model_id, v, passed(gates)))
                    shown = [(g["gate"], g["passed"]) for g in reg.show(model_id, v)["gates"]]
                    assert shown == [(g.name, g.passed) for g in gates], (model_id, v)
    return seen


def test_index_passing_set_equals_gates_on_the_store(db_url: str, tmp_path: Path,
                                                     clock: None) -> None:
    with Registry(str(tmp_path / "store"), db=db_url) as reg:
        store = reg.store
        checkpoint(reg, "r1", (10, 20))
        ok = [ledger_row("wiki")]
        reg.create_release("r1", 10, "tiny", "1", ledger=ok, eval_summary=summary(0.9))
        reg.create_release("r1", 20, "tiny", "2", dtype="bf16", ledger=[ledger_row("books")],
                           eval_summary=summary2(0.8, 1.0))
        reg.create_release("r1", 20, "tiny", "3", ledger=[ledger_row("wiki"),
                           ledger_row("books")], eval_summary=summary2(0.96, 2.0))
        reg.create_release("r1", 10, "other", "1", ledger=[ledger_row("news")],
                           eval_summary=summary2(0.86, 1.2))
        reg.create_release("r1", 20, "other", "2", ledger=[ledger_row("news")],
                           eval_summary=summary(0.7))
        bad_summary = summary(0.9)
        bad_summary["results"][0]["passed"] = False  # summary says passed, a result does not
        zoo: dict[str, dict[str, Any]] = {
            "evals-fail": {"ledger": ok, "evals": summary(0.3)},
            "evals-inconsistent": {"ledger": ok, "evals": bad_summary},
            "evals-missing": {"ledger": ok},
            "evals-invalid": {"ledger": ok, "evals": {"suite": "s"}},
            "evals-not-json": {"ledger": ok, "evals": b"{nope"},
            "ledger-no-train": {"ledger": [ledger_row("wiki", allowed_uses=["eval"])],
                                "evals": summary()},
            "ledger-revoked-in-file": {"ledger": [ledger_row(
                "wiki", revoked=True, revoked_at="2026-01-01T00:00:00Z",
                revocation_reason="dmca")], "evals": summary()},
            "ledger-empty": {"ledger": [], "evals": summary()},
            "ledger-invalid": {"ledger": [{"source_id": "x"}], "evals": summary()},
            "ledger-missing": {"evals": summary()},
            "card-missing": {"card": None, "ledger": ok, "evals": summary()},
            "card-empty": {"card": "  \n", "ledger": ok, "evals": summary()},
            "forged-ok": {"ledger": [ledger_row("pile")], "evals": summary2(0.99, 0.1)},
        }
        for version, kw in zoo.items():
            forge_release(store, "tiny", version, card=kw.get("card", "# card\n"),
                          ledger=kw.get("ledger"), evals=kw.get("evals"))
        reg.rebuild_index()  # committed outside the facade: indexed by a rebuild
        seen = assert_index_agrees_with_gates(reg)
        assert {v for m, v, ok_ in seen if ok_ and m == "tiny"} == {"1", "2", "3", "forged-ok"}

        # live changes through the facade (incremental index writes)
        reg.revoke("books", "license withdrawn")  # 2 and 3 stop passing
        reg.revoke("pile", "opt-out")
        reg.set_policy("tiny", ["accuracy>=0.85"])
        reg.set_policy("other", ["copy/loss<=1.5", "accuracy>=0.8"])
        seen = assert_index_agrees_with_gates(reg)
        assert {(m, v) for m, v, ok_ in seen if ok_} == {("tiny", "1"), ("other", "1")}

        # and the same after a rebuild from the store alone
        reg.rebuild_index()
        assert assert_index_agrees_with_gates(reg) == seen


def test_diff(db_url: str, tmp_path: Path, clock: None) -> None:
    store_url = str(tmp_path / "store")
    with Registry(store_url, db=db_url) as reg:
        store = reg.store
        checkpoint(reg)
        two = summary2(0.8, 1.25)
        two["results"].append({"task": "reverse", "metric": "accuracy", "value": 0.7, "n": 50,
                               "threshold": 0.5, "higher_is_better": True, "passed": True})
        reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row()],
                           eval_summary=summary(0.9), tokenizer_config={"chat_template": "x"})
        reg.create_release("r1", 10, "tiny", "2", dtype="bf16", ledger=[ledger_row()],
                           eval_summary=two, heads=[head(input_dim=8)])
        reg.set_alias("tiny", "prod", "2")
        doc = reg.diff("tiny", "1", "2")
        fa = {e.path: e.sha256 for e in read_manifest(store, "models/tiny/1").files}
        fb = {e.path: e.sha256 for e in read_manifest(store, "models/tiny/2").files}
        assert doc["added"] == sorted(set(fb) - set(fa)) == ["heads/sentiment.json"]
        assert doc["removed"] == sorted(set(fa) - set(fb)) == ["tokenizer_config.json"]
        assert doc["changed"] == sorted(p for p in set(fa) & set(fb) if fa[p] != fb[p])
        assert {"model.safetensors", "evals/summary.json", "MODEL_CARD.md"} <= set(
            doc["changed"])
        assert doc["unchanged"] == sorted(p for p in set(fa) & set(fb) if fa[p] == fb[p])
        assert {"config.json", "ledger.json", "generation_config.json"} <= set(doc["unchanged"])
        assert doc["evals"] == [
            {"metric": "copy/accuracy", "a": 0.9, "b": 0.8, "delta": pytest.approx(-0.1)},
            {"metric": "copy/loss", "a": None, "b": 1.25, "delta": None},
            {"metric": "reverse/accuracy", "a": None, "b": 0.7, "delta": None}]
        back = reg.diff("tiny", "2", "1")
        assert (back["added"], back["removed"], back["changed"]) == (
            doc["removed"], doc["added"], doc["changed"])
        assert back["evals"][0]["delta"] == pytest.approx(0.1)
        same = reg.diff("tiny", "1", "1")
        assert same["added"] == same["removed"] == same["changed"] == []
        assert all(e["delta"] == 0 for e in same["evals"])
    s = ["--store", store_url, "--db", db_url]
    r = run_cli("diff", "tiny@1", "tiny@prod", "--json", *s)  # an alias resolves
    assert r.returncode == 0, r.stderr
    cli = json.loads(r.stdout)
    assert {k: cli[k] for k in ("added", "removed", "changed", "unchanged")} == {
        k: doc[k] for k in ("added", "removed", "changed", "unchanged")}
    assert [(e["metric"], e["a"], e["b"]) for e in cli["evals"]] == [
        (e["metric"], e["a"], e["b"]) for e in doc["evals"]]


def test_show_reports_each_releases_own_ledger(db_url: str, tmp_path: Path,
                                               clock: None) -> None:
    """A source's name, uri and license can change between releases (a corpus
    relicensed); show must report what the release's own ledger.json says."""
    with Registry(str(tmp_path / "store"), db=db_url) as reg:
        checkpoint(reg)
        old = ledger_row("wiki")
        new = ledger_row("wiki", name="wiki 2027 dump", uri="s3://data/wiki-2027",
                         license="CC-BY-SA-4.0", allowed_uses=["train"])
        reg.create_release("r1", 10, "tiny", "1", ledger=[old], eval_summary=summary())
        reg.create_release("r1", 10, "tiny", "2", ledger=[new], eval_summary=summary())
        for v, row in (("1", old), ("2", new)):
            src = reg.show("tiny", v)["sources"]
            assert [(x["source_id"], x["name"], x["uri"], x["license"], x["allowed_uses"])
                    for x in src] == [(row["source_id"], row["name"], row["uri"],
                                       row["license"], row["allowed_uses"])], v
