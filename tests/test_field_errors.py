"""Issue 13 item 7: a store error is never an empty answer.

"Not found" only when the backend said the thing does not exist (404 /
NoSuchKey under an existing bucket, ENOENT under an existing local root);
every other failure -- a missing bucket or store folder, a denied listing,
a down endpoint, wrong credentials -- is a StorageError (exit 6) that names
the store and the likely cause. Gates fail closed; ``index rebuild`` leaves
the index as it was.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.errors import ObjectNotFoundError, StorageError
from registry.gating.ledger import revoke
from registry.store import open_store
from tests.conftest import free_port, proxied, run_cli
from tests.support import moto_process
from tests.support.faultproxy import FaultProxy, deny_listing
from tests.test_release import checkpoint, release


@pytest.fixture(scope="module")
def auth_endpoint() -> Iterator[str]:
    """A moto server with authentication on: the session's keys are unknown to it."""
    with moto_process.start({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:
        yield endpoint


def broken(case: str, tmp_path: Path, auth: str | None) -> tuple[str, dict[str, str], str]:
    """(store URL, environment, words the error must hold) for one broken store."""
    if case == "missing bucket":
        name = f"nosuch-{uuid.uuid4().hex[:12]}"
        return f"s3://{name}/root", {}, "bucket does not exist"
    if case == "missing local store":
        return str(tmp_path / "no-such-store"), {}, "store does not exist"
    if case == "down endpoint":
        return "s3://b/root", {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
                               "AWS_MAX_ATTEMPTS": "2"}, "cannot reach the endpoint"
    assert case == "wrong credentials" and auth
    return "s3://b/root", {"AWS_ENDPOINT_URL": auth}, "credentials"


#: each case with the commands the issue found failing open on it (a CLI call
#: costs seconds on a loaded machine: every command is covered by two cases).
CASES = {
    "missing bucket": [("ledger", "ls"), ("pull", "m@1"), ("gate", "check", "m@1"),
                       ("index", "rebuild")],
    "missing local store": [("alias", "ls", "m"), ("gc",), ("pull", "m@1")],
    "down endpoint": [("ledger", "ls"), ("index", "rebuild"), ("gc",)],
    "wrong credentials": [("alias", "ls", "m"), ("gate", "check", "m@1"), ("index", "rebuild")],
}


@pytest.mark.parametrize("case", CASES)
def test_cli_on_a_broken_store_fails_with_exit_6(case: str, tmp_path: Path, s3_server: object,
                                                   auth_endpoint: str) -> None:
    url, env, words = broken(case, tmp_path, auth_endpoint)
    for cmd in CASES[case]:
        extra = {"pull": ["--cache", str(tmp_path / "cache")],
                 "index": ["--db", f"sqlite:///{tmp_path / 'i.db'}"]}.get(cmd[0], [])
        r = run_cli(*cmd, "--store", url, *extra, env=env)
        assert r.returncode == 6, (case, cmd, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (case, cmd, r.stderr)
        assert words in lines[0] and url.split("/root")[0] in lines[0], (case, cmd, lines[0])
        assert "no version named" not in lines[0]
    assert not (tmp_path / "no-such-store").exists()  # reading never creates a store


def test_store_api_tells_missing_from_failing(tmp_path: Path, s3_bucket: str) -> None:
    # Absent under an existing root: an empty listing / not found.
    for url in (f"s3://{s3_bucket}/root", str(tmp_path / "s")):
        s = open_store(url)
        s.write_bytes("a/x", b"1")
        assert s.list_dir("nothing-here") == [] and s.walk_files("nothing-here") == {}
        with pytest.raises(ObjectNotFoundError):
            s.info("a/missing")
        assert not s.exists("a/missing")
    # A missing bucket or root: never "not found", never empty.
    for url in (f"s3://nosuch-{uuid.uuid4().hex[:12]}/root", str(tmp_path / "nope")):
        s = open_store(url)
        for call in (lambda: s.list_dir("models"), lambda: s.walk_files("models")):
            with pytest.raises(StorageError) as e:
                call()
            assert not isinstance(e.value, ObjectNotFoundError)
    s = open_store(f"s3://nosuch-{uuid.uuid4().hex[:12]}/root")
    for call in (lambda: s.info("k"), lambda: s.exists("k"), lambda: s.read_bytes("k")):
        with pytest.raises(StorageError) as e:
            call()
        assert not isinstance(e.value, ObjectNotFoundError) and "bucket does not exist" in str(
            e.value)


def test_denied_ledger_listing_fails_closed(s3_bucket: str, proxy: FaultProxy,
                                            tmp_path: Path) -> None:
    """A revoked release never passes a gate because the ledger could not be
    listed; alias set does not move; index rebuild keeps the index."""
    url = f"s3://{s3_bucket}/root"
    store = open_store(url)
    checkpoint(store)
    release(store, "1")
    db = ["--db", f"sqlite:///{tmp_path / 'i.db'}"]
    assert run_cli("index", "rebuild", "--store", url, *db).returncode == 0
    revoke(store, "wiki", "withdrawn")
    env = {"AWS_ENDPOINT_URL": proxy.endpoint}
    proxy.rules.append(deny_listing("ledger/"))
    s = ["--store", url]
    r = run_cli("gate", "check", "tiny@1", *s, env=env)
    assert r.returncode == 6 and "access denied" in r.stderr and "ledger" in r.stderr, r.stderr
    r = run_cli("alias", "set", "tiny", "prod", "1", *s, *db, env=env)
    assert r.returncode == 6, r.stderr
    assert not store.exists("models/tiny/refs/prod")
    r = run_cli("index", "rebuild", *s, *db, env=env)
    assert r.returncode == 6, r.stderr
    r = run_cli("ls", "tiny", "--json", *s, *db)  # ls reads signatures from the store
    assert r.returncode == 0 and "1" in r.stdout, r.stdout  # the old index is intact
    assert [q.op for q in proxy.log if q.op == "ListObjects"]  # the rule was exercised
    # Through the same proxy without the rule: the gate sees the revocation.
    proxy.rules.clear()
    r = run_cli("gate", "check", "tiny@1", "--json", *s, env=env)
    assert r.returncode == 1 and json.loads(r.stdout)["passed"] is False
    store.close()
    proxied(url, proxy).close()
