"""Signed snapshots through a mirror (issue 50 items 1 and 3): ``pull --from`` a real
keyless ``registry serve`` reads the model's signed timestamp, snapshot and listed
records through the mirror's ``/api/registry/records/`` route and checks them with
the same trust function as a pull from the store. Each refusal fails if the relay
(registry.web.hubrecords) or the check (registry.trust.freshness) is removed: the
mirror is honest, so only the signed snapshot tells the puller what it serves is wrong.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("model_signing")

from registry.refs.aliases import set_alias  # noqa: E402
from registry.release import ModelRelease  # noqa: E402
from registry.trust.snapshot import sign_snapshot  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.release_util import ledger_row, summary  # noqa: E402
from tests.test_signing import SignedStore, model_dir  # noqa: E402
from tests.web_util import serve  # noqa: E402


class World(SignedStore):
    def model(self, m: str) -> str:
        """``m`` with signed releases 1 and 2, ``prod`` -> 2 (signed)."""
        for v in ("1", "2"):
            ModelRelease(self.store).publish(model_dir(self.root / "src", f"{m}{v}", seed=int(v)),
                                             m, v, ledger=[ledger_row()], eval_summary=summary(),
                                             sign_key=self.key)
        set_alias(self.store, m, "prod", "2", sign_key=self.key)
        return m

    def pull(self, ref: str, tmp: Path, *extra: str,
             env: dict[str, str] | None = None) -> tuple[int, str, str, Path]:
        """``registry pull REF --from MIRROR --trusted-key`` as a fresh host."""
        to = tmp / f"out-{time.monotonic_ns()}"
        r = run_cli("pull", ref, "--from", self.mirror, "--trusted-key", str(self.pub),
                    "--to", str(to), "--cache", str(tmp / f"c-{time.monotonic_ns()}"), *extra,
                    env=env)
        assert "Traceback" not in r.stderr, r.stderr
        return r.returncode, r.stdout, r.stderr, to


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("mirror-snap"))
    db = tmp_path_factory.mktemp("mirror-snap-db")
    w.store.write_bytes("ledger/.keep", b"")  # the store exists before the mirror starts
    with serve(w.url, f"sqlite:///{db / 'm.db'}",
               env={"REGISTRY_CACHE": str(db / "cache")}) as mirror:  # no keys
        w.mirror = mirror
        yield w


def test_a_good_release_is_pulled_with_its_snapshot_checked(world: World,
                                                           tmp_path: Path) -> None:
    m = world.model("good")
    sign_snapshot(world.store, m, world.key)
    # a host that requires a signed snapshot gets it through the mirror
    code, out, err, to = world.pull(f"{m}@prod", tmp_path, "--json",
                                    env={"REGISTRY_REQUIRE_SNAPSHOT": "1"})
    assert code == 0, err
    doc = json.loads(out)
    assert doc["version"] == "2" and doc["freshness"].startswith("signed snapshot 1 of good")
    assert (to / "config.json").exists() or any(to.iterdir())


def test_a_removed_yank_listed_in_the_snapshot_is_refused_through_the_mirror(
        world: World, tmp_path: Path) -> None:
    m = world.model("yanked")
    sign_snapshot(world.store, m, world.key)
    r = run_cli("yank", f"{m}@1", "--reason", "bad weights", "--sign-key", str(world.key),
                "--store", world.url)
    assert r.returncode == 0 and "signed snapshot 2 of yanked" in r.stdout, r.stderr
    # a store writer un-yanks before the mirror ever saw the yank: it serves 1 honestly
    world.store.delete(f"ledger/yanks/{m}/1.json")
    code, _, err, to = world.pull(f"{m}@1", tmp_path)
    assert code != 0, err
    assert "yank record of yanked@1, listed in signed snapshot 2" in err, err
    assert "is gone: refused" in err and len(err.strip().splitlines()) == 1, err
    assert not to.exists()
    # the other release is not held hostage
    code, _, err, _ = world.pull(f"{m}@2", tmp_path)
    assert code == 0, err


def test_an_expired_timestamp_is_refused_through_the_mirror(world: World,
                                                           tmp_path: Path) -> None:
    m = world.model("frozen")
    done = sign_snapshot(world.store, m, world.key, expires_in=1)
    expires = datetime.fromisoformat(done["expires"].replace("Z", "+00:00"))
    while datetime.now(UTC) <= expires:
        time.sleep(0.2)
    code, _, err, to = world.pull(f"{m}@prod", tmp_path)
    assert code != 0 and "signed timestamp of frozen expired at" in err, err
    assert not to.exists()


def test_the_route_relays_trust_records_only(world: World) -> None:
    m = world.model("route")
    sign_snapshot(world.store, m, world.key)
    base = f"{world.mirror}/api/registry/records"
    with urllib.request.urlopen(f"{base}/ledger/snapshots/{m}/timestamp.json") as r:
        assert r.read() == world.store.read_bytes(f"ledger/snapshots/{m}/timestamp.json")
        assert r.headers["Cache-Control"] == "no-store"
    for key in (f"models/{m}/1/MANIFEST.json", f"models/{m}/refs/prod",
                f"ledger/snapshots/{m}/0.snapshot.json", "ledger/yanks/x/%2e%2e.json",
                f"ledger/yanks/{m}/9.json"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/{key}")
        e.value.close()
        assert e.value.code in (400, 404), key
