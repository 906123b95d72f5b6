"""Bounded inputs (issue 30, item 4): a store writer's manifest, or another
local user's pull record, costs bounded memory and time -- refused with one
line naming the file and the limit, or parsed cheaply."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from registry.rules import limits, schemas
from registry.refs.aliases import set_alias
from registry.errors import DocumentError, ManifestError
from registry.protocol.manifest import MANIFEST, FileEntry, Manifest, _plain_entry, parse_manifest
from registry.store import Store, open_store
from registry.protocol.verify import read_manifest
from tests.test_cli_contract import _run as run_batch
from tests.test_signing import MODEL, model_dir, publish

SHA = hashlib.sha256(b"x").hexdigest()


def _manifest(n: int) -> bytes:
    files = [FileEntry(f"data/f{i:07d}.bin", i, SHA) for i in range(n)]
    return Manifest("release", tuple(files), "2026-01-01T00:00:00Z",
                    {"model_id": "m", "version": "1", "source": {"uri": "x"}}).to_bytes()


def test_an_oversized_manifest_is_refused_before_it_is_read_whole(
        store: Store, tmp_path: Path) -> None:
    publish(store, model_dir(tmp_path), "1", None)
    key = f"models/{MODEL}/1/{MANIFEST}"
    doc = json.loads(store.read_bytes(key))
    doc["metadata"] = {"pad": "x" * (limits.MAX_MANIFEST_BYTES + 10)}
    store.write_bytes(key, json.dumps(doc).encode())  # the store writer's 16 MiB manifest
    with pytest.raises(ManifestError, match="MANIFEST.json.*limit"):
        read_manifest(store, f"models/{MODEL}/1")
    if store.local_path("") is None:
        return
    argv = [["pull", f"{MODEL}@1", "--to", str(tmp_path / "out"), "--cache",
             str(tmp_path / "c"), "--store", store.url],
            ["verify", str(Path(str(store.local_path(f"models/{MODEL}/1"))))]]
    for want, (code, out, err) in zip((5, 1), run_batch(tmp_path, argv), strict=True):
        assert code == want and "limit" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_each_limit_is_read_when_used_not_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that sets REGISTRY_MAX_* after importing the registry (a
    notebook, a server reconfigured) is obeyed; unset or empty is the
    default; every limit is listed and an unknown one is an AttributeError."""
    names = [n for n in dir(limits) if n.startswith("MAX_")]
    assert len(names) == 12 and "MAX_TENSORS" in names and "MAX_OCI_MANIFEST_BYTES" in names
    default = limits.MAX_POINTER_BYTES
    assert default == 64 << 10
    monkeypatch.setenv("REGISTRY_MAX_POINTER_BYTES", "12")
    assert limits.MAX_POINTER_BYTES == 12
    monkeypatch.setenv("REGISTRY_MAX_POINTER_BYTES", "")
    assert limits.MAX_POINTER_BYTES == default
    monkeypatch.delenv("REGISTRY_MAX_POINTER_BYTES")
    assert limits.MAX_POINTER_BYTES == default
    with pytest.raises(AttributeError, match="MAX_NOTHING"):
        limits.MAX_NOTHING  # noqa: B018


def test_too_many_files_are_refused_before_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _manifest(11)
    monkeypatch.setenv("REGISTRY_MAX_MANIFEST_FILES", "10")
    with pytest.raises(ManifestError, match="lists 11 files, more than the limit of 10"):
        parse_manifest(data, source="m/MANIFEST.json")


