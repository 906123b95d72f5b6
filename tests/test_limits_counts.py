"""Count limits and small-object limits (issue 30, item 4): a store writer's
document costs memory bounded by a count of values, not only by its bytes;
a pointer or alias the writer inflated to megabytes is refused unread; a
safetensors header or shard index listing millions of tensors is refused
before it is parsed. Each refusal is one line naming the object and the
limit, on every backend, nothing committed."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import pytest

from registry.rules import limits, schemas
from registry.errors import DocumentError, RegistryError, SafetensorsError
from registry.protocol.layout import alias_key
from registry.protocol.pointer import read_pointer
from registry.formats.safetensors_io import read_header
from registry.store import Store
from registry.formats.weights import read_index
from tests.test_cli_contract import _run as run_batch
from tests.test_signing import MODEL, gate_files, model_dir, publish


def test_json_values_are_counted_before_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    hostile = b"[" + b"{}," * 999 + b"{}]"  # 1,001 values in 3 kB
    monkeypatch.setenv("REGISTRY_MAX_JSON_VALUES", "1000")
    calls: list[int] = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda *a, **k: calls.append(1) or real(*a, **k))
    with pytest.raises(DocumentError, match=r"ledger\.json: more than 1000 JSON values"):
        schemas.load_json(hostile, path="ledger.json")
    assert not calls  # refused before one object was built
    # commas, brackets and quotes inside strings are not values
    fine = json.dumps({"text": ",[{" * 5000 + '\\"' * 100}).encode()
    assert schemas.load_json(fine, path="card.json")["text"].startswith(",[{")


def test_the_count_is_an_upper_bound_never_below_the_truth() -> None:
    docs: list[object] = [[], {}, [1, [2, [3]]], {"a": [1, 2, {"b": None}], "c": "x,y"},
                          ["\\", '"', "\\\"", "{", "]"], [[[]]] * 7, "s", 0]
    for doc in docs:
        data = json.dumps(doc).encode()

        def count(v: object) -> int:
            if isinstance(v, dict):
                return 1 + sum(1 + count(x) for x in v.values())
            if isinstance(v, list):
                return 1 + sum(count(x) for x in v)
            return 1
        assert limits.json_values_at_most(data) >= count(doc) - _keys(doc), (doc, data)


def _keys(doc: object) -> int:
    if isinstance(doc, dict):
        return len(doc) + sum(_keys(v) for v in doc.values())
    if isinstance(doc, list):
        return sum(_keys(v) for v in doc)
    return 0


def _header(n: int) -> bytes:
    tensors = {f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
               for i in range(n)}
    head = json.dumps(tensors).encode()
    return struct.pack("<Q", len(head)) + head + b"\0" * (4 * n)


def test_a_header_of_too_many_tensors_is_refused_before_parsing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_MAX_TENSORS", "50")
    data = _header(51)
    with pytest.raises(SafetensorsError, match="more than 50 tensors"):
        read_header(io.BytesIO(data), path="w.safetensors", file_size=len(data))
    ok = _header(50)
    assert len(read_header(io.BytesIO(ok), path="w.safetensors", file_size=len(ok)).tensors) == 50


def test_an_index_of_too_many_tensors_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_MAX_TENSORS", "100")
    wmap = {f"t{i}": "model-00001-of-00001.safetensors" for i in range(1201)}
    doc = json.dumps({"metadata": {"total_size": 4}, "weight_map": wmap}).encode()
    with pytest.raises(DocumentError, match="more than 100 tensors"):
        read_index(doc, path="model.safetensors.index.json")


def test_an_inflated_pointer_is_refused_unread_on_every_backend(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    publish(store, model_dir(tmp_path), "1", None)
    key = alias_key(MODEL, "prod")
    store.write_bytes(key, b"1" + b" " * (limits.MAX_POINTER_BYTES + 1))
    reads: list[int | None] = []
    real = store.read_bytes

    def spy(k: str, *, limit: int | None = None) -> bytes:
        reads.append(limit)
        return real(k, limit=limit)
    monkeypatch.setattr(store, "read_bytes", spy)
    with pytest.raises(RegistryError, match="limit"):
        read_pointer(store, key)
    assert reads == [limits.MAX_POINTER_BYTES]


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_cli_refuses_a_shard_with_too_many_tensors_and_commits_nothing(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import make_store_url

    url = make_store_url(kind, request, tmp_path)
    src = model_dir(tmp_path)
    (src / "model.safetensors").write_bytes(_header(40))
    monkeypatch.setenv("REGISTRY_MAX_TENSORS", "30")
    (code, out, err), = run_batch(tmp_path, [["publish", str(src), "--model-id", MODEL,
                                              "--version", "1", "--store", url,
                                              "--db", f"sqlite:///{tmp_path}/i.db",
                                              *gate_files(tmp_path)]])
    assert code != 0 and "more than 30 tensors" in err, (code, out, err)
    assert len(err.strip().splitlines()) == 1, err
    from registry.store import open_store
    assert not open_store(url).exists(f"models/{MODEL}/1/MANIFEST.json")
