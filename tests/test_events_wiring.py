"""Every write appends its event, and records its actor (issue 32 items 5, 7, 8):
release created (API and CLI), alias set/rm, revocation, policy change; the
release manifest's actor metadata; an event append that fails after the write
committed is exit 11 naming `registry events repair`, which appends it.
Local disk and S3."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from registry.host.actor import actor_of_metadata
from registry.api import Registry
from registry.events import iter_events
from registry.store import open_store
from registry.protocol.verify import read_manifest
from tests.conftest import run_cli
from tests.release_util import docs_args
from tests.test_aliases import model_dir, publish_api


def names(url: str) -> list[tuple[str, str | None, str | None]]:
    with open_store(url) as store:
        return [(e.name, e.model_id, e.version) for e in iter_events(store)]


def test_api_writes_append_events_with_actor(durable_store_url: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_ACTOR", "erin")
    with Registry(durable_store_url, db=f"sqlite:///{tmp_path / 'i.db'}") as reg:
        publish_api(reg, tmp_path, "1")
        reg.set_alias("m", "prod", "1")
        reg.remove_alias("m", "prod")
        rev, _ = reg.revoke("wiki", "licence withdrawn")
        reg.revoke("wiki", "again")  # already revoked: no second event
        reg.set_policy("m", ["accuracy>=0.5"])
        manifest = read_manifest(reg.store, "models/m/1")
        events = list(iter_events(reg.store))
        policy = json.loads(reg.store.read_bytes("models/m/policy.json"))
        revocation = json.loads(reg.store.read_bytes("ledger/revocations/wiki.json"))
    assert [(e.name, e.model_id, e.version) for e in events] == [
        ("model_version.created", "m", "1"), ("model_version_alias.created", "m", "1"),
        ("model_version_alias.deleted", "m", "1"), ("source.revoked", None, None),
        ("policy.changed", "m", None)]
    assert all(e.actor and e.actor["user"] == "erin" for e in events)
    assert events[0].data["manifest_sha256"] == manifest.digest
    assert events[3].data == {"source_id": "wiki", "reason": "licence withdrawn"}
    assert actor_of_metadata(manifest.meta["metadata"])["user"] == "erin"
    assert manifest.meta["metadata"]["actor.schema"] == "1"
    assert policy["actor"]["user"] == "erin" and revocation["actor"]["user"] == "erin"
    assert rev.actor and rev.actor["user"] == "erin"


def test_cli_publish_event_and_exit_11_then_repair(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    db = f"sqlite:///{tmp_path / 'i.db'}"
    s = ["--store", url, "--db", db]
    r = run_cli("publish", str(model_dir(tmp_path)), "--model-id", "m", "--version", "1",
                *docs_args(tmp_path), *s)
    assert r.returncode == 0, r.stderr
    assert names(url) == [("model_version.created", "m", "1")]
    events = tmp_path / "store" / "events"
    shutil.move(events, tmp_path / "events.aside")
    events.write_text("not a folder: every append fails")
    r = run_cli("alias", "set", "m", "prod", "1", *s)
    assert r.returncode == 11, (r.returncode, r.stderr)
    assert "committed, but its event 'model_version_alias.created' was not recorded" in r.stderr
    assert "registry events repair" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("alias", "ls", "m", "--json", "--store", url)
    assert json.loads(r.stdout) == {"prod": "1"}  # the move stands
    events.unlink()
    shutil.move(tmp_path / "events.aside", events)
    r = run_cli("events", "repair", "--json", "--store", url)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["appended"] == ["alias move 1 of m@prod"]
    got = names(url)
    assert got == [("model_version.created", "m", "1"), ("model_version_alias.created", "m", "1")]
    r = run_cli("events", "repair", "--store", url)
    assert r.returncode == 0 and "no event missing" in r.stderr


def test_repair_skips_what_a_store_writer_garbled_and_repairs_the_rest(tmp_path: Path) -> None:
    """One garbled alias pointer (a store writer's) once stopped the whole repair
    (exit 5, nothing appended): now it is named on stderr and skipped."""
    url = str(tmp_path / "store")
    s = ["--store", url, "--db", f"sqlite:///{tmp_path / 'i.db'}"]
    r = run_cli("publish", str(model_dir(tmp_path)), "--model-id", "m", "--version", "1",
                *docs_args(tmp_path), *s)
    assert r.returncode == 0, r.stderr
    shutil.rmtree(tmp_path / "store" / "events")  # the event was lost
    refs = tmp_path / "store" / "models" / "m" / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / "bad").write_text('{"x": 1}')
    r = run_cli("events", "repair", "--json", "--store", url)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["appended"] == ["model_version.created m@1"]
    assert len(doc["skipped"]) == 1 and "refs/bad" in doc["skipped"][0]
    assert "refs/bad" in r.stderr and "Traceback" not in r.stderr
    assert names(url) == [("model_version.created", "m", "1")]


def test_events_ls_text_has_no_python_reprs(tmp_path: Path) -> None:
    """A first alias move has no previous version: the text says ``-``,
    never Python's ``None`` (issue 33 item 4)."""
    url = str(tmp_path / "store")
    with Registry(url, db=f"sqlite:///{tmp_path / 'i.db'}") as reg:
        publish_api(reg, tmp_path, "1")
        reg.set_alias("m", "prod", "1")
    first = [e for e in iter_events(open_store(url)) if e.name == "model_version_alias.created"]
    assert first and "previous" in first[0].data and first[0].data["previous"] is None
    p = run_cli("events", "ls", "--store", url)
    assert p.returncode == 0, p.stderr
    assert "None" not in p.stdout and "previous=-" in p.stdout, p.stdout


def _drop_events(url: str, *names_: str) -> None:
    """Delete the events named ``names_`` from the log: the writes stand, their
    events were lost (as when an append failed after the write committed)."""
    from registry.protocol.layout import event_key

    with open_store(url) as store:
        for e in list(iter_events(store)):
            if e.name in names_:
                store.delete(event_key(e.seq))


def test_repair_recreates_lost_delete_yank_and_tag_events(durable_store_url: str,
                                                          tmp_path: Path) -> None:
    """A delete's, a yank's and the tags' events lost: repair appends one for
    each record that lacks it (the yank record's state and revision now; tag
    events until the log, replayed, gives the stored tags), carrying the
    record's actor; a second repair appends nothing."""
    url = durable_store_url
    with Registry(url, db=f"sqlite:///{tmp_path / 'i.db'}") as reg:
        publish_api(reg, tmp_path, "1")
        publish_api(reg, tmp_path, "2")
        publish_api(reg, tmp_path, "3")
        reg.yank("m", "2", "bad eval")
        reg.unyank("m", "2")
        reg.yank("m", "2", "bad eval again")
        reg.set_tags("m", "1", {"stage": "beta", "owner": "ann"})
        reg.set_tags("m", "1", {"stage": "ga"})
        reg.remove_tags("m", "1", ["owner"])
        reg.delete_release("m", "3", "superseded")
    kept = names(url)
    _drop_events(url, "model_version.yanked", "model_version.unyanked",
                 "model_version.deleted", "model_version_tag.set")
    r = run_cli("events", "repair", "--json", "--store", url)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["skipped"] == []
    assert sorted(doc["appended"]) == sorted([
        "model_version.deleted m@3", "model_version.yanked m@2",
        "model_version_tag.set m@1"]), doc
    with open_store(url) as store:
        events = list(iter_events(store))
    repaired = {e.name: e for e in events if e.data.get("repaired")}
    assert set(repaired) == {"model_version.deleted", "model_version.yanked",
                             "model_version_tag.set"}
    assert repaired["model_version.deleted"].data["reason"] == "superseded"
    yanked = repaired["model_version.yanked"]
    assert yanked.data["revision"] == 3 and yanked.data["reason"] == "bad eval again"
    with open_store(url) as store:
        record = json.loads(store.read_bytes("ledger/yanks/m/2.json"))
    assert yanked.actor == record["actor"] and yanked.actor["user"]
    assert repaired["model_version_tag.set"].data == {"key": "stage", "value": "ga",
                                                      "repaired": True}
    # replayed, the tag events give the stored tags: stage=ga, owner removed
    state: dict[str, str | None] = {}
    for e in events:
        if e.name == "model_version_tag.set":
            state[e.data["key"]] = e.data["value"]
        elif e.name == "model_version_tag.deleted":
            state[e.data["key"]] = None
    assert {k: v for k, v in state.items() if v is not None} == {"stage": "ga"}
    assert ("model_version_tag.deleted", "m", "1") in kept
    r = run_cli("events", "repair", "--store", url)
    assert r.returncode == 0 and "no event missing" in r.stderr, (r.stdout, r.stderr)


def test_repair_does_not_copy_a_store_writers_actor_into_the_log(tmp_path: Path) -> None:
    """A tombstone whose actor breaks the event schema: the repaired event
    carries the repairing process's actor rather than one every reader refuses."""
    url = str(tmp_path / "store")
    with Registry(url, db=f"sqlite:///{tmp_path / 'i.db'}") as reg:
        publish_api(reg, tmp_path, "1")
        reg.delete_release("m", "1", "gone")
    _drop_events(url, "model_version.deleted")
    stone = tmp_path / "store" / "ledger" / "tombstones" / "m" / "1.json"
    doc = json.loads(stone.read_text())
    doc["actor"] = {"user": "", "evil": "x" * 10}
    stone.write_text(json.dumps(doc))
    r = run_cli("events", "repair", "--json", "--store", url)
    assert r.returncode == 0 and json.loads(r.stdout)["appended"] == [
        "model_version.deleted m@1"], r.stderr
    with open_store(url) as store:
        last = list(iter_events(store))[-1]  # parses and validates
    assert last.name == "model_version.deleted" and last.data["reason"] == "gone"
    assert last.actor is not None and "evil" not in last.actor and last.actor["user"]