def test_plain_entries_skip_jsonschema(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large manifest is cheap: jsonschema (about 1 ms an entry) sees none of
    its plain file entries; one bad entry is still its verdict and message."""
    seen: list[int] = []
    real = schemas.validate

    def spy(doc: Any, name: str, **kw: Any) -> None:
        seen.append(len(doc["files"]))
        real(doc, name, **kw)
    monkeypatch.setattr(schemas, "validate", spy)
    assert len(parse_manifest(_manifest(20_000), source="big").files) == 20_000
    assert seen == [0]
    doc = json.loads(_manifest(3))
    doc["files"][1]["sha256"] = "AB" * 32
    with pytest.raises(ManifestError, match=r"files\[1\]\.sha256"):  # its index in the file
        parse_manifest(json.dumps(doc).encode(), source="bad")


GOOD = {"path": "a", "size": 1, "sha256": SHA}
MUTANTS = [
    {**GOOD, "size": -1}, {**GOOD, "size": True}, {**GOOD, "size": 1.0}, {**GOOD, "path": ""},
    {**GOOD, "path": 3}, {**GOOD, "sha256": SHA.upper()}, {**GOOD, "sha256": SHA[:-1]},
    {**GOOD, "extra": 1}, {**GOOD, "blake3": "x"}, {**GOOD, "blake3": SHA},
    {**GOOD, "pieces": {"size": 64, "states": [SHA]}},
    {**GOOD, "pieces": {"size": 63, "states": [SHA]}},
    {**GOOD, "pieces": {"size": 64, "states": []}},
    {**GOOD, "pieces": {"size": 64, "states": [SHA], "x": 1}},
    {**GOOD, "pieces": {"size": 128, "states": ["z" * 64]}},
    {"path": "a", "size": 1}, [GOOD], GOOD,
]


@pytest.mark.parametrize("entry", MUTANTS)
def test_the_fast_entry_check_is_never_looser_than_the_schema(entry: Any) -> None:
    try:
        schemas.validate(entry, "manifest", path="e", defs="file")
        valid = True
    except DocumentError:
        valid = False
    if _plain_entry(entry):
        assert valid, entry


def test_pull_records_and_stamps_are_bounded(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.pull import records

    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x": "y" * 200}))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    monkeypatch.setenv("REGISTRY_MAX_RECORD_BYTES", "100")
    with pytest.raises(DocumentError, match="100-byte limit"):
        schemas.load_local_json(big, limits.MAX_RECORD_BYTES)
    assert records._read_json(big) is None  # a record it cannot use is absent, not a crash
    monkeypatch.setenv("REGISTRY_MAX_RECORD_BYTES", str(1 << 20))
    assert records._read_json(deep) is None


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5", " 12", "\u00b2", "9" * 5000,
                                   str((1 << 62) + 1), "9223372036854775807"])
def test_a_bad_limit_setting_is_one_line_exit_2(value: str, tmp_path: Path) -> None:
    """An operator's typo in a bound on hostile input is refused in one line
    (exit 2), never silently replaced by the default nor a traceback
    (int() of a non-ASCII digit, of 5000 digits, or a read of 2**63 bytes
    raised before)."""
    store = open_store(str(tmp_path / "s"))
    publish(store, model_dir(tmp_path), "1", None)
    set_alias(store, MODEL, "prod", "1")  # alias ls reads its pointer whole
    (code, out, err), = run_batch(tmp_path, [{"argv": ["alias", "ls", MODEL, "--store",
                                                         str(tmp_path / "s")],
                                               "env": {"REGISTRY_MAX_READ_BYTES": value}}])
    assert code == 2 and "Traceback" not in err, (code, err)
    assert err.startswith("error: REGISTRY_MAX_READ_BYTES=") and "2**62" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_generous_limit_costs_no_memory_up_front(tmp_path: Path) -> None:
    """A read is bounded by its limit, but memory follows the file: 2**62
    bytes allowed, an 11-byte pointer read (one f.read(limit + 1) reserved
    the whole limit, a MemoryError past the address space)."""
    store = open_store(str(tmp_path / "s"))
    store.write_bytes("p", b"hello world")
    assert store.read_bytes("p", limit=1 << 62) == b"hello world"
    with open(tmp_path / "s" / "p", "rb") as f:
        assert limits.read_at_most(f, 4) == b"hello"  # limit + 1: the caller sees "over"
