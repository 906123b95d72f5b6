"""``registry serve``'s OCI read API (issue 45 item 4), driven by real OCI clients.

A real ``registry serve`` process over a local store and one over S3 (moto);
skopeo inspects and copies from it with ``--preserve-digests``, oras-py pulls
from it, and ``registry pull oci://`` pulls from it with trusted keys (the
signature found by the referrers API this time). Refusals carry the spec's
error JSON: a yanked release, an unsigned one under ``--trusted-keys``, a
wrong token, a blob no served release has.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from registry.trust.keys import generate
from registry.oci import mapping as M
from registry.oci.auth import Credentials
from registry.oci.client import OciClient
from registry.oci.pull import pull_oci
from registry.oci.push import push
from registry.oci.ref import parse_ref
from registry.store import open_store
from registry.trust import load_trust
from registry.protocol.verify import read_manifest
from tests.conftest import run_cli
from tests.hub_util import publish, tiny_bert
from tests.support.forkclient import python_run
from tests.test_oci import _need, dist, files_of  # noqa: F401  (the module's registry)
from tests.test_oci_clients import ORAS_PULL, _module
from tests.web_util import serve


def _get(url: str, **headers: str) -> tuple[int, Any, bytes]:
    """status, headers (case-insensitive), body."""
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("model_signing")
    root = tmp_path_factory.mktemp("oci-serve")
    (root / "keys").mkdir()
    priv, pub, _ = generate(root / "keys" / "k.pem", public_path=root / "keys" / "k.pub")
    url = str(root / "store")
    publish(url, tiny_bert(root, 1), "tiny", "1", sign_key=priv)
    publish(url, tiny_bert(root, 2), "tiny", "2")
    publish(url, tiny_bert(root, 3), "tiny", "3")
    assert run_cli("alias", "set", "tiny", "prod", "1", "--store", url).returncode == 0
    assert run_cli("yank", "tiny@2", "--reason", "bad evals", "--store", url).returncode == 0
    return {"root": root, "url": url, "priv": priv, "pub": pub,
            "db": f"sqlite:///{root / 'i.db'}"}


def test_oci_clients_read_releases_from_serve(site: dict[str, Any], dist: Any,
                                              tmp_path: Path) -> None:
    url = site["url"]
    with serve(url, site["db"]) as base:
        host = base.removeprefix("http://")
        status, headers, body = _get(f"{base}/v2/")
        assert status == 200 and headers["Docker-Distribution-Api-Version"] == "registry/2.0"
        status, _, body = _get(f"{base}/v2/registry/tiny/tags/list")
        assert status == 200 and {"1", "2", "3", "prod"} <= set(json.loads(body)["tags"])
        # the same digest as a push of the release to a real registry
        ref = parse_ref(f"oci://{dist.host}/served/tiny")
        with OciClient(ref, insecure=True) as c, open_store(url) as s:
            pushed = push(s, "tiny", "1", ref, c)
            manifest = read_manifest(s, "models/tiny/1")
        status, headers, body = _get(f"{base}/v2/registry/tiny/manifests/prod",
                                     Accept=M.OCI_MANIFEST)
        assert status == 200 and headers["Docker-Content-Digest"] == pushed.digest
        assert "sha256:" + hashlib.sha256(body).hexdigest() == pushed.digest
        weights = manifest.entry("model.safetensors")
        assert weights is not None
        status, headers, body = _get(f"{base}/v2/registry/tiny/blobs/sha256:{weights.sha256}",
                                     Range="bytes=10-99")
        assert status == 206 and body == (Path(url) / "models/tiny/1/model.safetensors"
                                          ).read_bytes()[10:100]
        # the signature through the referrers API, checked by a trusted pull
        status, _, body = _get(f"{base}/v2/registry/tiny/referrers/{pushed.digest}")
        assert status == 200 and len(json.loads(body)["manifests"]) == 1
        sref = parse_ref(f"oci://{host}/registry/tiny:prod")
        with OciClient(sref, insecure=True) as c:
            res = pull_oci(c, sref, to=tmp_path / "pulled", cache=tmp_path / "c",
                           trust=load_trust([site["pub"]], None))
        assert res.signer and files_of(tmp_path / "pulled") == {
            e.path: e.sha256 for e in manifest.files}
        # a yanked release and an unknown blob: the spec's errors
        status, _, body = _get(f"{base}/v2/registry/tiny/manifests/2")
        assert status == 403 and json.loads(body)["errors"][0]["code"] == "DENIED"
        status, _, body = _get(f"{base}/v2/registry/tiny/blobs/sha256:{'0' * 64}")
        assert status == 404 and json.loads(body)["errors"][0]["code"] == "BLOB_UNKNOWN"
        status, _, body = _get(f"{base}/v2/registry/nope/manifests/1")
        assert status == 404 and json.loads(body)["errors"][0]["code"] == "NAME_UNKNOWN"
        # skopeo: inspect, and copy with the digests kept
        skopeo = shutil.which("skopeo")
        _need(skopeo, "skopeo (Debian package skopeo)")
        p = subprocess.run([str(skopeo), "inspect", "--raw", "--tls-verify=false",
                            f"docker://{host}/registry/tiny:1"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "sha256:" + hashlib.sha256(p.stdout.encode()).hexdigest() == pushed.digest
        layout = tmp_path / "layout"
        p = subprocess.run([str(skopeo), "copy", "--preserve-digests", "--src-tls-verify=false",
                            f"docker://{host}/registry/tiny:1", f"oci:{layout}:1"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        blob = layout / "blobs/sha256" / weights.sha256
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == weights.sha256
        # oras-py
        _module("oras")
        p = python_run([sys.executable, "-c", ORAS_PULL, host, f"{host}/registry/tiny:1",
                        str(tmp_path / "oras")], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        assert files_of(tmp_path / "oras") == {
            e.path: e.sha256 for e in manifest.files if e.path != "model.sig"}


def test_serve_refuses_unsigned_and_tampered_and_needs_its_token(
        site: dict[str, Any], s3_bucket: str, tmp_path: Path) -> None:
    s3 = f"s3://{s3_bucket}/root"
    publish(s3, tiny_bert(site["root"], 1), "tiny", "1", sign_key=site["priv"])
    publish(s3, tiny_bert(site["root"], 3), "tiny", "3")
    keys = tmp_path / "trusted"
    keys.mkdir()
    shutil.copy(site["pub"], keys / "k.pub")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with serve(s3, f"sqlite:///{tmp_path / 'i.db'}", "--trusted-keys", str(keys),
               "--token-file", str(token)) as base:
        host = base.removeprefix("http://")
        status, headers, _ = _get(f"{base}/v2/registry/tiny/manifests/1")
        assert status == 401 and "Basic" in headers["WWW-Authenticate"]
        auth = {"Authorization": "Bearer s3cret"}
        status, _, body = _get(f"{base}/v2/registry/tiny/manifests/3", **auth)
        assert status == 403 and json.loads(body)["errors"][0]["code"] == "DENIED"
        assert "signature" in json.loads(body)["errors"][0]["message"]
        # a client logging in with the token as password (Basic, after the 401)
        ref = parse_ref(f"oci://{host}/registry/tiny:1")
        with OciClient(ref, insecure=True, credentials=Credentials("any", "s3cret")) as c:
            res = pull_oci(c, ref, to=tmp_path / "ok", cache=tmp_path / "c",
                           trust=load_trust([site["pub"]], None))
        assert res.signer
        # the S3 object rewritten: the first piece fails, 409 and nothing sent
        import boto3

        s3c = boto3.client("s3")
        key = "root/models/tiny/1/model.safetensors"
        good = s3c.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
        bad = bytes([good[0] ^ 1]) + good[1:]
        s3c.put_object(Bucket=s3_bucket, Key=key, Body=bad)
        digest = hashlib.sha256(good).hexdigest()
        status, _, body = _get(f"{base}/v2/registry/tiny/blobs/sha256:{digest}", **auth)
        assert status == 409 and json.loads(body)["errors"][0]["code"] == "DIGEST_INVALID"
