"""Concurrent processes on one index (DESIGN section 6), SQLite and PostgreSQL.

Every contender is a real process (``sys.executable -c CHILD``). Each imports the
registry first, then creates its ``ready`` file and waits for the parent's
``go`` file, so that all of them enter the contested part at the same instant:

* publish: two processes publish different versions of one model that the index
  has not seen yet, sharing a data source the index has not seen yet either.
  Their store commits never conflict; the barrier sits right before the index
  write (``Registry._record`` wrapped in the child only, no hook in library
  code), so both insert the new model and source rows at once. Both releases
  must land in the index with no IndexWriteWarning. Two rounds.
* cli: eight CLI invocations at once (``registry.cli.main`` with its argv, the
  same entry point as the console script) on one index: four ``ledger revoke``
  of different sources, and ``query``/``show``/``ls`` readers. All exit 0,
  nothing mentions "database is locked", every revocation is indexed.
* first use: six CLI invocations (readers and writers) at once on an index that
  does not exist yet (SQLite: no file; Postgres: an empty database). The schema
  is created once, at head, and every process succeeds. The same race made
  deterministic: this process pauses in the middle of its own migration (an
  engine event) while a CLI process opens the index.

"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, inspect, text

from registry.api import Registry
from registry.checkpoint import CheckpointManager
from registry.index import Index
from registry.index.db import head_revision
from tests.ckpt_util import save
from tests.release_util import ledger_row, summary
from tests.support.forkclient import python_popen, python_popens


CHILD = r'''
import json, os, sys, time, warnings

ready, go, mode, *args = sys.argv[1:]


def barrier():
    open(ready, "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("barrier: no go signal")
        time.sleep(0.0005)


if mode == "publish":
    from registry.api import IndexWriteWarning, Registry
    store, db, model_id, version, source = args
    original = Registry._record

    def _record(self, what, fn):  # wait for the other publisher, then index
        barrier()
        return original(self, what, fn)

    Registry._record = _record
    reg = Registry(store, db)
    summary = {"suite": "smoke", "suite_version": "1", "created_at": "2026-11-29T10:00:00Z",
               "passed": True, "results": [{"task": "copy", "metric": "accuracy",
                                            "value": 0.9, "n": 100, "threshold": 0.5,
                                            "higher_is_better": True, "passed": True}]}
    ledger = [{"source_id": source, "name": source, "uri": "s3://data/" + source,
               "license": "MIT", "allowed_uses": ["train"], "revoked": False,
               "revoked_at": None, "revocation_reason": None}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg.create_release("r1", 10, model_id, version, ledger=ledger, eval_summary=summary)
    reg.close()
    errors = [str(w.message) for w in caught if issubclass(w.category, IndexWriteWarning)]
    print(json.dumps({"index_errors": errors}))
    sys.exit(1 if errors else 0)
elif mode == "cli":
    from registry.cli import main
    sys.argv = ["registry", *args]
    barrier()
    main()
else:
    sys.exit(f"unknown mode {mode}")
'''


def run_together(tmp_path: Path, argvs: list[list[str]],
                 timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    """Start one child per argv, release them together, return their results."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    go = tmp_path / "go"
    readies = [tmp_path / f"ready-{i}" for i in range(len(argvs))]
    with python_popens([[sys.executable, "-c", CHILD, str(r), str(go), *argv]
                        for r, argv in zip(readies, argvs, strict=True)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as procs:
        deadline = time.monotonic() + timeout
        while not all(r.exists() or p.poll() is not None for r, p in zip(readies, procs)):
            assert time.monotonic() < deadline, "children never reached the barrier"
            time.sleep(0.005)
        go.touch()
        out = []
        for argv, p in zip(argvs, procs, strict=True):
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            out.append(subprocess.CompletedProcess(argv, p.returncode, stdout, stderr))
        return out


def checkpoint(store_url: str) -> None:
    with CheckpointManager(store_url, "r1", keep_ckpts=0, async_save=False) as m:
        save(m, 10)


def assert_all_ok(results: list[subprocess.CompletedProcess[str]]) -> None:
    for r in results:
        assert r.returncode == 0, (r.args, r.stdout, r.stderr)
        text_ = (r.stdout + r.stderr).lower()
        assert "locked" not in text_, (r.args, r.stderr)
        assert "warning" not in text_ and "traceback" not in text_, (r.args, r.stderr)


def test_two_publishers_of_one_model_both_land(db_url: str, tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    checkpoint(store_url)
    Index(db_url).close()  # the schema exists; the contested part is the first rows
    for rnd in range(2):
        model_id, source = f"m{rnd}", f"src{rnd}"
        results = run_together(tmp_path / f"round{rnd}", [
            ["publish", store_url, db_url, model_id, version, source] for version in ("1", "2")])
        for r in results:
            assert r.returncode == 0, f"{' '.join(r.args)}:\n{r.stdout}\n{r.stderr[-3000:]}"
            assert json.loads(r.stdout) == {"index_errors": []}
        with Registry(store_url, db=db_url) as reg:
            assert sorted(r["version"] for r in reg.ls(model_id)) == ["1", "2"]
            assert sorted(r["version"] for r in reg.passing(model_id)) == ["1", "2"]
            assert sorted(r["version"] for r in reg.releases_for_source(source)) == ["1", "2"]
            assert [m["releases"] for m in reg.ls() if m["model_id"] == model_id] == [2]


def test_eight_concurrent_cli_calls_on_one_index(db_url: str, tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    checkpoint(store_url)
    sources = [f"s{i}" for i in range(4)]
    with Registry(store_url, db=db_url) as reg:
        reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row(s) for s in sources],
                           eval_summary=summary())
    s = ["--store", store_url, "--db", db_url]
    argvs = [["cli", "ledger", "revoke", src, "--reason", f"gone {src}", "--json", *s]
             for src in sources]
    argvs += [["cli", "query", "tiny", "--passing", "--json", *s],
              ["cli", "query", "--source", "s0", "--json", *s],
              ["cli", "show", "tiny@1", "--json", *s],
              ["cli", "ls", "tiny", "--json", *s]]
    results = run_together(tmp_path / "run", argvs)
    assert_all_ok(results)
    for r in results[:4]:
        assert json.loads(r.stdout)["created"] is True
    for r in results[4:]:
        json.loads(r.stdout)
    with Registry(store_url, db=db_url) as reg:
        assert [r["source_id"] for r in reg.revocations()] == sources
        assert reg.passing("tiny") == []
        assert not reg.show("tiny", "1")["passed"]


def schema_state(db_url: str) -> tuple[list[Any], set[str]]:
    eng = create_engine(db_url)
    try:
        with eng.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
            return [v for (v,) in versions], set(inspect(conn).get_table_names())
    finally:
        eng.dispose()


def test_concurrent_first_use_of_a_fresh_index(db_url: str, tmp_path: Path,
                                               request: pytest.FixtureRequest) -> None:
    store_url = str(tmp_path / "store")
    s = ["--store", store_url, "--db", db_url]
    argvs = [["cli", "ls", "--json", *s] for _ in range(3)]
    argvs += [["cli", "ledger", "revoke", f"s{i}", "--reason", "gone", "--json", *s]
              for i in range(3)]
    results = run_together(tmp_path / "run", argvs)
    assert_all_ok(results)
    for r in results[:3]:
        assert json.loads(r.stdout) == []
    versions, tables = schema_state(db_url)
    assert versions == [head_revision()]
    assert {"models", "releases", "revocations", "checkpoints"} <= tables
    with Registry(store_url, db=db_url) as reg:
        assert [r["source_id"] for r in reg.revocations()] == ["s0", "s1", "s2"]


def test_first_use_while_another_process_is_migrating(db_url: str, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    """The first-use race made deterministic: this process creates the schema and
    pauses in the middle of the migration (an engine event before ``CREATE TABLE
    releases``, i.e. after ``alembic_version`` and ``models`` exist) while a CLI
    process opens the same index. That process must wait for the migration to
    finish (or run it itself), never refuse the half-built schema as out of date."""
    store_url = str(tmp_path / "store")
    ready, go = tmp_path / "ready", tmp_path / "go"
    child = python_popen([sys.executable, "-c", CHILD, str(ready), str(go), "cli", "ls",
                              "--json", "--store", store_url, "--db", db_url],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline, "child never ready"
            time.sleep(0.005)
        paused = []

        def pause(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "CREATE TABLE releases" in statement and not paused:
                paused.append(statement)
                go.touch()
                try:  # give the child time to open the index mid-migration
                    child.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass  # still waiting, presumably for the migration lock

        event.listen(Engine, "before_cursor_execute", pause)
        try:
            Index(db_url).close()
        finally:
            event.remove(Engine, "before_cursor_execute", pause)
        assert paused, "the migration never created the releases table"
        stdout, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, stderr
    assert json.loads(stdout) == [] and "Traceback" not in stderr
    assert schema_state(db_url)[0] == [head_revision()]
