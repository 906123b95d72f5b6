"""Yank, delete and retention of releases (issue 32 items 1, 2 and 8).

On local disk and S3 (``durable_store_url``: a real moto server), through the
CLI (real processes) and the Python API; races between real processes; the
index rebuilt from the store alone reproduces yanks and tombstones (SQLite
and Postgres).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.refs.aliases import list_aliases
from registry.api import Registry
from registry.errors import (
    GateFailedError,
    NameTakenError,
    ReleaseDeletedError,
    ReleaseInUseError,
    ReleaseYankedError,
    UsageError,
    VersionExistsError,
)
from registry.protocol.layout import release_prefix, tags_key, tombstone_key, yank_key
from registry.events import iter_events
from registry.lifecycle.yank import yank_record
from registry.protocol.manifest import MANIFEST
from registry.store import open_store
from tests.conftest import run_cli, run_cli_batch
from tests.lifecycle_util import children, cli_error, cli_ok, event_names, publish, workers_ok


def _db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'i.db'}"


# -- yank ------------------------------------------------------------------------------


def test_yank_fails_the_gate_everywhere_and_pull_refuses(durable_store_url: str,
                                                         tmp_path: Path) -> None:
    db = _db(tmp_path)
    reg = Registry(durable_store_url, db=db)
    publish(reg, tmp_path, "1", "2")
    url = durable_store_url
    doc = cli_ok(run_cli("yank", "m@2", "--reason", "licence withdrawn", "--json",
                         "--store", url, "--db", db, env={"REGISTRY_ACTOR": "alice"}))
    assert doc["yanked"] is True and doc["changed"] is True
    assert doc["actor"]["user"] == "alice" and doc["reason"] == "licence withdrawn"
    store = open_store(url)
    rec = json.loads(store.read_bytes(yank_key("m", "2")))
    assert rec["yanked"] is True and rec["manifest_sha256"] == doc["manifest_sha256"]
    # the bytes of the release are untouched
    assert store.exists(f"{release_prefix('m', '2')}/{MANIFEST}")

    # gate check (store), query --passing and show (index), alias set, pull
    # (the three reads in one process: run_cli_batch)
    p, query, show_p = run_cli_batch([
        ["gate", "check", "m@2", "--store", url],
        ["query", "m", "--passing", "--json", "--store", url, "--db", db],
        ["show", "m@2", "--json", "--store", url, "--db", db]])
    assert p.returncode == 1 and "FAIL yanked: yanked at" in p.stdout and "alice@" in p.stdout
    rows = cli_ok(query)
    assert [r["version"] for r in rows] == ["1"]
    show = cli_ok(show_p)
    assert show["passed"] is False and show["yanked"]["reason"] == "licence withdrawn"
    assert {"gate": "yanked", "passed": False,
            "reason": show["gates"][-1]["reason"]} == show["gates"][-1]
    p = run_cli("alias", "set", "m", "prod", "2", "--store", url, "--db", db)
    cli_error(p, 1, "yanked")
    assert list_aliases(store, "m") == {}
    to = tmp_path / "out"
    p = run_cli("pull", "m@2", "--to", str(to), "--store", url, "--cache", str(tmp_path / "c"))
    cli_error(p, 1, "m@2", "--allow-yanked", "licence withdrawn")
    assert not to.exists()
    p = run_cli("pull", "m@2", "--to", str(to), "--allow-yanked", "--require-passing",
                "--store", url, "--cache", str(tmp_path / "c"))
    cli_error(p, 1, "--require-passing", "yanked")
    assert not to.exists()
    p = run_cli("pull", "m@2", "--to", str(to), "--allow-yanked", "--store", url,
                "--cache", str(tmp_path / "c"))
    assert p.returncode == 0 and "fails its gates now (yanked" in p.stderr, p.stderr
    assert (to / "model.safetensors").exists()

    # a second yank changes nothing; unyank puts it back, recorded
    doc2 = cli_ok(run_cli("yank", "m@2", "--reason", "again", "--json", "--store", url,
                          "--db", db))
    assert doc2["changed"] is False and doc2["reason"] == "licence withdrawn"
    doc3 = cli_ok(run_cli("unyank", "m@2", "--json", "--store", url, "--db", db,
                          env={"REGISTRY_ACTOR": "bob"}))
    assert doc3["yanked"] is False and doc3["actor"]["user"] == "bob"
    assert doc3["lifted"]["reason"] == "licence withdrawn"
    assert run_cli("gate", "check", "m@2", "--store", url).returncode == 0
    rows = cli_ok(run_cli("query", "m", "--passing", "--json", "--store", url, "--db", db))
    assert [r["version"] for r in rows] == ["2", "1"]
    assert event_names(store)[-2:] == ["model_version.yanked", "model_version.unyanked"]
    reg.close()


def test_yank_api(durable_store_url: str, tmp_path: Path) -> None:
    with Registry(durable_store_url, db=_db(tmp_path)) as reg:
        publish(reg, tmp_path, "1")
        with pytest.raises(UsageError, match="needs a reason"):
            reg.yank("m", "1", "  ")
        with pytest.raises(UsageError, match="one line"):
            reg.yank("m", "1", "ok\x1b[2Kforged")
        assert yank_record(reg.store, "m", "1") is None
        doc, changed = reg.yank("m", "1", "bad eval")
        assert changed and yank_record(reg.store, "m", "1")["reason"] == "bad eval"
        with pytest.raises(ReleaseYankedError, match="allow-yanked"):
            reg.pull("m@1", to=str(tmp_path / "a"), cache=str(tmp_path / "c"))
        with pytest.raises(GateFailedError, match="yanked"):
            reg.set_alias("m", "prod", "1")
        assert reg.passing("m") == []
        assert reg.ls()[0]["newest_passing"] is None
        assert reg.pull("m@1", to=str(tmp_path / "b"), cache=str(tmp_path / "c"),
                        allow_yanked=True).version == "1"
        _, changed = reg.unyank("m", "1")
        assert changed and [r["version"] for r in reg.passing("m")] == ["1"]
        _, changed = reg.unyank("m", "1")
        assert not changed


def test_garbled_yank_record_fails_the_gate(durable_store_url: str, tmp_path: Path) -> None:
    """A store writer's garbage in the record is never read as "not yanked"."""
    with Registry(durable_store_url, db=_db(tmp_path)) as reg:
        publish(reg, tmp_path, "1")
        reg.store.write_bytes(yank_key("m", "1"), b"{not json")
        failed = [g for g in reg.gate_check("m", "1") if not g.passed]
        assert [g.name for g in failed] == ["yanked"] and "cannot be read" in failed[0].reason
        with pytest.raises(ReleaseYankedError):
            reg.pull("m@1", to=str(tmp_path / "a"), cache=str(tmp_path / "c"))
        p = run_cli("yank", "m@1", "--reason", "x", "--store", durable_store_url,
                    "--db", _db(tmp_path))
        cli_error(p, 5, "yanks/m/1.json")


