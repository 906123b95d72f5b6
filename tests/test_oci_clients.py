"""Other OCI tools on both sides of a release (issue 45 items 3 and 6).

* oras-py (PyPI ``oras``, test lock) pulls a pushed release from Debian's
  ``docker-registry``: every file lands under its title with the release's sha256.
* olot (PyPI, test lock) packs a model directory as a ModelPack artifact (its
  ``weight.v1.tar`` layers of ``models/<file>``, the card as
  ``doc.v1.tar+gzip``); the artifact is copied to the registry and
  ``registry import`` releases it through the gates, and ``registry pull``
  places it as a directory. A tar layer with a link in it is refused.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from registry.errors import DocumentError
from registry.oci import mapping as M
from registry.oci.client import OciClient
from registry.oci.pull import pull_oci
from registry.oci.push import push
from registry.oci.ref import OciRef, parse_ref
from registry.store import open_store
from registry.protocol.verify import read_manifest
from tests.conftest import run_cli
from tests.hub_util import publish, tiny_bert
from tests.release_util import ledger_row, summary
from tests.support.forkclient import python_run
from tests.test_oci import _need, dist, files_of  # noqa: F401  (the module's registry)

ORAS_PULL = r'''
import json, sys, oras.client
c = oras.client.OrasClient(hostname=sys.argv[1], insecure=True)
files = c.pull(target=sys.argv[2], outdir=sys.argv[3])
print(json.dumps(sorted(files)))
'''


def _module(name: str) -> None:
    """``name`` importable; else a skip, or in CI (REGISTRY_REQUIRE_OCI=1) a failure."""
    import importlib.util

    _need(name if importlib.util.find_spec(name) else None, f"{name} (test lock)")


def test_oras_pulls_a_pushed_release(dist: Any, tmp_path: Path) -> None:
    _module("oras")
    url = str(tmp_path / "store")
    publish(url, tiny_bert(tmp_path, 1), "tiny", "1")
    ref = parse_ref(f"oci://{dist.host}/models/oras")
    with OciClient(ref, insecure=True) as c, open_store(url) as s:
        push(s, "tiny", "1", ref, c)
        manifest = read_manifest(s, "models/tiny/1")
    out = tmp_path / "oras"
    p = python_run([sys.executable, "-c", ORAS_PULL, dist.host, f"{dist.host}/models/oras:1",
                    str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    got = files_of(out)
    assert got == {e.path: e.sha256 for e in manifest.files}
    assert hashlib.sha256((out / "MANIFEST.json").read_bytes()).hexdigest() == manifest.digest


def _base_layout(d: Path) -> None:
    """A one-layer multi-arch image in an OCI layout: what olot adds to."""
    def blob(data: bytes) -> dict[str, Any]:
        h = hashlib.sha256(data).hexdigest()
        (d / "blobs/sha256").mkdir(parents=True, exist_ok=True)
        (d / "blobs/sha256" / h).write_bytes(data)
        return {"digest": f"sha256:{h}", "size": len(data)}

    buf = io.BytesIO()
    tarfile.open(fileobj=buf, mode="w").close()
    layer = blob(buf.getvalue())
    cfg = blob(json.dumps({"architecture": "amd64", "os": "linux", "history": [{"created_by": "b"}],
                           "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]}}).encode())
    man = blob(json.dumps({"schemaVersion": 2, "mediaType": M.OCI_MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      **cfg},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                       **layer}]}).encode())
    idx = blob(json.dumps({"schemaVersion": 2, "mediaType": M.OCI_INDEX, "manifests": [
        {"mediaType": M.OCI_MANIFEST, **man,
         "platform": {"architecture": "amd64", "os": "linux"}}]}).encode())
    (d / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (d / "index.json").write_text(json.dumps({"schemaVersion": 2, "mediaType": M.OCI_INDEX,
                                              "manifests": [{"mediaType": M.OCI_INDEX, **idx}]}))


def _copy_modelpack(layout: Path, c: OciClient, tag: str) -> str:
    """Copy the layout's ModelPack manifest and its blobs to ``c``'s repository."""
    root = json.loads((layout / "index.json").read_text())
    [desc] = [m for m in root["manifests"] if m.get("annotations", {}).get(
        "io.opendatahub.modelcar.manifest.type") == "modelpack"]
    data = (layout / "blobs/sha256" / desc["digest"][7:]).read_bytes()
    doc = json.loads(data)
    for d in [doc["config"], *doc["layers"]]:
        blob = (layout / "blobs/sha256" / d["digest"][7:]).read_bytes()
        c.push_blob(d["digest"][7:], d["size"], lambda b=blob: iter([b]))
    c.put_manifest(tag, data, M.OCI_MANIFEST)
    return str(desc["digest"])


def test_an_olot_modelpack_artifact_imports_and_pulls(dist: Any, tmp_path: Path) -> None:
    _module("olot")
    olot = shutil.which("olot", path=str(Path(sys.executable).parent))
    assert olot is not None, "the olot package installs an olot script beside python"
    src = tiny_bert(tmp_path, 4)
    card = tmp_path / "README.md"
    card.write_text("# tiny bert, packed by olot\n")
    layout = tmp_path / "layout"
    _base_layout(layout)
    p = subprocess.run([str(olot), "--add-modelpack", "-m", str(card), str(layout),
                        str(src / "config.json"), str(src / "model.safetensors")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    ref = parse_ref(f"oci://{dist.host}/olot/bert:v1")
    with OciClient(ref, insecure=True) as c:
        digest = _copy_modelpack(layout, c, "v1")
        out = tmp_path / "placed"
        res = pull_oci(c, ref, to=out, cache=tmp_path / "cache")
    want = {"config.json": src / "config.json", "model.safetensors": src / "model.safetensors",
            "README.md": card}
    assert files_of(out) == {k: hashlib.sha256(v.read_bytes()).hexdigest()
                             for k, v in want.items()}
    assert (res.model_id, res.version) == ("bert", "v1")
    # import: the gates of publish (ledger and evals given), then the store and index
    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row("wiki")]))
    (tmp_path / "evals.json").write_text(json.dumps(summary(0.9, 0.5)))
    store, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    common = ["--insecure", "--store", store, "--db", db, "--cache", str(tmp_path / "cache")]
    p = run_cli("import", str(ref), "--model-id", "bert", "--version", "1", *common)
    assert p.returncode == 2 and "--ledger" in p.stderr, p.stderr  # none in the artifact
    p = run_cli("import", str(ref), "--model-id", "bert", "--version", "1",
                "--ledger", str(tmp_path / "ledger.json"), "--evals",
                str(tmp_path / "evals.json"), "--json", *common)
    assert p.returncode == 0, p.stderr
    with open_store(store) as s:
        m = read_manifest(s, "models/bert/1")
    got = {e.path: e.sha256 for e in m.files}
    assert got["model.safetensors"] == hashlib.sha256(
        (src / "model.safetensors").read_bytes()).hexdigest()
    assert m.meta["source"] == {"uri": f"oci://{dist.host}/olot/bert@{digest}"}
    # a failing gate: nothing committed
    (tmp_path / "bad.json").write_text(json.dumps(summary(0.1, 0.5)))
    p = run_cli("import", str(ref), "--model-id", "bert", "--version", "2",
                "--ledger", str(tmp_path / "ledger.json"), "--evals",
                str(tmp_path / "bad.json"), *common)
    assert p.returncode == 1, p.stderr
    assert not (Path(store) / "models/bert/2").exists()


def test_a_tar_layer_with_a_link_or_an_escape_is_refused(dist: Any, tmp_path: Path) -> None:
    ref = parse_ref(f"oci://{dist.host}/olot/evil")
    for name, member in [("link", _member("models/config.json", link="/etc/passwd")),
                         ("escape", _member("../../outside.json"))]:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            tf.addfile(*member)
        tar = buf.getvalue()
        with OciClient(ref, insecure=True) as c:
            c.push_blob(hashlib.sha256(tar).hexdigest(), len(tar), lambda b=tar: iter([b]))
            cfg = b"{}"
            c.push_blob(hashlib.sha256(cfg).hexdigest(), 2, lambda b=cfg: iter([b]))
            doc = M.canonical({"schemaVersion": 2, "mediaType": M.OCI_MANIFEST,
                               "artifactType": M.MODEL_ARTIFACT,
                               "config": M.descriptor(M.MODEL_CONFIG, cfg),
                               "layers": [M.descriptor("application/vnd.cncf.model.weight.v1.tar",
                                                       tar)]})
            c.put_manifest(name, doc, M.OCI_MANIFEST)
            with pytest.raises(DocumentError):
                pull_oci(c, OciRef(ref.host, ref.repo, name), to=tmp_path / name,
                         cache=tmp_path / "cache")
        assert not (tmp_path / name).exists()
        assert not (tmp_path / "outside.json").exists()


def _member(name: str, *, link: str | None = None) -> tuple[tarfile.TarInfo, Any]:
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
        return info, None
    data = b'{"a": 1}'
    info.size = len(data)
    return info, io.BytesIO(data)
