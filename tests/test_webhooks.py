"""Webhook delivery of events (issue 32 items 7, 8): a real HTTP receiver in a thread
that refuses the first deliveries and recovers; HMAC-SHA256 signatures checked;
the deliverer (real processes) retries with backoff, and resumes from its cursor
after SIGKILL with nothing lost; at-least-once with the event id for dedup.
Local disk and S3."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from registry.events import append_event, iter_events
from registry.events.deliver import (
    HEADER_ID,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    Cursor,
    DeliveryError,
    deliver,
)
from registry.store import open_store
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parent.parent
SECRET = b"s3cret-for-tests"


class Receiver:
    """An HTTP server that answers 500 to the first ``fail_first`` requests, checks
    every signature, and can stall on one event (``stall_seq``)."""

    def __init__(self, fail_first: int = 0, stall_seq: int | None = None) -> None:
        self.fail_first = fail_first
        self.stall_seq = stall_seq
        self.requests: list[dict[str, Any]] = []
        self.arrived: list[int] = []
        self.bad_signatures = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                stamp = self.headers[HEADER_TIMESTAMP]
                want = "sha256=" + hmac.new(SECRET, stamp.encode() + b"." + body,
                                            hashlib.sha256).hexdigest()
                doc = json.loads(body)
                outer.arrived.append(doc["seq"])
                if doc["seq"] == outer.stall_seq:
                    time.sleep(30)  # killed meanwhile: this request is never answered
                    return
                with outer.lock:
                    ok_sig = hmac.compare_digest(want, self.headers[HEADER_SIGNATURE])
                    outer.bad_signatures += not ok_sig
                    fail = len(outer.requests) < outer.fail_first or not ok_sig
                    outer.requests.append({"id": self.headers[HEADER_ID], "seq": doc["seq"],
                                           "failed": fail})
                self.send_response(500 if fail else 204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def accepted(self) -> list[int]:
        with self.lock:
            return [r["seq"] for r in self.requests if not r["failed"]]

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    p = tmp_path / "secret"
    p.write_bytes(SECRET + b"\n")
    p.chmod(0o600)
    return p


def fill(url: str, n: int) -> list[str]:
    """``n`` tag events of ``m@1``; what they claim is made true in the store first
    (``m@1`` has a record: a tombstone), since an event is delivered only then
    (issue 50, registry.trust.events)."""
    from registry.protocol.layout import tombstone_key

    with open_store(url) as store:
        store.ensure_root()
        if not store.exists(tombstone_key("m", "1")):
            store.write_bytes(tombstone_key("m", "1"), b"{}")
        return [append_event(store, "model_version_tag.set", model_id="m", version="1",
                             data={"i": i}) for i in range(n)]


def test_receiver_fails_then_recovers_api(durable_store_url: str, tmp_path: Path) -> None:
    ids = fill(durable_store_url, 3)
    cursor = Cursor(tmp_path / "cursor.json")
    with Receiver(fail_first=3) as rx, open_store(durable_store_url) as store:
        attempts: list[int] = []
        assert deliver(store, rx.url, SECRET, cursor, backoff=0.01,
                       on_event=lambda e, n: attempts.append(n)) == 3
        assert attempts == [4, 1, 1]  # the first event took 3 refusals and a success
        assert rx.accepted() == [1, 2, 3] and rx.bad_signatures == 0
        assert [r["id"] for r in rx.requests if not r["failed"]] == ids
        assert cursor.read() == 3
        assert deliver(store, rx.url, SECRET, cursor, backoff=0.01) == 0  # nothing new
        fill(durable_store_url, 1)
        assert deliver(store, rx.url, SECRET, cursor, backoff=0.01) == 1
        assert rx.accepted() == [1, 2, 3, 4]


def test_gives_up_after_max_attempts_cursor_kept(durable_store_url: str, tmp_path: Path) -> None:
    fill(durable_store_url, 2)
    cursor = Cursor(tmp_path / "cursor.json")
    with Receiver(fail_first=100) as rx, open_store(durable_store_url) as store:
        with pytest.raises(DeliveryError, match="event 1 .* refused 3 times"):
            deliver(store, rx.url, SECRET, cursor, max_attempts=3, backoff=0.01)
        assert cursor.read() == 0 and len(rx.requests) == 3


def test_wrong_secret_is_refused_by_receiver(durable_store_url: str, tmp_path: Path) -> None:
    fill(durable_store_url, 1)
    with Receiver() as rx, open_store(durable_store_url) as store:
        with pytest.raises(DeliveryError):
            deliver(store, rx.url, b"other", Cursor(tmp_path / "c.json"), max_attempts=2,
                    backoff=0.01)
        assert rx.bad_signatures == 2


def test_cli_deliver_retries_and_resumes_after_sigkill(durable_store_url: str, tmp_path: Path,
                                                       secret_file: Path) -> None:
    ids = fill(durable_store_url, 6)
    cursor = tmp_path / "cursor.json"
    args = [sys.executable, "-m", "registry", "events", "deliver", "--webhook", "URL",
            "--secret-file", str(secret_file), "--cursor", str(cursor), "--backoff", "0.05",
            "--store", durable_store_url]
    with Receiver(fail_first=2, stall_seq=4) as rx:
        argv = [rx.url if a == "URL" else a for a in args]
        p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 120
        while 4 not in rx.arrived and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rx.accepted() == [1, 2, 3]
        p.send_signal(signal.SIGKILL)  # killed while event 4 is in flight
        out, err = p.communicate(timeout=60)
        assert p.returncode == -9
        assert json.loads(cursor.read_text())["delivered"] == 3
        rx.stall_seq = None
        r = run_cli(*argv[3:], "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["from"] == 3 and json.loads(r.stdout)["delivered"] == 3
    accepted = rx.accepted()
    assert accepted == [1, 2, 3, 4, 5, 6]  # nothing lost, in order
    got = {r["id"] for r in rx.requests}
    assert got == set(ids)  # redeliveries carry the same id: the receiver dedups on it
    assert rx.arrived.count(4) == 2  # the one in flight when killed: sent again
    assert rx.bad_signatures == 0


def test_cli_events_ls_tail_and_errors(durable_store_url: str, tmp_path: Path) -> None:
    fill(durable_store_url, 3)
    r = run_cli("events", "ls", "--json", "--store", durable_store_url)
    assert [e["seq"] for e in json.loads(r.stdout)] == [1, 2, 3]
    r = run_cli("events", "ls", "--since", "2", "--store", durable_store_url)
    assert r.returncode == 0 and r.stdout.startswith("3\t") and "model_version_tag.set" in r.stdout
    r = run_cli("events", "tail", "--count", "2", "--store", durable_store_url)
    assert [line.split("\t")[0] for line in r.stdout.splitlines()] == ["2", "3"]
    r = run_cli("events", "ls", "--since", "soon", "--store", durable_store_url)
    assert r.returncode == 2 and "--since 'soon'" in r.stderr
    r = run_cli("events", "deliver", "--webhook", "ftp://x", "--secret-file", "nope",
                "--store", durable_store_url)
    assert r.returncode == 2 and "http://" in r.stderr
    with open_store(durable_store_url) as store:
        assert len(list(iter_events(store))) == 3


def test_serve_webhook_delivers_while_serving(tmp_path: Path, secret_file: Path) -> None:
    from tests.web_util import serve

    url = str(tmp_path / "store")
    fill(url, 2)
    state = tmp_path / "state"
    with Receiver(fail_first=1) as rx:
        with serve(url, f"sqlite:///{tmp_path / 'i.db'}", "--webhook", rx.url,
                   "--webhook-secret-file", str(secret_file),
                   env={"REGISTRY_STATE_DIR": str(state)}):
            deadline = time.monotonic() + 60
            while len(rx.accepted()) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            fill(url, 1)  # appended while serving: picked up by the next poll
            while len(rx.accepted()) < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
        assert rx.accepted() == [1, 2, 3]
    [cursor] = (state / "webhooks").glob("*.json")
    assert json.loads(cursor.read_text())["delivered"] == 3
    r = run_cli("serve", "--webhook", "http://127.0.0.1:1/x", "--store", url)
    assert r.returncode == 2 and "--webhook-secret-file" in r.stderr