def test_concurrent_yank_and_unyank_processes_lose_nothing(durable_store_url: str,
                                                           tmp_path: Path) -> None:
    """Three processes each yank and unyank one release 4 times at once: every
    transition is an event, none lost, and the record ends unyanked."""
    db = _db(tmp_path)
    with Registry(durable_store_url, db=db) as reg:
        publish(reg, tmp_path, "1")
    workers_ok(durable_store_url, db, "toggle", 3, 4)
    store = open_store(durable_store_url)
    names = event_names(store)
    yanks, unyanks = names.count("model_version.yanked"), names.count("model_version.unyanked")
    # a yank that found the release yanked already changed nothing (no event)
    assert yanks == unyanks and 4 <= yanks <= 12
    # Strictly alternating in swap order: every transition was a swap against
    # the one before. Events land after their swap, so concurrent writers'
    # events may land in another order: the record's revision (1, 2, ...: in
    # every transition's event, each exactly once) is the swap order.
    moves = sorted((e.data["revision"], e.name) for e in iter_events(store)
                   if e.name in ("model_version.yanked", "model_version.unyanked"))
    assert [r for r, _ in moves] == list(range(1, len(moves) + 1)), moves
    seq = [n for _, n in moves]
    assert seq[0] == "model_version.yanked" and all(a != b for a, b in zip(seq, seq[1:])), seq
    assert yank_record(store, "m", "1") is None
    with Registry(durable_store_url, db=db) as reg:
        assert [r["version"] for r in reg.passing("m")] == ["1"]


