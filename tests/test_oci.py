"""Releases through a real OCI registry (issue 45 items 1-3, 6).

The registry is Debian's ``docker-registry`` (CNCF distribution 2.8, which has
no referrers API: signatures travel by the ``sha256-<hex>`` tag fallback),
started once for the module on a free loopback port with filesystem storage;
the attacks below rewrite that storage, as a registry operator (or anyone on
the wire) could. ``skopeo`` copies a pushed release to an OCI layout with
``--preserve-digests``. In CI (REGISTRY_REQUIRE_OCI=1) a missing binary fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from registry.errors import DocumentError, IntegrityError, SignatureError
from registry.trust.keys import generate
from registry.oci import mapping as M
from registry.oci.client import OciClient
from registry.oci.pull import pull_oci
from registry.oci.push import push
from registry.oci.ref import OciRef, parse_ref
from registry.store import open_store
from registry.trust import load_trust
from registry.protocol.verify import read_manifest
from tests.conftest import run_cli
from tests.hub_util import publish, tiny_bert
from tests.support.ociregistry import Distribution, registry_binary

MODEL = "tiny"


def _need(binary: str | None, what: str) -> None:
    if binary is None:
        if os.environ.get("REGISTRY_REQUIRE_OCI") == "1":
            pytest.fail(f"{what} is missing (REGISTRY_REQUIRE_OCI=1)")
        pytest.skip(f"{what} is not installed")


@pytest.fixture(scope="module")
def dist() -> Any:
    _need(registry_binary(), "docker-registry (Debian package docker-registry)")
    server = Distribution().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A local store with tiny@1 (signed by ``release``), tiny@2 and tiny@3
    (unsigned), alias prod -> 1, and a second store where the
    attacker's key signed tiny@1."""
    pytest.importorskip("model_signing")
    root = tmp_path_factory.mktemp("oci-world")
    (root / "keys").mkdir()
    keys = {n: generate(root / "keys" / f"{n}.pem", public_path=root / "keys" / f"{n}.pub")[:2]
            for n in ("release", "attacker")}
    url, evil = str(root / "store"), str(root / "evil")
    publish(url, tiny_bert(root, 1), MODEL, "1", sign_key=keys["release"][0])
    for v in ("2", "3"):
        publish(url, tiny_bert(root, int(v)), MODEL, v)
    publish(evil, tiny_bert(root, 9), MODEL, "1", sign_key=keys["attacker"][0])
    assert run_cli("alias", "set", MODEL, "prod", "1", "--store", url).returncode == 0
    return {"root": root, "url": url, "evil": evil, "keys": keys}


def client(dist: Distribution, repo: str) -> tuple[OciRef, OciClient]:
    ref = parse_ref(f"oci://{dist.host}/{repo}")
    return ref, OciClient(ref, insecure=True)


def files_of(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and p.name != "MANIFEST.json"}


def released(url: str, version: str) -> dict[str, str]:
    with open_store(url) as s:
        return {e.path: e.sha256 for e in read_manifest(s, f"models/{MODEL}/{version}").files}


def blob_file(dist: Distribution, hexd: str) -> Path:
    return Path(dist._dir) / "data/docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"


def trust_of(world: dict[str, Any]) -> Any:
    return load_trust([world["keys"]["release"][1]], None)


# -- the round trip -------------------------------------------------------------------


