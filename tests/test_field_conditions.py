"""Issue 13 item 1: a server that accepts ``If-None-Match`` / ``If-Match`` and
ignores them (older MinIO, some gateways, NAS firmware), simulated by a proxy
that strips the headers in front of the real S3 server. The store proves the
capability before the first write that relies on it, and refuses to publish,
commit, claim or move a pointer on a server that fails the proof, unless the
user accepts the risk for a single-writer setup."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from registry.refs.alias_history import read_head
from registry.refs.aliases import set_alias
from registry.errors import ConditionalWritesUnsupportedError
from registry.gating.ledger import revoke
from registry.store import open_store
from registry.protocol.verify import verify_directory
from tests.conftest import REPO, proxied
from tests.support.faultproxy import Action, FaultProxy, Request, drop_conditions
from tests.test_loongsage import gate_files, hf_dir
from tests.support.forkclient import python_popen


def _publish(src: Path, url: str, version: str, tmp_path: Path,
             env: dict[str, str]) -> subprocess.Popen[str]:
    ledger, evals = gate_files(tmp_path)
    import os
    full = dict(os.environ, **env)
    return python_popen([sys.executable, "-m", "registry", "publish", str(src),
                             "--model-id", "m", "--version", version, "--ledger", str(ledger),
                             "--evals", str(evals), "--store", url, "--db",
                             f"sqlite:///{tmp_path / 'i.db'}"], cwd=REPO, env=full, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_racing_publishers_are_refused_on_a_server_ignoring_conditions(
        s3_bucket: str, proxy: FaultProxy, tmp_path: Path) -> None:
    proxy.rules.append(drop_conditions)
    url = f"s3://{s3_bucket}/root"
    src = hf_dir(tmp_path)
    env = {"AWS_ENDPOINT_URL": proxy.endpoint}
    procs = [_publish(src, url, "1", tmp_path, env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 6, err
        line = err.strip().splitlines()[-1]
        assert "ignores If-None-Match" in line and "REGISTRY_S3_SINGLE_WRITER=1" in line, line
    store = open_store(url)
    assert store.walk_files("models") == {}  # nothing claimed, written or committed
    # Pointer moves and ledger writes refuse too (API, through the same server).
    bad = proxied(url, proxy)
    with pytest.raises(ConditionalWritesUnsupportedError):
        revoke(bad, "wiki", "r")
    with pytest.raises(ConditionalWritesUnsupportedError):
        bad.swap("models/m/refs/prod", b"1\n", None)
    # The probe ran once per process and endpoint, and left nothing behind.
    assert store.walk_files("") == {}


def test_a_server_ignoring_only_if_match_is_refused(s3_bucket: str, proxy: FaultProxy) -> None:
    def strip_if_match(req: Request) -> Action | None:
        return Action("strip", headers=("If-Match",)) if "If-Match" in req.headers else None

    proxy.rules.append(strip_if_match)
    store = proxied(f"s3://{s3_bucket}/root", proxy)
    with pytest.raises(ConditionalWritesUnsupportedError, match="ignores If-Match"):
        store.create("x", b"1")
    with pytest.raises(ConditionalWritesUnsupportedError):  # the answer is cached
        store.swap("y", b"1", None)
    probes = [r for r in proxy.log if ".registry-probe" in r.key and r.op == "PutObject"]
    assert len(probes) == 3


def test_single_writer_opt_out_publishes(s3_bucket: str, proxy: FaultProxy,
                                        tmp_path: Path) -> None:
    proxy.rules.append(drop_conditions)
    url = f"s3://{s3_bucket}/root"
    p = _publish(hf_dir(tmp_path), url, "1", tmp_path,
                 {"AWS_ENDPOINT_URL": proxy.endpoint, "REGISTRY_S3_SINGLE_WRITER": "1"})
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    store = open_store(url)
    assert verify_directory(store, "models/m/1", full=True).ok
    set_alias(proxied(url, proxy, single_writer=True), "m", "prod", "1")
    head = read_head(store, "m", "prod")
    assert head.version == "1" and head.move is not None and head.move.new == "1"


def test_a_compliant_server_passes_the_probe_once(s3_bucket: str, proxy: FaultProxy) -> None:
    store = proxied(f"s3://{s3_bucket}/root", proxy)
    store.create("a", b"1")
    store.create("b", b"1")
    store.swap("a", b"2", store.read_versioned("a")[1])
    probes = [r for r in proxy.log if ".registry-probe" in r.key]
    assert [r.op for r in probes] == ["PutObject", "PutObject", "HeadObject", "PutObject",
                                      "PutObject", "DeleteObject"]
    assert json.dumps(store.walk_files("")) == json.dumps({"a": 1, "b": 1})
