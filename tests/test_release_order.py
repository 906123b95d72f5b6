""""Latest" is the store's order, not a publisher's clock (issue 31 item 2):
each release's commit takes the next number of its model's counter
(``models/<model_id>/.sequence``, compare-and-swap) and records it in its
manifest; ``ls``, ``query --latest``, the web page and the index order by it,
also after ``index rebuild``, on local disk and S3."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from registry.api import Registry
from registry.index.browse import model_page
from registry.protocol.sequence import counter_key, next_sequence
from registry.store import Store, open_store
from registry.protocol.verify import read_manifest
from tests.conftest import run_cli
from tests.release_util import ledger_row, summary
from tests.test_index import checkpoint


def _publish(reg: Registry, version: str) -> None:
    reg.create_release("r1", 10, "tiny", version, ledger=[ledger_row()],
                       eval_summary=summary())


def test_a_publisher_an_hour_behind_is_still_the_latest(
        durable_store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = f"sqlite:///{tmp_path / 'index.db'}"
    with Registry(durable_store_url, db=db) as reg:
        checkpoint(reg)
        _publish(reg, "a")
        with monkeypatch.context() as mp:  # this host's clock is years behind
            mp.setattr("registry.protocol.manifest.utc_now", lambda: "2020-01-01T00:00:00.000000Z")
            _publish(reg, "b")
        store = reg.store
        assert [read_manifest(store, f"models/tiny/{v}").meta["metadata"]["sequence"]
                for v in "ab"] == ["1", "2"]
        assert store.read_bytes(counter_key("tiny")) == b"2\n"

        def answers() -> list[object]:
            page = reg.index.read(lambda s: model_page(s, "tiny", size=10))
            return [reg.passing("tiny", latest=True)[0]["version"],
                    [r["version"] for r in reg.ls("tiny")], reg.ls()[0]["newest"],
                    [r["version"] for r in page["page"].rows]]

        assert answers() == ["b", ["b", "a"], "b", ["b", "a"]]
        reg.rebuild_index()
        assert answers() == ["b", ["b", "a"], "b", ["b", "a"]]
    r = run_cli("query", "tiny", "--passing", "--latest", "--json", "--db", db, "--store",
                durable_store_url)
    assert r.returncode == 0 and json.loads(r.stdout)[0]["version"] == "b", r.stderr


def test_racing_takers_never_share_a_number(store: Store) -> None:
    store.ensure_root()
    got: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(5):
            n = next_sequence(store, "m")
            with lock:
                got.append(n)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 21))


def test_a_legacy_store_is_numbered_by_its_old_order(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Releases committed before the counter (no sequence in their manifests)
    are numbered by (created_at, version) on rebuild, without rewriting them;
    the first counter starts after them."""
    store_url = str(tmp_path / "store")
    db = f"sqlite:///{tmp_path / 'index.db'}"
    with Registry(store_url, db=db) as reg, monkeypatch.context() as mp:
        mp.setattr("registry.protocol.sequence.next_sequence", lambda *a, **k: 0)
        checkpoint(reg)
        for v, day in (("old2", "03"), ("old1", "01")):
            mp.setattr("registry.protocol.manifest.utc_now",
                       lambda day=day: f"2026-01-{day}T00:00:00.000000Z")
            _publish(reg, v)
    store = open_store(store_url)
    for v in ("old1", "old2"):  # strip the numbers: what an older registry wrote
        key = f"models/tiny/{v}/MANIFEST.json"
        doc = json.loads(store.read_bytes(key))
        doc.pop("metadata")
        store.write_bytes(key, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    before = {v: store.read_bytes(f"models/tiny/{v}/MANIFEST.json") for v in ("old1", "old2")}
    with Registry(store_url, db=db) as reg:
        reg.rebuild_index()
        assert [r["version"] for r in reg.ls("tiny")] == ["old2", "old1"]
        _publish(reg, "new")
        assert [r["version"] for r in reg.ls("tiny")] == ["new", "old2", "old1"]
        assert store.read_bytes(counter_key("tiny")) == b"3\n"
        reg.rebuild_index()
        assert [r["version"] for r in reg.ls("tiny")] == ["new", "old2", "old1"]
    assert before == {v: store.read_bytes(f"models/tiny/{v}/MANIFEST.json")
                      for v in ("old1", "old2")}