def test_push_maps_every_file_to_its_sha256_and_the_signature_to_a_fallback_referrer(
        dist: Distribution, world: dict[str, Any], tmp_path: Path) -> None:
    ref, c = client(dist, "models/roundtrip")
    with open_store(world["url"]) as s:
        first = push(s, MODEL, "1", ref, c)
        again = push(s, MODEL, "1", ref, c)
        manifest = read_manifest(s, f"models/{MODEL}/1")
    assert first.uploaded > 0 and first.signed and not first.referrers_api
    assert (again.uploaded, again.digest) == (0, first.digest)  # present: skipped, same digest
    data, media, hexd = c.get_manifest("1", accept=[M.OCI_MANIFEST])
    doc = json.loads(data)
    assert f"sha256:{hexd}" == first.digest and doc["artifactType"] == M.MODEL_ARTIFACT
    by_title = {d["annotations"][M.TITLE]: d for d in doc["layers"]}
    for e in manifest.files:
        if e.path == "model.sig":
            assert e.path not in by_title
            continue
        assert by_title[e.path]["digest"] == f"sha256:{e.sha256}"
        assert by_title[e.path]["size"] == e.size
    assert by_title["model.safetensors"]["mediaType"] == M.WEIGHT_RAW
    assert by_title["config.json"]["mediaType"] == M.WEIGHT_CONFIG_RAW
    assert by_title["MODEL_CARD.md"]["mediaType"] == M.DOC_RAW
    assert by_title["MANIFEST.json"]["mediaType"] == M.RELEASE_MANIFEST
    config = json.loads(c.read_blob(doc["config"]["digest"][7:], doc["config"]["size"],
                                    cap=1 << 20))
    assert config["config"]["architecture"] == "BertModel"
    assert config["config"]["format"] == "safetensors" and int(config["config"]["paramSize"]) > 0
    assert config["modelfs"]["diffIds"] == [d["digest"] for d in doc["layers"]]
    assert f"sha256-{hexd}" in c.tags()
    refs = c.referrers(first.digest)
    sig = manifest.entry("model.sig")
    assert sig is not None and len(refs) == 1 and refs[0]["artifactType"] == M.SIGSTORE_BUNDLE
    sdoc = json.loads(c.get_manifest(refs[0]["digest"], accept=[M.OCI_MANIFEST])[0])
    assert sdoc["subject"]["digest"] == first.digest
    assert sdoc["layers"][0]["digest"] == f"sha256:{sig.sha256}"

    out = tmp_path / "out"
    res = pull_oci(c, ref.with_tag("1"), to=out, cache=tmp_path / "cache",
                   trust=trust_of(world))
    assert res.signer is not None and (res.model_id, res.version) == (MODEL, "1")
    assert files_of(out) == released(world["url"], "1")


def test_cli_push_alias_and_pull_by_digest_from_s3_and_import(
        dist: Distribution, world: dict[str, Any], s3_bucket: str, tmp_path: Path) -> None:
    s3 = f"s3://{s3_bucket}/root"
    publish(s3, tiny_bert(world["root"], 2), MODEL, "2", sign_key=world["keys"]["release"][0])
    assert run_cli("alias", "set", MODEL, "prod", "2", "--store", s3).returncode == 0
    target = f"oci://{dist.host}/team/tiny"
    p = run_cli("push", f"{MODEL}@prod", target, "--tag-alias", "--insecure", "--json",
                "--store", s3)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["tags"] == ["2", "prod"] and doc["signed"]
    pub = str(world["keys"]["release"][1])
    out = tmp_path / "served"
    p = run_cli("pull", f"{target}@{doc['digest']}", "--to", str(out), "--insecure",
                "--trusted-key", pub, "--json", "--cache", str(tmp_path / "c"))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["signer"] and files_of(out) == released(s3, "2")
    # import into another (local) store and index: the same gates as publish
    other, db = str(tmp_path / "other"), f"sqlite:///{tmp_path / 'i.db'}"
    p = run_cli("import", f"{target}:prod", "--model-id", MODEL, "--version", "2",
                "--insecure", "--trusted-key", pub, "--store", other, "--db", db, "--json",
                "--cache", str(tmp_path / "c"))
    assert p.returncode == 0, p.stderr
    got, want = released(other, "2"), released(s3, "2")
    assert got["model.safetensors"] == want["model.safetensors"]
    assert got["model.sig"] == want["model.sig"]  # the same names: its signature carried
    p = run_cli("show", f"{MODEL}@2", "--store", other, "--db", db, "--json")
    assert p.returncode == 0, p.stderr
    # a wrong login option is one line, exit 2
    p = run_cli("push", f"{MODEL}@1", f"oci://{dist.host}/x", "--password-stdin",
                "--store", world["url"])
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    p = run_cli("push", f"{MODEL}@1", "oci://example.com/x", "--insecure",
                "--store", world["url"])
    assert p.returncode == 2 and "loopback" in p.stderr, p.stderr