# -- delete ----------------------------------------------------------------------------


def test_delete_leaves_a_tombstone_and_the_name_is_never_reused(durable_store_url: str,
                                                                 tmp_path: Path) -> None:
    db, url = _db(tmp_path), durable_store_url
    reg = Registry(url, db=db)
    publish(reg, tmp_path, "1", "2")
    reg.set_alias("m", "prod", "2")
    reg.set_tags("m", "1", {"team": "nlp"})
    reg.yank("m", "1", "bad")
    store = open_store(url)
    digest = reg.show("m", "1")["manifest_sha256"]

    cli_error(run_cli("release", "delete", "m@2", "--reason", "x", "--store", url, "--db", db),
              4, "alias prod points at it")
    cli_error(run_cli("release", "delete", "m@prod", "--reason", "x", "--store", url,
                      "--db", db), 4, "alias prod")
    assert store.exists(f"{release_prefix('m', '2')}/{MANIFEST}")
    cli_error(run_cli("release", "delete", "m@1", "--store", url, "--db", db), 2, "--reason")

    doc = cli_ok(run_cli("release", "delete", "m@1", "--reason", "takedown request", "--json",
                         "--store", url, "--db", db, env={"REGISTRY_ACTOR": "carol"}))
    assert doc["deleted_now"] is True and doc["manifest_sha256"] == digest
    assert doc["actor"]["user"] == "carol" and doc["sequence"] == 1
    assert store.walk_files(release_prefix("m", "1")) == {}
    assert not store.exists(yank_key("m", "1")) and not store.exists(tags_key("m", "1"))
    tomb = json.loads(store.read_bytes(tombstone_key("m", "1")))
    assert tomb["reason"] == "takedown request" and tomb["manifest_sha256"] == digest
    assert event_names(store)[-1] == "model_version.deleted"

    # the version name is never reused: publish, alias of that name; readers say why
    with pytest.raises(VersionExistsError, match="never reused"):
        publish(reg, tmp_path, "1")
    with pytest.raises(ReleaseDeletedError, match="takedown request"):
        reg.pull("m@1", to=str(tmp_path / "o"), cache=str(tmp_path / "c"))
    cli_error(run_cli("pull", "m@1", "--to", str(tmp_path / "o"), "--store", url,
                      "--cache", str(tmp_path / "c")), 3, "was deleted", "carol")
    with pytest.raises(ReleaseDeletedError):
        reg.set_alias("m", "prod", "1")
    assert list_aliases(store, "m") == {"prod": "2"}

    # the index: the release is gone, its tombstone is there; a second delete is a no-op
    assert [r["version"] for r in reg.ls("m")] == ["2"]
    assert reg.ls()[0]["releases"] == 1
    again = cli_ok(run_cli("release", "delete", "m@1", "--reason", "again", "--json",
                           "--store", url, "--db", db))
    assert again["deleted_now"] is False and again["reason"] == "takedown request"
    reg.close()


