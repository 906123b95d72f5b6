"""The store's event log (registry.events, issue 32 item 7): numbering, no event lost
or duplicated under concurrent writer processes, damaged events, the append's error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry import errors as E
from registry.host.actor import ACTOR_ENV, current_actor, describe
from registry.events import EVENT_NAMES, append_event, iter_events, read_event
from registry.events.log import event_numbers
from registry.protocol.layout import event_key
from registry.store import Store, open_store
from tests.conftest import run_cli
from tests.support.forkclient import python_popen

REPO = Path(__file__).resolve().parent.parent
WRITER = REPO / "tests" / "support" / "event_writer.py"


def test_actor_user_host_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ACTOR_ENV, "alice")
    a = current_actor("ab" * 32)
    assert a["user"] == "alice" and a["host"] and a["key"] == "ab" * 32
    monkeypatch.delenv(ACTOR_ENV)
    assert current_actor()["user"] and current_actor()["key"] is None
    assert describe(a).startswith("alice@")


def test_append_numbers_and_reads_back(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ACTOR_ENV, "bob")
    ids = [append_event(store, "model_version.created", model_id="m", version=str(i),
                        data={"n": i}) for i in range(3)]
    assert len(set(ids)) == 3
    assert event_numbers(store) == [1, 2, 3]
    events = list(iter_events(store))
    assert [e.id for e in events] == ids and [e.version for e in events] == ["0", "1", "2"]
    assert events[0].actor["user"] == "bob" and events[0].data == {"n": 0}
    assert [e.seq for e in iter_events(store, after=2)] == [3]
    assert store.exists(event_key(3))


def test_unknown_name_is_a_programming_error(store: Store) -> None:
    with pytest.raises(ValueError):
        append_event(store, "model.exploded")
    assert "model_version.created" in EVENT_NAMES


def test_damaged_event_named_not_skipped_silently(store: Store) -> None:
    append_event(store, "policy.changed", model_id="m")
    store.write_bytes(event_key(2), b"{not json")
    append_event(store, "policy.changed", model_id="m")  # numbering goes on past it
    with pytest.raises(E.DocumentError, match="000000000002.json"):
        list(iter_events(store))
    damaged: list[str] = []
    assert [e.seq for e in iter_events(store, damaged=damaged)] == [1, 3]
    assert "000000000002.json" in damaged[0]


def test_copied_event_refused(store: Store) -> None:
    append_event(store, "policy.changed", model_id="m")
    store.write_bytes(event_key(5), store.read_bytes(event_key(1)))
    with pytest.raises(E.DocumentError, match="seq 1 but the object is number 5"):
        read_event(store, 5)


def test_append_failure_says_the_write_committed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (root / "events").write_text("a file where the events folder goes")
    store = open_store(str(root))
    with pytest.raises(E.EventNotRecordedError) as info:
        append_event(store, "model_version.created", model_id="m", version="1")
    assert "m@1 committed" in str(info.value) and "registry events repair" in str(info.value)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_concurrent_writer_processes_lose_and_duplicate_nothing(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = str(tmp_path / "store") if kind == "local" else \
        f"s3://{request.getfixturevalue('s3_bucket')}/root"
    writers, each = 4, 8
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [python_popen([sys.executable, str(WRITER), url, f"w{w}", str(each)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(writers)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    with open_store(url) as store:
        events = list(iter_events(store))
    assert [e.seq for e in events] == list(range(1, writers * each + 1))  # no holes
    seen = sorted((e.data["writer"], e.data["i"]) for e in events)
    assert seen == sorted((f"w{w}", i) for w in range(writers) for i in range(each))
    assert len({e.id for e in events}) == writers * each
    for w in range(writers):  # each writer's own events in its own order
        mine = [e.data["i"] for e in events if e.data["writer"] == f"w{w}"]
        assert mine == list(range(each))


#: Appends one event with os.link (the step that publishes a local event's
#: temporary file under its number) held until the process is killed.
_STALLED_APPEND = r'''
import os, sys, time
from registry.events import append_event
from registry.store import open_store

def stall(src, dst, *a, **k):
    print("linking", flush=True)
    time.sleep(600)

os.link = stall
with open_store(sys.argv[1]) as store:
    append_event(store, "policy.changed", model_id="m")
'''


def test_a_killed_append_leaves_a_temporary_file_that_gc_removes_by_age(
        tmp_path: Path) -> None:
    """SIGKILLed between writing its temporary file and linking it, a local
    append leaves ``events/.tmp-<id>`` and no event. ``registry gc`` removes
    it once older than ``--older-than`` (not before: a live append's), and
    never touches an event."""
    url = str(tmp_path / "store")
    with open_store(url) as store:
        append_event(store, "policy.changed", model_id="m")
    p = python_popen([sys.executable, "-c", _STALLED_APPEND, url],
                     env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "linking\n", p.stderr
    p.kill()
    p.communicate(timeout=60)
    folder = tmp_path / "store" / "events"
    temps = [f for f in os.listdir(folder) if f.startswith(".tmp-")]
    assert len(temps) == 1 and sorted(os.listdir(folder)) == sorted(
        [temps[0], "000000000001.json"])
    with open_store(url) as store:
        assert event_numbers(store) == [1]  # the killed append left no event

    r = run_cli("gc", "--older-than", "1h", "--store", url)
    assert r.returncode == 0, r.stderr
    assert (folder / temps[0]).exists()  # young: it may be a live append's
    old = time.time() - 2 * 3600
    for name in os.listdir(folder):
        os.utime(folder / name, (old, old))
    r = run_cli("gc", "--older-than", "1h", "--store", url, "--dry-run")
    assert r.returncode == 0 and f"would remove {folder / temps[0]}" in r.stdout, r.stdout
    assert (folder / temps[0]).exists()
    r = run_cli("gc", "--older-than", "1h", "--store", url)
    assert r.returncode == 0 and f"removed {folder / temps[0]}" in r.stdout, r.stdout
    assert os.listdir(folder) == ["000000000001.json"]  # the event itself stays


def test_gc_never_follows_a_temporary_file_that_became_a_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A temporary file swapped for a link to a file outside the store between
    gc's listing and its delete: the link itself is removed (unlink never
    follows), its target is untouched, the other leftovers still go and the
    events stay."""
    from registry.lifecycle.gc import collect

    url = str(tmp_path / "store")
    with open_store(url) as store:
        append_event(store, "policy.changed", model_id="m")
    folder = tmp_path / "store" / "events"
    outside = tmp_path / "outside"
    outside.write_text("keep me")
    old = time.time() - 7200
    for name in (".tmp-a", ".tmp-b"):
        (folder / name).write_text("x")
        os.utime(folder / name, (old, old))
    store = open_store(url)
    real = type(store).delete

    def racing_delete(self: Store, key: str) -> None:
        if key.endswith(".tmp-a"):
            (folder / ".tmp-a").unlink()
            (folder / ".tmp-a").symlink_to(outside)
        real(self, key)

    monkeypatch.setattr(type(store), "delete", racing_delete)
    removed = collect(store, older_than=3600)
    assert removed == ["events/.tmp-a", "events/.tmp-b"], removed
    assert outside.read_text() == "keep me" and not os.path.lexists(folder / ".tmp-a")
    assert event_numbers(store) == [1] and os.listdir(folder) == ["000000000001.json"]