def test_skopeo_copies_a_pushed_release_with_its_digests(
        dist: Distribution, world: dict[str, Any], tmp_path: Path) -> None:
    skopeo = shutil.which("skopeo")
    _need(skopeo, "skopeo (Debian package skopeo)")
    ref, c = client(dist, "models/skopeo")
    with open_store(world["url"]) as s:
        res = push(s, MODEL, "1", ref, c)
    layout = tmp_path / "layout"
    p = subprocess.run([str(skopeo), "copy", "--preserve-digests", "--src-tls-verify=false",
                        f"docker://{dist.host}/models/skopeo:1", f"oci:{layout}:1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    index = json.loads((layout / "index.json").read_text())
    assert index["manifests"][0]["digest"] == res.digest
    for e in released(world["url"], "1").values():
        if (layout / "blobs/sha256" / e).exists():
            continue
        assert e == released(world["url"], "1")["model.sig"], e  # only the referrer's


def test_chunked_uploads_and_cross_repository_mounts(
        dist: Distribution, world: dict[str, Any], tmp_path: Path) -> None:
    ref, c = client(dist, "chunks/a")
    with open_store(world["url"]) as s:
        first = push(s, MODEL, "2", ref, c, chunk_size=20_000)  # the weights in 6 PATCHes
        other, c2 = client(dist, "chunks/b")
        mounted = push(s, MODEL, "2", other, c2, mount_from="chunks/a")
    assert first.uploaded >= 5 and first.bytes_sent > 100_000
    assert mounted.mounted >= 5 and mounted.bytes_sent == 0 and mounted.digest == first.digest
    out = tmp_path / "out"
    pull_oci(c2, other.with_tag("2"), to=out, cache=tmp_path / "c")
    assert files_of(out) == released(world["url"], "2")


# -- refusals: each a clear error, nothing placed ---------------------------------------


def _pushed(dist: Distribution, world: dict[str, Any], repo: str,
            version: str = "1") -> tuple[OciRef, OciClient, Any]:
    ref, c = client(dist, repo)
    with open_store(world["url"]) as s:
        return ref, c, push(s, MODEL, version, ref, c)


def _weights_blob(world: dict[str, Any], version: str = "1") -> str:
    return released(world["url"], version)["model.safetensors"]


def test_a_blob_whose_bytes_differ_or_are_truncated_is_refused(
        dist: Distribution, world: dict[str, Any], tmp_path: Path) -> None:
    ref, c, _ = _pushed(dist, world, "attack/bytes", "2")
    f = blob_file(dist, _weights_blob(world, "2"))
    good = f.read_bytes()
    try:
        f.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])  # same size
        with pytest.raises(IntegrityError):
            pull_oci(c, ref.with_tag("2"), to=tmp_path / "a", cache=tmp_path / "ca")
        assert not (tmp_path / "a").exists()
        f.write_bytes(good[:-10])  # truncated
        with pytest.raises(IntegrityError):
            pull_oci(c, ref.with_tag("2"), to=tmp_path / "b", cache=tmp_path / "cb")
        assert not (tmp_path / "b").exists()
    finally:
        f.write_bytes(good)


def test_missing_and_forged_signature_referrers_are_refused(
        dist: Distribution, world: dict[str, Any], tmp_path: Path) -> None:
    ref, c, res = _pushed(dist, world, "attack/sig")
    trust = trust_of(world)
    tag = M.fallback_tag(res.digest)
    index, _, _ = c.get_manifest(tag, accept=[M.OCI_INDEX])
    # forged: the fallback index names a referrer carrying another bundle
    bogus = b'{"not": "a bundle"}'
    c.push_blob(hashlib.sha256(bogus).hexdigest(), len(bogus), lambda: iter([bogus]))
    forged = M.signature_manifest(M.descriptor(M.OCI_MANIFEST, b"x") | {"digest": res.digest},
                                  hashlib.sha256(bogus).hexdigest(), len(bogus), "now")
    desc = M.descriptor(M.OCI_MANIFEST, forged, artifactType=M.SIGSTORE_BUNDLE)
    c.put_manifest(desc["digest"], forged, M.OCI_MANIFEST)
    c.put_manifest(tag, M.merged_index([], desc), M.OCI_INDEX)
    with pytest.raises(SignatureError, match="other bundles"):
        pull_oci(c, ref.with_tag("1"), to=tmp_path / "f", cache=tmp_path / "c", trust=trust)
    assert not (tmp_path / "f").exists()
    # missing: no referrer at all
    r = c.request("DELETE", f"/v2/{ref.repo}/manifests/sha256:"
                  + hashlib.sha256(M.merged_index([], desc)).hexdigest(), ok=(202,))
    r.read()
    with pytest.raises(SignatureError, match="no signature referrer"):
        pull_oci(c, ref.with_tag("1"), to=tmp_path / "m", cache=tmp_path / "c", trust=trust)
    assert not (tmp_path / "m").exists()
    c.put_manifest(tag, index, M.OCI_INDEX)  # restored: it pulls again
    pull_oci(c, ref.with_tag("1"), to=tmp_path / "ok", cache=tmp_path / "c", trust=trust)
    # re-signed by the attacker's key and pushed over the tag: refused
    with open_store(world["evil"]) as s:
        push(s, MODEL, "1", ref, c)
    with pytest.raises(SignatureError):
        pull_oci(c, ref.with_tag("1"), to=tmp_path / "e", cache=tmp_path / "c", trust=trust)
    assert not (tmp_path / "e").exists()
    # an unsigned release under trust
    ref3, c3, _ = _pushed(dist, world, "attack/unsigned", "3")
    with pytest.raises(SignatureError, match="unsigned"):
        pull_oci(c3, ref3.with_tag("3"), to=tmp_path / "u", cache=tmp_path / "c", trust=trust)