def test_delete_of_a_named_release_keeps_alias_names_free_of_it(durable_store_url: str,
                                                                 tmp_path: Path) -> None:
    """Versions need not look like versions: a deleted ``beta`` is not an alias name."""
    with Registry(durable_store_url, db=_db(tmp_path)) as reg:
        publish(reg, tmp_path, "1", "beta")
        reg.delete_release("m", "beta", "gone")
        with pytest.raises(NameTakenError, match="never reused"):
            reg.set_alias("m", "beta", "1")


def test_interrupted_delete_is_finished_and_rebuild_agrees(durable_store_url: str,
                                                           db_url: str,
                                                           tmp_path: Path) -> None:
    """A delete killed after its tombstone (files still there) is a delete: pull
    refuses, rebuild leaves it out and says so, a second delete finishes it."""
    with Registry(durable_store_url, db=db_url) as reg:
        publish(reg, tmp_path, "1", "2")
        tomb = {"schema": 1, "model_id": "m", "version": "1", "manifest_sha256":
                reg.show("m", "1")["manifest_sha256"], "sequence": 1, "deleted_at":
                "2026-12-01T00:00:00.000000Z", "reason": "killed", "actor": None}
        reg.store.create(tombstone_key("m", "1"), json.dumps(tomb).encode())
        with pytest.raises(ReleaseDeletedError):
            reg.pull("m@1", to=str(tmp_path / "o"), cache=str(tmp_path / "c"))
        counts = reg.rebuild_index()
        assert counts["releases"] == 1 and counts["tombstones"] == 1
        assert {"action": "skipped", "what": "m@1", "reason": counts["report"][0]["reason"]} \
            == counts["report"][0] and "release delete" in counts["report"][0]["reason"]
        assert [r["version"] for r in reg.ls("m")] == ["2"]
        _, deleted = reg.delete_release("m", "1", "finish")
        assert deleted is False
        assert reg.store.walk_files(release_prefix("m", "1")) == {}


def test_concurrent_deletes_make_one_tombstone(durable_store_url: str, tmp_path: Path) -> None:
    db = _db(tmp_path)
    with Registry(durable_store_url, db=db) as reg:
        publish(reg, tmp_path, "1", "2")
    runs = children(*[[durable_store_url, db, "delete", "m", "1"] for _ in range(3)])
    outs = sorted(r.stdout.strip() for r in runs)
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    # exactly one created the tombstone; the others found it and finished
    assert outs.count("deleted") == 1 and set(outs) <= {"deleted", "already"}, outs
    store = open_store(durable_store_url)
    assert event_names(store).count("model_version.deleted") == 1
    assert store.walk_files(release_prefix("m", "1")) == {}
    with Registry(durable_store_url, db=db) as reg:
        assert [r["version"] for r in reg.ls("m")] == ["2"]


def test_alias_set_racing_a_delete_never_points_at_a_deleted_release(
        durable_store_url: str, tmp_path: Path) -> None:
    """An ``alias set`` and a ``release delete`` of one release at once, as real
    processes, several rounds: either the alias points at a live release and
    the delete was refused, or the release is gone and no alias names it."""
    db = _db(tmp_path)
    with Registry(durable_store_url, db=db) as reg:
        publish(reg, tmp_path, "1", *[f"r{i}" for i in range(4)])
    store = open_store(durable_store_url)
    for i in range(4):
        v = f"r{i}"
        alias, delete = children([durable_store_url, db, "alias", "m", v, f"a{i}"],
                                 [durable_store_url, db, "delete", "m", v])
        assert alias.returncode == 0 and delete.returncode == 0, (alias.stderr, delete.stderr)
        live = store.exists(f"{release_prefix('m', v)}/{MANIFEST}")
        pointed = list_aliases(store, "m").get(f"a{i}")
        if live:
            assert delete.stdout.strip() == "ReleaseInUseError" and pointed == v
            assert not store.exists(tombstone_key("m", v))
        else:
            assert delete.stdout.strip() == "deleted" and pointed is None, (
                alias.stdout, delete.stdout)
            assert alias.stdout.strip() in ("ReleaseDeletedError", "NotCommittedError")


