"""The verifying mirror, pulls through it, and offline pulls (issue 28, items 3, 4, 6, 7).

The mirror fronts the session's moto S3 server through the fault proxy, whose
log of requests is the real count of what the bucket served.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import free_port, run_cli
from tests.hub_util import (
    PIECE,
    hub_client,
    index_db,
    publish,
    release_files,
    srcs,
)
from tests.support.faultproxy import FaultProxy
from tests.web_util import serve
from tests.support.forkclient import python_run

REPO_ID = "registry/tiny"


def _fill(url: str, srcs: dict[str, Path]) -> None:
    for v, src in srcs.items():
        publish(url, src, "tiny", v)
    assert run_cli("alias", "set", "tiny", "prod", "1", "--store", url).returncode == 0


def bytes_read(proxy: FaultProxy, key_suffix: str) -> list[tuple[int, int | None]]:
    """(start, end inclusive or None) of every GetObject of a key ending in ``key_suffix``."""
    out = []
    for r in list(proxy.log):
        if r.op == "GetObject" and r.key.endswith(key_suffix):
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", r.headers.get("Range", r.headers.get(
                "range", "")) or "")
            out.append((int(m.group(1)), int(m.group(2)) if m and m.group(2) else None)
                       if m else (0, None))
    return out


def total(spans: list[tuple[int, int | None]], size: int) -> int:
    return sum(min(size - 1, b if b is not None else size - 1) - a + 1 for a, b in spans)


def test_eight_hosts_through_one_mirror_read_each_store_byte_once(
        s3_bucket: str, proxy: FaultProxy, srcs: dict[str, Path], tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/root"
    _fill(url, srcs)
    files = release_files(url, "tiny", "1")
    size = (srcs["1"] / "model.safetensors").stat().st_size
    proxy.reset()
    mirror = tmp_path / "mirror"
    with serve(url, index_db(tmp_path), "--mirror-cache", str(mirror),
               env={"AWS_ENDPOINT_URL": proxy.endpoint}) as base:
        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda i: hub_client(base, tmp_path / f"hf{i}", "snapshot",
                                                      REPO_ID, "prod"), range(8)))
        for out in outs:
            assert out["ok"], out
            assert out["files"] == files
        weights = bytes_read(proxy, "tiny/1/model.safetensors")
        assert weights and total(weights, size) == size, weights  # every byte, once
        assert len(bytes_read(proxy, "tiny/1/config.json")) == 1
        stats = json.loads(python_run([sys.executable, "-c", "import sys,urllib.request;"
             f"print(urllib.request.urlopen('{base}/api/v1/hub/stats').read().decode())"],
            capture_output=True, text=True, check=True).stdout)
        assert stats["sent_bytes"] >= 8 * size
        # registry pull --from the mirror: the same checks, no new store read
        p = run_cli("pull", "tiny@prod", "--from", base, "--to", str(tmp_path / "t"),
                    "--cache", str(tmp_path / "c"), "--json")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["version"] == "1"
        assert total(bytes_read(proxy, "tiny/1/model.safetensors"), size) == size
        # the mirror's cache is a pull cache: listed and pruned by `registry cache`
        ls = run_cli("cache", "ls", "--cache", str(mirror), "--json")
        assert ls.returncode == 0 and "tiny" in ls.stdout, ls.stderr
        assert list((mirror / "blobs" / "sha256").iterdir())
        pr = run_cli("cache", "prune", "--cache", str(mirror), "--max-size", "0")
        assert pr.returncode == 0, pr.stderr
        assert not list((mirror / "blobs" / "sha256").iterdir())
        out = hub_client(base, tmp_path / "hf-again", "file", REPO_ID, "prod",
                         "model.safetensors")
        assert out["ok"], out
        assert total(bytes_read(proxy, "tiny/1/model.safetensors"), size) == 2 * size


def test_a_tampered_object_never_enters_the_mirror(s3_bucket: str, srcs: dict[str, Path],
                                                   tmp_path: Path) -> None:
    import boto3

    url = f"s3://{s3_bucket}/root"
    _fill(url, srcs)
    key = "root/models/tiny/2/model.safetensors"
    s3 = boto3.client("s3")
    data = bytearray(s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    data[3 * PIECE + 1] ^= 1
    s3.put_object(Bucket=s3_bucket, Key=key, Body=bytes(data))
    mirror = tmp_path / "mirror"
    with serve(url, index_db(tmp_path), "--mirror-cache", str(mirror)) as base:
        out = hub_client(base, tmp_path / "hf", "file", REPO_ID, "2", "model.safetensors")
        # refused (409), or cut before the bad piece (the verified ones were streamed:
        # registry.web.filling): never a whole file
        assert out["ok"] is False and ("409" in out["message"] or
                                       "IncompleteRead" in out["message"]), out
        bad = release_files(url, "tiny", "2")["model.safetensors"]
        assert not (mirror / "blobs" / "sha256" / bad).exists()
        p = run_cli("pull", "tiny@2", "--from", base, "--to", str(tmp_path / "t"),
                    "--cache", str(tmp_path / "c"))
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
        assert not (tmp_path / "t").exists()


def test_pull_from_a_mirror_checks_what_it_gets_and_falls_back_to_the_store(
        tmp_path: Path, srcs: dict[str, Path]) -> None:
    store = str(tmp_path / "store")
    _fill(store, srcs)
    with serve(store, index_db(tmp_path)) as base:
        p = run_cli("pull", "tiny@prod", "--to", str(tmp_path / "t1"), "--cache",
                    str(tmp_path / "c"), "--json", env={"REGISTRY_MIRROR": base})
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["version"] == "1"
        p = run_cli("pull", "tiny@nope", "--from", base, "--cache", str(tmp_path / "c"))
        assert p.returncode == 3 and p.stderr.count("\n") == 1, p.stderr
    down = f"http://127.0.0.1:{free_port()}"
    p = run_cli("pull", "tiny@prod", "--from", down, "--to", str(tmp_path / "t2"), "--cache",
                str(tmp_path / "c"))
    assert p.returncode == 6 and "cannot be reached" in p.stderr, p.stderr
    p = run_cli("pull", "tiny@prod", "--from", down, "--store", store, "--to",
                str(tmp_path / "t2"), "--cache", str(tmp_path / "c"))
    assert p.returncode == 0 and "pulling from the store" in p.stderr, p.stderr
    assert (tmp_path / "t2" / "model.safetensors").read_bytes() == \
        (srcs["1"] / "model.safetensors").read_bytes()


def test_offline_pull_places_what_the_cache_recorded(s3_bucket: str, srcs: dict[str, Path],
                                                     tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/root"
    _fill(url, srcs)
    cache = str(tmp_path / "c")
    assert run_cli("pull", "tiny@prod", "--store", url, "--cache", cache, "--to",
                   str(tmp_path / "t1")).returncode == 0
    # the alias moves and the store goes away: offline still means what was pulled
    assert run_cli("alias", "set", "tiny", "prod", "2", "--store", url).returncode == 0
    dead = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    p = run_cli("pull", "tiny@prod", "--offline", "--cache", cache, "--to",
                str(tmp_path / "t2"), "--json", env=dead)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert (doc["version"], doc["downloaded"], doc["offline"]) == ("1", 0, True)
    assert (tmp_path / "t2" / "model.safetensors").read_bytes() == \
        (srcs["1"] / "model.safetensors").read_bytes()
    p = run_cli("pull", "tiny@2", "--cache", cache, "--to", str(tmp_path / "t3"),
                env={**dead, "REGISTRY_OFFLINE": "1"})
    assert p.returncode == 3 and "never pulled" in p.stderr, p.stderr
    assert not (tmp_path / "t3").exists()
    # a blob changed in the cache is re-hashed, found wrong, and not placed
    blob = Path(cache) / "blobs" / "sha256" / release_files(url, "tiny", "1")["model.safetensors"]
    blob.chmod(0o644)
    raw = bytearray(blob.read_bytes())
    raw[10] ^= 1
    blob.write_bytes(bytes(raw))
    p = run_cli("pull", "tiny@prod", "--offline", "--cache", cache, "--to",
                str(tmp_path / "t4"), env=dead)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "t4").exists()