def test_a_tag_moved_mid_pull_does_not_mix_artifacts(
        dist: Distribution, world: dict[str, Any], tmp_path: Path) -> None:
    ref, c, _ = _pushed(dist, world, "attack/moved")
    moved = []

    def move_tag(_n: int) -> None:
        if not moved:
            moved.append(1)
            with open_store(world["url"]) as s:
                push(s, MODEL, "2", ref.with_tag("1"), c)  # tag 1 now names version 2

    out = tmp_path / "out"
    pull_oci(c, ref.with_tag("1"), to=out, cache=tmp_path / "c", progress=move_tag)
    assert moved and files_of(out) == released(world["url"], "1")
    assert c.get_manifest("1", accept=[M.OCI_MANIFEST])[2] != ""  # it did move


def test_oversized_and_foreign_manifests_are_refused(
        dist: Distribution, world: dict[str, Any], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ref, c, _ = _pushed(dist, world, "attack/docs")
    monkeypatch.setenv("REGISTRY_MAX_OCI_MANIFEST_BYTES", "200")
    with pytest.raises(DocumentError, match="larger than 200"):
        pull_oci(c, ref.with_tag("1"), to=tmp_path / "a", cache=tmp_path / "c")
    monkeypatch.delenv("REGISTRY_MAX_OCI_MANIFEST_BYTES")
    # an image (not a model) and a model artifact with a gzip layer
    cfg = b'{"architecture":"amd64","os":"linux"}'
    c.push_blob(hashlib.sha256(cfg).hexdigest(), len(cfg), lambda: iter([cfg]))
    layer = M.descriptor("application/vnd.oci.image.layer.v1.tar+gzip", cfg)
    image = M.canonical({"schemaVersion": 2, "mediaType": M.OCI_MANIFEST,
                         "config": M.descriptor("application/vnd.oci.image.config.v1+json",
                                                cfg), "layers": [layer]})
    c.put_manifest("image", image, M.OCI_MANIFEST)
    with pytest.raises(DocumentError, match="not a model artifact"):
        pull_oci(c, ref.with_tag("image"), to=tmp_path / "b", cache=tmp_path / "c")
    gz = M.canonical({"schemaVersion": 2, "mediaType": M.OCI_MANIFEST,
                      "artifactType": M.MODEL_ARTIFACT,
                      "config": M.descriptor(M.MODEL_CONFIG, cfg),
                      "layers": [layer | {"annotations": {M.TITLE: "x"}}]})
    c.put_manifest("gz", gz, M.OCI_MANIFEST)
    with pytest.raises(DocumentError, match="not one this registry reads"):
        pull_oci(c, ref.with_tag("gz"), to=tmp_path / "g", cache=tmp_path / "c")
    assert not any((tmp_path / n).exists() for n in "abg")
    # the CLI: one line, exit 5 (DocumentError)
    p = run_cli("pull", f"oci://{dist.host}/{ref.repo}:gz", "--insecure", "--to",
                str(tmp_path / "cli"))
    assert p.returncode == 5 and p.stderr.count("\n") == 1, p.stderr
