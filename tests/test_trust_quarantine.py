"""Quarantine and bounded work on the trust path (issue 50 items 4, 5): one bad store
record never stops the others (index rebuild, ls, the gates, the event log); events are
delivered only when what they claim is true in the store; a mirror's redirect never
carries the token to another origin, its endless manifest stops at the cap; the webhook
cursor is private whatever the umask. Real servers (threads of this process), real CLI
processes."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from registry.api import Registry
from registry.errors import StorageError
from registry.events import append_event
from registry.events.deliver import Cursor, deliver
from registry.events.log import event_numbers, select_events
from registry.pull.mirror_store import MirrorStore
from registry.release import ModelRelease
from registry.store import open_store
from tests.conftest import run_cli
from tests.release_util import ledger_row, summary
from tests.test_signing import model_dir
from tests.test_webhooks import SECRET, Receiver


def _publish(url: str, tmp: Path, model_id: str, version: str) -> None:
    ModelRelease(open_store(url)).publish(model_dir(tmp, f"{model_id}{version}"), model_id,
                                          version, ledger=[ledger_row()],
                                          eval_summary=summary())


def test_rebuild_ls_and_gates_quarantine_bad_records(durable_store_url: str,
                                                     tmp_path: Path) -> None:
    url, db = durable_store_url, f"sqlite:///{tmp_path / 'i.db'}"
    _publish(url, tmp_path, "good", "1")
    _publish(url, tmp_path, "bad-policy", "1")
    store = open_store(url)
    store.write_bytes("models/Not A Name!/1/MANIFEST.json", b"{}")
    store.write_bytes("ledger/revocations/wiki2.json", b"{garbled")
    store.write_bytes("models/bad-policy/policy.json", b"[not a policy")
    r = run_cli("index", "rebuild", "--store", url, "--db", db, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["releases"] == 2 and doc["quarantined"] == 3, doc
    keys = {q["what"] for q in doc["report"] if q["action"] == "quarantined"}
    assert keys == {"models/Not A Name!", "ledger/revocations/wiki2.json",
                    "models/bad-policy/policy.json"}, doc["report"]
    r = run_cli("ls", "--store", url, "--db", db, "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["model_id"]: row for row in json.loads(r.stdout)}
    assert rows["good"]["newest_passing"] == "1" and "quarantined" not in rows["good"]
    assert rows["bad-policy"]["newest_passing"] is None and rows["bad-policy"]["quarantined"]
    r = run_cli("ls", "--store", url, "--db", db)
    assert r.returncode == 0 and r.stderr.count("quarantined bad-policy") == 1, r.stderr
    with Registry(url, db=db) as reg:
        assert reg.gate_check("good", "1") and all(g.passed for g in reg.gate_check("good", "1"))


def test_events_bounded_and_only_true_ones_delivered(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _publish(url, tmp_path, "m", "1")
    store = open_store(url)
    append_event(store, "model_version.created", model_id="m", version="1")  # true
    before = event_numbers(store)
    n = before[-1]
    # a store writer's events: a release that does not exist, and a number out of bounds
    append_event(store, "model_version.created", model_id="m", version="9")
    store.write_bytes("events/" + "1" + "0" * 30 + ".json", b"{}")
    append_event(store, "policy.changed", model_id="m")  # numbered after the real log
    assert event_numbers(store) == [*before, n + 1, n + 2]
    assert [e.seq for e in select_events(store, newest=1)] == [n + 2]
    cursor = Cursor(tmp_path / "state" / "cursor.json")
    aside: list[tuple[int, str]] = []
    old = os.umask(0)
    try:
        with Receiver() as rx:
            sent = deliver(store, rx.url, SECRET, cursor, backoff=0.01,
                           on_set_aside=lambda e, why: aside.append((e.seq, why)))
    finally:
        os.umask(old)
    assert rx.accepted() == [*before, n + 2] and sent == len(before) + 1
    assert [s for s, _ in aside] == [n + 1] and "no release m@9" in aside[0][1]
    assert cursor.read() == n + 2
    assert cursor.path.stat().st_mode & 0o777 == 0o600
    assert cursor.path.parent.stat().st_mode & 0o777 == 0o700
    r = run_cli("events", "tail", "--count", "1", "--store", url, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["seq"] == n + 2, r.stderr
    r = run_cli("events", "repair", "--store", url, "--json")
    assert r.returncode == 0, r.stderr
    assert store.exists("events-quarantine/" + "1" + "0" * 30 + ".json")
    assert not store.exists("events/" + "1" + "0" * 30 + ".json")


@contextmanager
def http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_mirror_redirect_to_another_origin_keeps_the_token() -> None:
    seen: list[Any] = []

    class Other(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a: Any) -> None:
            pass

    with http(Other) as other:
        class Redirect(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(302)
                self.send_header("Location", other + self.path)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        with http(Redirect) as base:
            with pytest.raises(StorageError, match="another origin"):
                MirrorStore(base, token="s3cret").revision("m", "prod")
    assert seen == []


def test_mirror_endless_manifest_stops_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_MAX_MANIFEST_BYTES", str(64 << 10))
    sent = [0]

    class Endless(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if "/revision/" in self.path:
                body = json.dumps({"registry": {"version": "1"}}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.end_headers()
            try:
                while sent[0] < (256 << 20):
                    self.wfile.write(b" " * 65536)
                    sent[0] += 65536
            except OSError:
                pass

        def log_message(self, *a: Any) -> None:
            pass

    with http(Endless) as base:
        info = MirrorStore(base).info("models/m/1/MANIFEST.json")
    assert info.size == (64 << 10) + 1
    assert sent[0] < (64 << 20)  # stopped long before the endless body ran out