@pytest.mark.parametrize("delete_goes_on", [False, True])
def test_an_alias_move_that_meets_a_tombstone_waits_for_the_delete_to_settle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delete_goes_on: bool) -> None:
    """Both saw each other: the delete made its tombstone after the alias set's
    check, and its own look found the move. The delete backs off (removes the
    tombstone): the move must stand, not be undone too (both losing, the
    delete's "alias a points at it" then untrue). The delete goes on (removes
    MANIFEST.json): the move is undone and ReleaseDeletedError raised."""
    import threading

    import registry.refs.aliases as aliases_mod

    url = str(tmp_path / "store")
    with Registry(url, db=_db(tmp_path)) as reg:
        publish(reg, tmp_path, "1", "r0")
    store = open_store(url)
    real_move = aliases_mod.move_alias
    settle = []

    def move_then_delete_starts(*a, **k):
        result = real_move(*a, **k)
        if a[3] == "r0" and not settle:  # the move, not the undo
            store.create(tombstone_key("m", "r0"), b"{}")

            def delete_settles() -> None:
                if delete_goes_on:
                    store.delete(f"{release_prefix('m', 'r0')}/{MANIFEST}")
                else:
                    store.delete(tombstone_key("m", "r0"))

            settle.append(threading.Timer(0.3, delete_settles))
            settle[0].start()
        return result

    monkeypatch.setattr(aliases_mod, "move_alias", move_then_delete_starts)
    if delete_goes_on:
        with pytest.raises(ReleaseDeletedError):
            aliases_mod.set_alias(store, "m", "a", "r0")
        assert "a" not in list_aliases(store, "m")
    else:
        assert aliases_mod.set_alias(store, "m", "a", "r0") is None
        assert list_aliases(store, "m")["a"] == "r0"
    settle[0].join()


# -- retention -------------------------------------------------------------------------


def test_release_gc_policies(durable_store_url: str, tmp_path: Path) -> None:
    db, url = _db(tmp_path), durable_store_url
    reg = Registry(url, db=db)
    publish(reg, tmp_path, *[str(i) for i in range(1, 6)])
    reg.set_alias("m", "prod", "1")
    cli_error(run_cli("release", "gc", "--store", url, "--db", db), 2, "--keep-last")
    cli_error(run_cli("release", "gc", "--keep-last", "-1", "--store", url, "--db", db), 2)
    cli_error(run_cli("release", "gc", "--older-than", "5", "--store", url, "--db", db), 2,
              "unit")
    dry = cli_ok(run_cli("release", "gc", "--keep-last", "2", "--dry-run", "--json",
                         "--store", url, "--db", db))
    assert [r["version"] for r in dry["deleted"]] == ["3", "2"]
    kept = {r["version"]: r["reason"] for r in dry["kept"]}
    assert kept == {"5": "among the 2 newest", "4": "among the 2 newest",
                    "1": "alias prod points at it"}
    assert [r["version"] for r in reg.ls("m")] == ["5", "4", "3", "2", "1"]
    # nothing is older than a day: --older-than keeps them all
    young = cli_ok(run_cli("release", "gc", "--keep-last", "2", "--older-than", "1d",
                           "--json", "--store", url, "--db", db))
    assert young["deleted"] == []
    assert {r["version"] for r in young["kept"] if "not older than" in r["reason"]} == {"3", "2"}
    done = cli_ok(run_cli("release", "gc", "--keep-last", "2", "--json", "--store", url,
                          "--db", db))
    assert [r["version"] for r in done["deleted"]] == ["3", "2"]
    assert [r["version"] for r in reg.ls("m")] == ["5", "4", "1"]
    store = open_store(url)
    assert json.loads(store.read_bytes(tombstone_key("m", "3")))["reason"] == \
        "retention policy (keep-last 2)"
    report = reg.release_gc(unaliased=True, older_than=0)
    assert [r["version"] for r in report.deleted] == ["5", "4"]
    assert [r["version"] for r in reg.ls("m")] == ["1"]
    with pytest.raises(UsageError):
        reg.release_gc()
    reg.close()


