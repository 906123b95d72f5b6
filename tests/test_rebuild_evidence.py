"""``index rebuild`` never forgets on weak evidence (issue 31 item 3): a
listing that lags (answered from an old view while GET and HEAD are fresh)
keeps what is committed and removes only what a HEAD confirms gone; staging
of a killed publish and claims are skipped, never an error; a damaged
release is reported and the others indexed; a release whose documents hold
numbers no column can hold is indexed as failing, and never fails the
rebuild."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from registry.api import Registry
from registry.protocol.commit import commit_local_directory, delete_directory
from registry.store import open_store
from registry.protocol.verify import read_manifest
from tests.conftest import proxied, run_cli
from tests.release_util import ledger_row, summary
from tests.support.faultproxy import FaultProxy
from tests.support.skewproxy import LaggingListing
from tests.test_index import checkpoint


def _publish(reg: Registry, version: str) -> None:
    reg.create_release("r1", 10, "tiny", version, ledger=[ledger_row()],
                       eval_summary=summary())


def _versions(reg: Registry) -> list[str]:
    return sorted(r["version"] for r in reg.ls("tiny"))


def test_a_lagging_listing_empties_nothing(proxy: FaultProxy, s3_bucket: str,
                                           tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/root"
    db = f"sqlite:///{tmp_path / 'index.db'}"
    lag = LaggingListing()
    with Registry(proxied(url, proxy), db=db) as reg:
        checkpoint(reg)
        _publish(reg, "1")
        proxy.rules.append(lag)
        assert reg.rebuild_index()["report"] == []  # the listings seen now
        proxy.rules.remove(lag)
        _publish(reg, "2")  # indexed at once; the old listings never show it
        delete_directory(open_store(url), "models/tiny/1")  # really gone
        lag.freeze()
        proxy.rules.append(lag)
        counts = reg.rebuild_index()
        assert _versions(reg) == ["2"]
        actions = {r["what"]: r["action"] for r in counts["report"]}
        assert actions == {"tiny@1": "removed", "tiny@2": "kept"}, counts["report"]
        assert "HEAD" in " ".join(r["reason"] for r in counts["report"])
        assert any(r.op == "ListObjects" for r in proxy.log)


def test_killed_publish_staging_and_claims_are_skipped(tmp_path: Path) -> None:
    """A local publish killed between its manifest and its rename leaves
    ``<version>.tmp-<id>/`` holding a valid MANIFEST.json, and its claim."""
    store_url = str(tmp_path / "store")
    db = f"sqlite:///{tmp_path / 'index.db'}"
    with Registry(store_url, db=db) as reg:
        checkpoint(reg)
        _publish(reg, "1")
    models = tmp_path / "store" / "models" / "tiny"
    shutil.copytree(models / "1", models / "k1.tmp-0123456789ab")
    (models / "k1.tmp-0123456789ab.claim").write_text("{}")
    r = run_cli("index", "rebuild", "--store", store_url, "--db", db)
    assert r.returncode == 0, r.stderr
    assert "skipped tiny@k1.tmp-0123456789ab: staging" in r.stdout, r.stdout
    r = run_cli("index", "rebuild", "--store", store_url, "--db", db, "--json")
    doc = json.loads(r.stdout)
    assert doc["releases"] == 1 and [x["action"] for x in doc["report"]] == ["skipped"]


def test_damaged_and_unindexable_releases_are_reported(durable_store_url: str,
                                                       tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'index.db'}"
    store = open_store(durable_store_url)
    with Registry(store, db=db) as reg:
        checkpoint(reg)
        for v in ("1", "2"):
            _publish(reg, v)
        # release 3: a consistent manifest over a summary holding 1e400 (a store
        # writer's, or an older registry's; publish refuses it now)
        local = tmp_path / "v3"
        local.mkdir()
        for rel in read_manifest(store, "models/tiny/2").files:
            (local / rel.path).parent.mkdir(parents=True, exist_ok=True)
            (local / rel.path).write_bytes(store.read_bytes(f"models/tiny/2/{rel.path}"))
        text = (local / "evals/summary.json").read_text()
        (local / "evals/summary.json").write_text(text.replace("0.9", "1e400", 1))
        meta = read_manifest(store, "models/tiny/2").meta
        commit_local_directory(store, local, "models/tiny/3", kind="release", model_id="tiny",
                               version="3", source=meta["source"])
        store.write_bytes("models/tiny/1/model.safetensors", b"short")  # damaged
        counts = reg.rebuild_index()
        assert _versions(reg) == ["2", "3"]
        assert [(r["action"], r["what"]) for r in counts["report"]] == [("damaged", "tiny@1")]
        assert "model.safetensors" in counts["report"][0]["reason"]
        assert [r["version"] for r in reg.passing("tiny")] == ["2"]  # 3 fails its evals gate
