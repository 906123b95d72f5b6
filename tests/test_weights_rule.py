"""The weights rule of a model directory (issue 26, item 1; registry.formats.weights).

A directory transformers' ``save_pretrained(max_shard_size=...)`` wrote (a
tiny random Llama in 6 shards) is the starting point; each test breaks one
rule the way real directories break it (a stale shard beside a newer save, a
hand-edited index, a second weights form) and publishes it, from local disk
and from S3, through the API and the CLI. Each refusal names the file and the
rule, exits 5 from the CLI in one line, and commits nothing: no byte lands
under ``models/``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from registry.errors import DocumentError
from registry.release import ModelRelease
from registry.store import open_store
from registry.formats.weights import INDEX, SINGLE, load_weights
from tests.conftest import require_engines, run_cli
from tests.release_util import ledger_row, summary
from tests.shard_util import (
    copy_model,
    index_of,
    read_shard,
    shards_of,
    tiny_llama,
    upload_dir,
    write_index,
    write_shard,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_engines("torch", "transformers")
    return tiny_llama(tmp_path_factory.mktemp("llama") / "src")


def _missing_shard(d: Path) -> tuple[str, str]:
    shard = shards_of(d)[2]
    (d / shard).unlink()
    return shard, f"missing: {INDEX} names it"


def _stale_shard(d: Path) -> tuple[str, str]:
    # an older save with more shards left its tail behind
    shutil.copy(d / shards_of(d)[0], d / "model-00007-of-00007.safetensors")
    return "model-00007-of-00007.safetensors", "weight_map does not name"


def _stale_shard_beside_single(d: Path) -> tuple[str, str]:
    # a re-save as one file beside the shards of an older save, index removed
    first = shards_of(d)[0]
    (d / INDEX).unlink()
    for shard in sorted(p.name for p in d.glob("model-*.safetensors"))[1:]:
        (d / shard).unlink()
    shutil.copy(d / first, d / SINGLE)
    return first, "a second weights file beside model.safetensors"


def _tensor_in_two_shards(d: Path) -> tuple[str, str]:
    a, b = shards_of(d)[:2]
    ta, ma = read_shard(d / a)
    tb, _ = read_shard(d / b)
    name = next(iter(tb))
    ta[name] = tb[name]
    write_shard(d / a, ta, ma)
    return a if a < b else b, f"tensor {name!r} is also in"


def _tensor_in_other_shard(d: Path) -> tuple[str, str]:
    doc = index_of(d)
    a, b = shards_of(d)[:2]
    name = next(t for t, s in doc["weight_map"].items() if s == b)
    doc["weight_map"][name] = a
    write_index(d, doc)
    return b, f"tensor {name!r} is here, but the index maps it to {a}"


def _tensor_unnamed(d: Path) -> tuple[str, str]:
    doc = index_of(d)
    counts: dict[str, int] = {}
    for shard in doc["weight_map"].values():
        counts[shard] = counts.get(shard, 0) + 1
    name, shard = next((t, s) for t, s in sorted(doc["weight_map"].items()) if counts[s] > 1)
    del doc["weight_map"][name]
    write_index(d, doc)
    return shard, f"tensor {name!r} is here, but the index's weight_map does not name it"


def _tensor_nowhere(d: Path) -> tuple[str, str]:
    doc = index_of(d)
    doc["weight_map"]["model.extra.weight"] = shards_of(d)[0]
    write_index(d, doc)
    return INDEX, "weight_map maps tensor 'model.extra.weight'"


def _total_size(d: Path) -> tuple[str, str]:
    doc = index_of(d)
    doc["metadata"]["total_size"] += 4
    write_index(d, doc)
    return INDEX, "metadata.total_size is"


def _both_forms(d: Path) -> tuple[str, str]:
    shutil.copy(d / shards_of(d)[0], d / SINGLE)
    return INDEX, "one form of weights"


def _bad_shard_header(d: Path) -> tuple[str, str]:
    shard = shards_of(d)[1]
    data = bytearray((d / shard).read_bytes())
    data[:8] = (200_000_000).to_bytes(8, "little")
    (d / shard).write_bytes(bytes(data) + b" " * 0)
    return shard, "header length 200000000 bytes exceeds"


def _bad_shard_offsets(d: Path) -> tuple[str, str]:
    shard = shards_of(d)[3]
    with open(d / shard, "ab") as f:
        f.write(b"\0" * 8)
    return shard, "has trailing bytes"


def _traversal(d: Path) -> tuple[str, str]:
    doc = index_of(d)
    name = next(iter(doc["weight_map"]))
    doc["weight_map"][name] = "../outside.safetensors"
    write_index(d, doc)
    return INDEX, "a shard is a *.safetensors file beside the index"


def _index_not_json(d: Path) -> tuple[str, str]:
    (d / INDEX).write_text('{"weight_map": {"a": "b.safetensors"}, "weight_map": {}}')
    return INDEX, "has the key 'weight_map' twice"


BREAKS: dict[str, Callable[[Path], tuple[str, str]]] = {
    "missing shard": _missing_shard,
    "stale shard": _stale_shard,
    "stale shard beside the single file": _stale_shard_beside_single,
    "tensor in two shards": _tensor_in_two_shards,
    "tensor in a shard the index does not say": _tensor_in_other_shard,
    "tensor the index does not name": _tensor_unnamed,
    "index names a tensor no shard holds": _tensor_nowhere,
    "total_size disagrees": _total_size,
    "both forms": _both_forms,
    "shard header over 100 MB": _bad_shard_header,
    "shard offsets": _bad_shard_offsets,
    "shard outside the directory": _traversal,
    "index with a duplicate key": _index_not_json,
}


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("case", sorted(BREAKS))
def test_broken_directory_is_refused(case: str, where: str, saved: Path, tmp_path: Path,
                                     request: pytest.FixtureRequest) -> None:
    d = copy_model(saved, tmp_path / "model")
    culprit, rule = BREAKS[case](d)
    source = str(d)
    if where == "s3":
        source = upload_dir(d, request.getfixturevalue("s3_bucket"), "exports/llama")
    store = tmp_path / "store"
    with pytest.raises(DocumentError) as err:
        ModelRelease(str(store)).publish(source, "llama", "1", ledger=[ledger_row()],
                                         eval_summary=summary())
    assert f"{source}/{culprit}" in str(err.value) and rule in str(err.value), str(err.value)
    assert not (store / "models").exists() or not any((store / "models").rglob("*"))


@pytest.mark.parametrize("case", ["stale shard", "tensor in a shard the index does not say",
                                  "total_size disagrees", "both forms"])
def test_cli_refusal_is_one_line_exit_5(case: str, saved: Path, tmp_path: Path,
                                        s3_bucket: str) -> None:
    d = copy_model(saved, tmp_path / "model")
    culprit, rule = BREAKS[case](d)
    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "evals.json").write_text(json.dumps(summary()))
    url = f"s3://{s3_bucket}/reg"
    p = run_cli("publish", str(d), "--model-id", "llama", "--version", "1", "--ledger",
                str(tmp_path / "ledger.json"), "--evals", str(tmp_path / "evals.json"),
                "--store", url)
    assert p.returncode == 5, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"{d}/{culprit}" in p.stderr and rule in p.stderr, p.stderr
    assert open_store(url).walk_files("models") == {}


def test_the_saved_directory_is_accepted(saved: Path) -> None:
    """The rule accepts what transformers writes: 6 shards, total_size exact."""
    weights = load_weights(open_store(str(saved)))
    doc = index_of(saved)
    assert weights.sharded and len(weights.shards) == len(shards_of(saved)) >= 4
    assert weights.total_size == doc["metadata"]["total_size"]
    assert weights.parameter_count == doc["metadata"]["total_parameters"]
    assert set(weights.tensors) == set(doc["weight_map"])
    assert weights.files == (INDEX, *shards_of(saved))
