"""Manifest rules: path safety, schema, canonical form, build from a directory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from registry.errors import ManifestError, UnsafePathError
from registry.protocol.manifest import FileEntry, Manifest, build_manifest, hash_file, parse_manifest

SHA = "ab" * 32


def doc(files: list[dict[str, object]], **extra: object) -> bytes:
    d: dict[str, object] = {"format": "tinyllm-manifest", "format_version": 1,
                            "kind": "checkpoint", "created_at": "2026-11-29T10:00:00Z",
                            "run_id": "r1", "step": 1, "files": files}
    d.update(extra)
    return json.dumps(d).encode()


@pytest.mark.parametrize(("path", "rule"), [
    ("../x", "'..' segment"),
    ("a/../../x", "'..' segment"),
    ("/etc/passwd", "absolute"),
    ("a\\b", "backslash"),
    ("a\x00b", "NUL"),
    ("a//b", "empty segment"),
    ("a/", "empty segment"),
    ("./a", "'.' segment"),
    ("", "non-empty"),
    ("C:/x", "absolute"),
])
def test_unsafe_paths_are_refused_when_reading(path: str, rule: str) -> None:
    with pytest.raises(ManifestError) as e:  # UnsafePathError, or the schema for ""
        parse_manifest(doc([{"path": path, "size": 1, "sha256": SHA}]), source="s/MANIFEST.json")
    assert "s/MANIFEST.json" in str(e.value) and rule in str(e.value)


def test_unsafe_paths_are_refused_when_building() -> None:
    with pytest.raises(UnsafePathError):
        Manifest.build("checkpoint", [FileEntry("../evil", 1, SHA)], run_id="r", step=1)


def test_duplicates_and_file_dir_clash_are_refused() -> None:
    with pytest.raises(UnsafePathError, match="listed twice"):
        parse_manifest(doc([{"path": "a", "size": 1, "sha256": SHA}] * 2), source="m")
    with pytest.raises(UnsafePathError, match="listed as a file"):
        parse_manifest(doc([{"path": "a", "size": 1, "sha256": SHA},
                            {"path": "a/b", "size": 1, "sha256": SHA}]), source="m")


@pytest.mark.parametrize(("data", "rule"), [
    (b"not json", "not valid JSON"),
    (b"\xff\xfe", "UTF-8"),
    (doc([{"path": "a", "size": -1, "sha256": SHA}]), "size"),
    (doc([{"path": "a", "size": 1, "sha256": "XYZ"}]), "sha256"),
    (doc([], kind="bundle"), "kind"),
    (doc([], format="other"), "format"),
    (doc([{"path": "b", "size": 1, "sha256": SHA}, {"path": "a", "size": 1, "sha256": SHA}]),
     "not sorted"),
])
def test_invalid_manifests_name_file_and_rule(data: bytes, rule: str) -> None:
    with pytest.raises(ManifestError) as e:
        parse_manifest(data, source="runs/r1/ckpt/step-000001/MANIFEST.json")
    msg = str(e.value)
    assert msg.startswith("runs/r1/ckpt/step-000001/MANIFEST.json: ")
    assert rule in msg


def test_canonical_round_trip_and_digest() -> None:
    m = Manifest.build("release", [FileEntry("z", 3, SHA), FileEntry("a/b", 0, SHA)],
                       model_id="m", version="1", source={"uri": "file:///x"})
    data = m.to_bytes()
    assert data.endswith(b"\n") and b" " not in data
    again = parse_manifest(data, source="x")
    assert again == m and again.to_bytes() == data
    assert m.digest == hashlib.sha256(data).hexdigest()
    assert [e.path for e in m.files] == ["a/b", "z"]


def test_build_manifest_hashes_every_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "model.safetensors").write_bytes(b"w" * 10_000_001)
    (tmp_path / "sub" / "x.json").write_bytes(b"{}")
    (tmp_path / "MANIFEST.json").write_bytes(b"old")
    m = build_manifest(tmp_path, "checkpoint", run_id="r", step=3)
    assert [(e.path, e.size) for e in m.files] == [("model.safetensors", 10_000_001),
                                                    ("sub/x.json", 2)]
    assert m.files[0].sha256 == hashlib.sha256(b"w" * 10_000_001).hexdigest()
    assert hash_file(tmp_path / "sub" / "x.json") == (2, hashlib.sha256(b"{}").hexdigest())


def test_build_refuses_backslash_file_names(tmp_path: Path) -> None:
    (tmp_path / "a\\b").write_bytes(b"1")
    with pytest.raises(UnsafePathError, match="backslash"):
        build_manifest(tmp_path, "checkpoint", run_id="r", step=1)