def test_rebuild_reproduces_yanks_and_tombstones(durable_store_url: str, db_url: str,
                                                 tmp_path: Path) -> None:
    with Registry(durable_store_url, db=db_url) as reg:
        publish(reg, tmp_path, "1", "2", "3")
        reg.yank("m", "2", "bad")
        reg.delete_release("m", "3", "gone")
        reg.set_tags("m", "1", {"team": "nlp"})
        before = (reg.ls("m"), reg.passing("m"), reg.show("m", "2"),
                  reg.search(tags=["team=nlp"]))
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    for db in (db_url, fresh):
        r = run_cli("index", "rebuild", "--json", "--store", durable_store_url, "--db", db)
        counts = cli_ok(r)
        assert (counts["releases"], counts["yanks"], counts["tombstones"],
                counts["tagged"]) == (2, 1, 1, 1)
        with Registry(durable_store_url, db=db) as reg:
            after = (reg.ls("m"), reg.passing("m"), reg.show("m", "2"),
                     reg.search(tags=["team=nlp"]))
            assert after == before
            from registry.index.schema import Tombstone
            from sqlalchemy import select

            rows = reg.index.read(lambda s: s.execute(
                select(Tombstone.version, Tombstone.reason, Tombstone.seq)).all())
            assert [tuple(r) for r in rows] == [("3", "gone", 3)]


def test_hub_api_refuses_a_yanked_release(tmp_path: Path) -> None:
    """The Hugging Face Hub API of `registry serve` gates on the store: a yanked
    release is a 403 GatedRepo naming the yank; unyanked, it is served."""
    from fastapi.testclient import TestClient

    from registry.web import create_app

    with Registry(str(tmp_path / "store"), db=_db(tmp_path)) as reg:
        publish(reg, tmp_path, "1")
        reg.yank("m", "1", "licence withdrawn")
        with TestClient(create_app(reg), base_url="http://localhost") as c:
            r = c.get("/registry/m/resolve/1/config.json")
            assert r.status_code == 403 and r.headers["x-error-code"] == "GatedRepo"
            assert "licence withdrawn" in r.headers["x-error-message"]
        reg.unyank("m", "1")
        with TestClient(create_app(reg), base_url="http://localhost") as c:
            assert c.get("/registry/m/resolve/1/config.json").status_code == 200


def test_cache_prune_drops_deleted_releases(durable_store_url: str, tmp_path: Path) -> None:
    """A serving host's cache prune given the store drops the releases it
    deleted (same manifest digest), keeps the others whatever --keep-last says."""
    url, cache = durable_store_url, tmp_path / "cache"
    with Registry(url, db=_db(tmp_path)) as reg:
        publish(reg, tmp_path, "1", "2")
        for v in ("1", "2"):
            reg.pull(f"m@{v}", cache=str(cache))
        reg.delete_release("m", "1", "takedown")
        assert reg.cache(cache).prune(keep_last=5, dry_run=True).pruned == ()  # no store
    p = run_cli("cache", "prune", "--keep-last", "5", "--json", "--cache", str(cache),
                "--store", url)
    doc = cli_ok(p)
    assert [(v["version"], v["reasons"]) for v in doc["pruned"]] == [("1", ["deleted"])]
    assert not (cache / "models" / "m" / "1").exists()
    assert (cache / "models" / "m" / "2" / "model.safetensors").exists()
    again = cli_ok(run_cli("cache", "prune", "--keep-last", "5", "--json", "--cache",
                           str(cache), "--store", url))
    assert again["pruned"] == []
