"""Alias removal and history (issue 32 items 4, 5, 8): every move recorded with its
actor, the pointer carrying its entry; a crash between the entry and the pointer
leaves no move without history; concurrent movers (real processes); broken links
named; legacy pointers; the index rebuilt from the store reproduces the history.
Local disk and S3, CLI and API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import delete

from registry.refs.alias_history import AliasMove, read_head, version_at, walk
from registry.refs.aliases import list_aliases, remove_alias, resolve, set_alias
from registry.api import Registry
from registry.protocol.commit import commit_local_directory
from registry.errors import DocumentError, NameTakenError, NotCommittedError
from registry.events import iter_events
from registry.index.alias_moves import alias_moves
from registry.index.schema import AliasMove as AliasMoveRow
from registry.store import Store, open_store
from tests.conftest import run_cli, run_cli_batch
from tests.support.forkclient import python_popen

REPO = Path(__file__).resolve().parent.parent


def releases(store: Store, tmp_path: Path, *versions: str) -> None:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "w.bin").write_bytes(b"w")
    for v in versions:
        commit_local_directory(store, src, f"models/m/{v}", kind="checkpoint", run_id="r",
                               step=1)


def child(url: str, version: str, *extra: str) -> subprocess.Popen[str]:
    return python_popen([sys.executable, "-m", "tests.support.alias_child", url, "m",
                             "prod", version, *extra], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_moves_recorded_with_actor_and_event(durable_store_url: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_ACTOR", "carol")
    store = open_store(durable_store_url)
    releases(store, tmp_path, "1", "2")
    assert set_alias(store, "m", "prod", "1") is None
    assert set_alias(store, "m", "prod", "2") == "1"
    assert set_alias(store, "m", "prod", "2") == "2"  # no move: no entry
    assert remove_alias(store, "m", "prod") == "2"
    moves = list(walk(store, "m", "prod"))
    assert [(m.seq, m.old, m.new) for m in moves] == [(3, "2", None), (2, "1", "2"),
                                                       (1, None, "1")]
    assert all(m.doc["actor"]["user"] == "carol" for m in moves)
    assert moves[1].doc["manifest_sha256"] and moves[0].doc["manifest_sha256"] is None
    # the pointer is the newest entry, byte for byte
    assert store.read_bytes("models/m/refs/prod") == moves[0].raw
    assert list_aliases(store, "m") == {}
    with pytest.raises(NotCommittedError):
        resolve(store, "m", "prod")
    with pytest.raises(NotCommittedError, match="no alias 'prod'"):
        remove_alias(store, "m", "prod")
    with pytest.raises(NameTakenError):  # a removed alias's name stays reserved
        from registry.refs.aliases import check_version_name
        check_version_name(store, "m", "prod")
    assert version_at(moves, moves[1].time) == ("2", moves[1])
    assert version_at(moves, "2000-01-01T00:00:00.000000Z") == (None, None)
    events = [(e.name, e.data["seq"]) for e in iter_events(store)]
    assert events == [("model_version_alias.created", 1), ("model_version_alias.created", 2),
                      ("model_version_alias.deleted", 3)]
    # moving it again continues the same chain
    set_alias(store, "m", "prod", "1")
    assert [m.seq for m in walk(store, "m", "prod")] == [4, 3, 2, 1]


def test_crash_between_entry_and_pointer_leaves_no_move_without_history(
        durable_store_url: str, tmp_path: Path) -> None:
    store = open_store(durable_store_url)
    releases(store, tmp_path, "1", "2")
    set_alias(store, "m", "prod", "1")
    p = child(durable_store_url, "2", "crash")
    p.communicate(timeout=300)
    assert p.returncode == -9
    assert resolve(store, "m", "prod") == "1"
    assert [(m.seq, m.new) for m in walk(store, "m", "prod")] == [(1, "1")]
    entries = [n for n, _ in store.list_dir("ledger/aliases/m/prod")]
    assert len(entries) == 2  # the orphan of the killed move: in no chain
    set_alias(store, "m", "prod", "2")
    assert [(m.seq, m.old, m.new) for m in walk(store, "m", "prod")] == [
        (2, "1", "2"), (1, None, "1")]


def test_concurrent_movers_history_is_exactly_the_winners(durable_store_url: str,
                                                           tmp_path: Path) -> None:
    store = open_store(durable_store_url)
    releases(store, tmp_path, "1", "2", "3", "4")
    procs = {v: child(durable_store_url, v) for v in ("1", "2", "3", "4")}
    said = {v: p.communicate(timeout=300)[0].strip() for v, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), said
    winners = {v for v, s in said.items() if s == "ok"}
    assert winners and set(said.values()) <= {"ok", "PointerConflictError"}
    moves = list(walk(store, "m", "prod"))
    assert {m.new for m in moves} == winners and len(moves) == len(winners)
    assert [m.seq for m in moves] == list(range(len(winners), 0, -1))
    for newer, older in zip(moves, moves[1:]):
        assert newer.old == older.new
    assert resolve(store, "m", "prod") == moves[0].new


def test_broken_link_is_named(durable_store_url: str, tmp_path: Path) -> None:
    store = open_store(durable_store_url)
    releases(store, tmp_path, "1", "2", "3")
    for v in ("1", "2", "3"):
        set_alias(store, "m", "prod", v)
    middle = [m for m in walk(store, "m", "prod")][1]
    store.delete(f"ledger/aliases/m/prod/{middle.name}")
    broken: list[str] = []
    assert [m.seq for m in walk(store, "m", "prod", broken=broken)] == [3]
    assert "broken below move 3" in broken[0]
    with pytest.raises(FileNotFoundError):
        list(walk(store, "m", "prod"))
    r = run_cli("alias", "log", "m", "prod", "--store", durable_store_url)
    assert r.returncode == 0 and "broken below move 3" in r.stderr


def _prod_moved_twice(store_url: str, tmp_path: Path) -> tuple[Store, AliasMove]:
    """m@1 and m@2 released, prod set to 1 then moved to 2: (the store, the
    first move's entry)."""
    store = open_store(store_url)
    releases(store, tmp_path, "1", "2")
    set_alias(store, "m", "prod", "1")
    set_alias(store, "m", "prod", "2")
    return store, list(walk(store, "m", "prod"))[1]


def test_tampered_entry_refused(durable_store_url: str, tmp_path: Path) -> None:
    store, first = _prod_moved_twice(durable_store_url, tmp_path)
    key = f"ledger/aliases/m/prod/{first.name}"
    store.write_bytes(key, store.read_bytes(key).replace(b'"new":"1"', b'"new":"2"'))
    with pytest.raises(DocumentError, match="do not match the digest"):
        list(walk(store, "m", "prod"))


def test_legacy_pointer_reads_and_moves(durable_store_url: str, tmp_path: Path) -> None:
    store = open_store(durable_store_url)
    releases(store, tmp_path, "1", "2")
    store.write_bytes("models/m/refs/prod", b"1\n")
    assert resolve(store, "m", "prod") == "1" and read_head(store, "m", "prod").move is None
    assert list(walk(store, "m", "prod")) == []
    assert set_alias(store, "m", "prod", "2") == "1"
    [move] = walk(store, "m", "prod")
    assert (move.seq, move.old, move.new, move.doc["prev"]) == (1, "1", "2", None)


def test_cli_rm_log_at_and_rebuild_reproduces_history(durable_store_url: str, tmp_path: Path,
                                                      db_url: str) -> None:
    store = open_store(durable_store_url)
    releases(store, tmp_path, "1", "2")
    db = db_url
    s = ["--store", durable_store_url, "--db", db]
    env = {"REGISTRY_ACTOR": "dave"}
    assert run_cli("alias", "set", "m", "prod", "1", "--force", *s, env=env).returncode == 0
    assert run_cli("alias", "set", "m", "prod", "2", "--force", *s, env=env).returncode == 0
    r = run_cli("alias", "rm", "m", "prod", "--json", *s, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"model_id": "m", "alias": "prod", "version": None,
                                    "previous": "2"}
    # the refusal and the reads in one process (run_cli_batch)
    at = ["alias", "log", "m", "prod", "--store", durable_store_url, "--at"]
    r, r_json, r_text, r_old, r_bad = run_cli_batch([
        ["alias", "rm", "m", "prod", *s],
        ["alias", "log", "m", "prod", "--json", "--store", durable_store_url],
        ["alias", "log", "m", "prod", "--store", durable_store_url],
        [*at, "1999-01-01"], [*at, "yesterday"]])
    assert r.returncode == 3 and "no alias 'prod'" in r.stderr
    log = json.loads(r_json.stdout)["moves"]
    assert [(m["seq"], m["old"], m["new"], m["actor"]["user"]) for m in log] == [
        (3, "2", None, "dave"), (2, "1", "2", "dave"), (1, None, "1", "dave")]
    assert r_text.stdout.splitlines()[0].startswith("3\t") and "2 -> (removed)" in r_text.stdout
    assert r_old.returncode == 0 and "no recorded move" in r_old.stderr
    assert r_bad.returncode == 2 and "--at 'yesterday'" in r_bad.stderr
    r = run_cli(*at, log[1]["time"], "--json")
    assert json.loads(r.stdout)["version"] == "2"
    with Registry(durable_store_url, db=db) as reg:
        indexed = reg.index.read(lambda q: alias_moves(q, "m", "prod"))
        assert [(m["seq"], m["new"]) for m in indexed] == [(3, None), (2, "2"), (1, "1")]
        reg.index.run(lambda q: q.execute(delete(AliasMoveRow)))
        reg.rebuild_index()
        assert reg.index.read(lambda q: alias_moves(q, "m", "prod")) == indexed
        assert [m.seq for m in reg.alias_log("m", "prod")[0]] == [3, 2, 1]


def test_web_page_and_api_what_was_prod_at(durable_store_url: str, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from registry.web import create_app

    store, first = _prod_moved_twice(durable_store_url, tmp_path)
    with Registry(durable_store_url, db=f"sqlite:///{tmp_path / 'i.db'}") as reg, \
            TestClient(create_app(reg), base_url="http://localhost") as c:
        doc = c.get("/api/v1/models/m/aliases/prod/log", params={"at": first.time}).json()
        assert doc["version"] == "1" and [m["seq"] for m in doc["moves"]] == [2, 1]
        page = c.get("/models/m/aliases/prod", params={"at": first.time})
        assert page.status_code == 200 and "<b>1</b> (move 1" in page.text
        assert c.get("/models/m/aliases/prod", params={"at": "noon"}).status_code == 400
