"""Signed snapshot and timestamp (issue 50 item 3): TUF's ideas with the registry's keys.

Each attack is a store writer's (bucket access, no signing key) against a host
pulling with trusted keys, on a local store and on S3 (moto). Most run against
a *fresh* host (an empty cache, no marks): trust on first use cannot protect
it, only the signed snapshot can, so each refusal here fails if its check in
:mod:`registry.trust.freshness` is removed.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("model_signing")

from registry.refs.alias_history import walk  # noqa: E402
from registry.refs.aliases import set_alias  # noqa: E402
from registry.errors import RegistryError  # noqa: E402
from registry.gating.ledger import revoke  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.release import ModelRelease  # noqa: E402
from registry.store import Store, open_store  # noqa: E402
from registry.trust import load_trust  # noqa: E402
from registry.trust.snapshot import refresh_timestamp, sign_snapshot  # noqa: E402
from tests.conftest import make_store_url, run_cli  # noqa: E402
from tests.release_util import ledger_row, summary  # noqa: E402
from tests.test_signing import keypair, model_dir  # noqa: E402

M = "snap"
TS = f"ledger/snapshots/{M}/timestamp.json"


class Host:
    """A store with releases 1 and 2 of ``snap`` (signed), ``prod`` moved 1 -> 2
    (signed), and the key that signs them."""

    def __init__(self, url: str, root: Path) -> None:
        self.root = root
        self.url = url
        (root / "keys").mkdir(parents=True, exist_ok=True)
        self.store: Store = open_store(url)
        self.key, self.pub = keypair(root, "release")
        self.trust = load_trust([self.pub])
        for v in ("1", "2"):
            ModelRelease(self.store).publish(model_dir(root / "src", f"s{v}", seed=int(v)), M,
                                             v, ledger=[ledger_row()], eval_summary=summary(),
                                             sign_key=self.key)
        set_alias(self.store, M, "prod", "1", sign_key=self.key)
        set_alias(self.store, M, "prod", "2", sign_key=self.key)

    def pull(self, ref: str, cache: str, to: str = "") -> str:
        """Pull ``snap@ref`` with trust as a host whose cache is ``cache``."""
        to_path = self.root / (to or f"out-{cache}-{time.monotonic_ns()}")
        return pull(self.store, M, ref, to=to_path, trust=self.trust,
                    cache=self.root / cache).version

    def cli(self, *args: str) -> tuple[int, str, str]:
        r = run_cli(*args, "--store", self.url)
        assert "Traceback" not in r.stderr, r.stderr
        return r.returncode, r.stdout, r.stderr


@pytest.fixture(params=["local", "s3"])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Host:
    return Host(make_store_url(request.param, request, tmp_path), tmp_path)


def test_signed_snapshot_admits_and_says_so(host: Host) -> None:
    code, out, err = host.cli("snapshot", "sign", M, "--sign-key", str(host.key), "--json")
    assert code == 0, err
    done = json.loads(out)["signed"][0]
    assert done["snapshot"] == 1 and done["records"] == 1  # the pointer of prod
    r = run_cli("pull", f"{M}@prod", "--store", host.url, "--trusted-key", str(host.pub),
                "--to", str(host.root / "p"), "--cache", str(host.root / "c"))
    assert r.returncode == 0, r.stderr
    assert "records: signed snapshot 1 of snap" in r.stdout, r.stdout
    r = run_cli("pull", f"{M}@1", "--store", host.url, "--to", str(host.root / "p2"),
                "--cache", str(host.root / "c2"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["freshness"].startswith("trust on first use: no trusted keys")


def test_a_removed_yank_listed_in_the_snapshot_is_refused_on_a_fresh_host(host: Host) -> None:
    sign_snapshot(host.store, M, host.key)
    code, out, err = host.cli("yank", f"{M}@1", "--reason", "bad weights", "--sign-key",
                              str(host.key))
    assert code == 0 and "signed snapshot 2 of snap" in out, (out, err)
    host.store.delete(f"ledger/yanks/{M}/1.json")  # the store writer un-yanks
    with pytest.raises(RegistryError, match=r"yank record of snap@1, listed in signed "
                                            r"snapshot 2 .* is gone: refused") as err:
        host.pull("1", "fresh")
    assert "never taken as lifted" in str(err.value)
    # the CLI: one line, naming it
    r = run_cli("pull", f"{M}@1", "--store", host.url, "--trusted-key", str(host.pub),
                "--to", str(host.root / "cli"), "--cache", str(host.root / "fresh-cli"))
    assert r.returncode != 0 and "yank record of snap@1" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (host.root / "cli").exists()


def test_a_forged_unyank_is_refused(host: Host) -> None:
    """The record is there but says something else than the signed one."""
    from registry.lifecycle import records

    sign_snapshot(host.store, M, host.key)
    host.cli("yank", f"{M}@1", "--reason", "bad", "--sign-key", str(host.key))
    doc = records.load(host.store, f"ledger/yanks/{M}/1.json")
    assert doc is not None
    host.store.write_bytes(f"ledger/yanks/{M}/1.json", records.dump(
        {**doc, "yanked": False, "revision": doc["revision"] + 1}))
    with pytest.raises(RegistryError, match="differs from the one listed"):
        host.pull("1", "fresh")


def test_a_rolled_back_alias_is_refused_on_a_fresh_host(host: Host) -> None:
    sign_snapshot(host.store, M, host.key)
    assert host.pull("prod", "seen") == "2"
    old = [mv for mv in walk(host.store, M, "prod") if mv.seq == 1][0]
    host.store.write_bytes(f"models/{M}/refs/prod", old.raw)  # an older *signed* move
    with pytest.raises(RegistryError, match=r"alias 'prod' of snap is at move 1, but signed "
                                            r"snapshot 1 .* lists move 2: refused"):
        host.pull("prod", "fresh")


def test_an_expired_timestamp_is_refused_until_refreshed(host: Host) -> None:
    """Freeze: the store held at an old state is refused once the timestamp ran out."""
    done = sign_snapshot(host.store, M, host.key, expires_in=1)
    assert host.pull("prod", "a") == "2"
    expires = datetime.fromisoformat(done["expires"].replace("Z", "+00:00"))
    while datetime.now(UTC) <= expires:
        time.sleep(0.2)
    with pytest.raises(RegistryError, match="expired at .*the store may be frozen"):
        host.pull("prod", "a")
    code, out, err = host.cli("snapshot", "refresh", "--sign-key", str(host.key),
                              "--expires-in", "1h")
    assert code == 0 and "refreshed the timestamp of snap (snapshot 1, timestamp 2)" in out, \
        (out, err)
    assert host.pull("prod", "a") == "2"


def test_a_host_never_goes_back_to_an_older_snapshot(host: Host) -> None:
    sign_snapshot(host.store, M, host.key)
    old = host.store.read_bytes(TS)  # still valid: a day
    host.cli("yank", f"{M}@2", "--reason", "bad", "--sign-key", str(host.key))
    assert host.pull("1", "a") == "1"  # host a accepts snapshot 2 (never reads 2's yank)
    host.store.write_bytes(TS, old)  # the writer replays timestamp 1 ...
    host.store.delete(f"ledger/yanks/{M}/2.json")  # ... under which 2 was not yanked
    with pytest.raises(RegistryError, match="accepted version 2 before.*never goes back"):
        host.pull("2", "a")


def test_a_removed_snapshot_is_never_taken_as_none(host: Host) -> None:
    sign_snapshot(host.store, M, host.key)
    assert host.pull("1", "a") == "1"
    host.store.delete(TS)
    with pytest.raises(RegistryError, match="removed snapshot is never taken as none"):
        host.pull("1", "a")


def test_a_removed_revocation_listed_in_the_snapshot_is_refused(host: Host) -> None:
    revoke(host.store, "other-source", "withdrawn")
    code, out, err = host.cli("ledger", "revoke", "another", "--reason", "withdrawn",
                              "--sign-key", str(host.key))
    assert code == 0 and out.count("signed snapshot") == 0, (out, err)  # none to re-sign yet
    sign_snapshot(host.store, M, host.key)
    host.store.delete("ledger/revocations/other-source.json")
    with pytest.raises(RegistryError, match="revocation 'other-source', listed in signed "
                                            "snapshot 1.* is gone"):
        host.pull("1", "fresh")


def test_forged_snapshots_are_refused(host: Host) -> None:
    sign_snapshot(host.store, M, host.key)
    host.cli("yank", f"{M}@1", "--reason", "bad", "--sign-key", str(host.key))
    key = f"ledger/snapshots/{M}/2.snapshot.json"
    doc = json.loads(host.store.read_bytes(key))
    del doc["signed"]["records"][f"ledger/yanks/{M}/1.json"]
    host.store.write_bytes(key, json.dumps(doc).encode())  # its sha256 is not the named one
    host.store.delete(f"ledger/yanks/{M}/1.json")
    with pytest.raises(RegistryError, match="not the one the timestamp names"):
        host.pull("1", "fresh")
    # the writer signs both with a key of its own: not one this host trusts
    (host.root / "evil" / "keys").mkdir(parents=True)
    evil, _ = keypair(host.root / "evil", "evil")
    sign_snapshot(host.store, M, evil)
    with pytest.raises(RegistryError, match="which this host does not trust"):
        host.pull("1", "fresh2")


def test_a_host_may_require_a_snapshot(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_REQUIRE_SNAPSHOT", "1")
    with pytest.raises(RegistryError, match="which this host requires"):
        host.pull("1", "a")
    sign_snapshot(host.store, M, host.key)
    assert host.pull("1", "a") == "1"


def test_alias_moves_re_sign_an_existing_snapshot_only(host: Host) -> None:
    code, out, _ = host.cli("alias", "set", M, "canary", "1", "--sign-key", str(host.key))
    assert code == 0 and "signed snapshot" not in out  # no snapshot: none made
    sign_snapshot(host.store, M, host.key)
    code, out, _ = host.cli("alias", "set", M, "prod", "1", "--sign-key", str(host.key))
    assert code == 0 and "signed snapshot 2 of snap" in out, out
    assert host.pull("prod", "fresh") == "1"
    refresh_timestamp(host.store, M, host.key)
    assert host.pull("prod", "fresh") == "1"


def test_policy_set_re_signs_an_existing_snapshot_only(host: Host) -> None:
    """Without --sign-key a policy change leaves the snapshot listing the old
    policy.json: hosts with keys refuse, and the error names the fix."""
    code, _, err = host.cli("policy", "set", M, "--require-signed-by", str(host.pub),
                            "--sign-key", str(host.key))
    assert code == 0, err
    assert not host.store.exists(TS)  # a model without a snapshot is not opted in
    sign_snapshot(host.store, M, host.key)
    assert host.pull("prod", "before") == "2"
    code, _, err = host.cli("policy", "set", M, "--require-signed-by", str(host.pub),
                            "--forbid-code")
    assert code == 0, err
    r = run_cli("pull", f"{M}@prod", "--store", host.url, "--trusted-key", str(host.pub),
                "--to", str(host.root / "refused"), "--cache", str(host.root / "fresh"))
    assert r.returncode != 0 and "the policy (key list) of snap differs" in r.stderr, r.stderr
    assert f"registry snapshot sign {M} --sign-key KEY" in r.stderr, r.stderr
    code, out, err = host.cli("policy", "set", M, "--require-signed-by", str(host.pub),
                              "--sign-key", str(host.key), "--json")
    assert code == 0, err
    assert json.loads(out)["snapshots"][0]["snapshot"] == 2, out
    assert host.pull("prod", "after") == "2"
