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

from registry.actor import actor_of_metadata
from registry.api import Registry
from registry.events import iter_events
from registry.store import open_store
from registry.verify import read_manifest
from tests.conftest import run_cli
from tests.test_aliases import docs, model_dir, publish_api


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
                *docs(tmp_path), *s)
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
                *docs(tmp_path), *s)
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
