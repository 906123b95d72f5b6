"""The mirror's cache disk: a file that cannot fit, and fills that fail (issue 51, item 4).

The full disk is real: the mirror's cache is a tmpfs smaller than the file,
mounted in a mount namespace of the server's own (``unshare -Urm``, so no
root is needed); the test reads that cache through ``/proc/<pid>/root``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.hub_util import publish, release_files, tiny_bert, tiny_on_s3
from tests.support.faultproxy import Action, FaultProxy
from tests.web_util import serve

WEIGHTS = 4 << 20
TMPFS = 3 << 20
FAST = {"REGISTRY_S3_ATTEMPTS": "1", "REGISTRY_S3_RETRY_DELAY": "0"}


def _can_unshare() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    p = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                       capture_output=True, text=True)
    return None if p.returncode == 0 else f"cannot mount a tmpfs in a namespace: {p.stderr}"


@pytest.fixture(scope="module")
def tmpfs_ok() -> None:
    why = _can_unshare()
    if why is not None:
        if os.environ.get("REGISTRY_REQUIRE_TMPFS") == "1":
            pytest.fail(f"REGISTRY_REQUIRE_TMPFS=1: {why}")
        pytest.skip(why)


def get(base: str, path: str) -> tuple[int, dict[str, str], bytes]:
    m = re.match(r"http://([^:/]+):(\d+)", base)
    assert m
    conn = http.client.HTTPConnection(m.group(1), int(m.group(2)), timeout=120)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_a_file_the_cache_cannot_hold_is_refused_at_once_with_nothing_fetched(
        tmpfs_ok: None, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    src = tiny_bert(tmp_path, 1)
    save_file({"w": np.random.default_rng(0).standard_normal(WEIGHTS // 4)
               .astype(np.float32)}, str(src / "model.safetensors"), metadata={"format": "pt"})
    store = str(tmp_path / "store")
    publish(store, src, "big", "1")
    files = release_files(store, "big", "1")
    cache = tmp_path / "mnt"
    cache.mkdir()
    proc = subprocess.Popen(
        ["unshare", "-Urm", "sh", "-c", f'mount -t tmpfs -o size={TMPFS} tmpfs "$0" && '
         'exec "$@"', str(cache), sys.executable, "-m", "registry", "serve", "--port", "0",
         "--store", store, "--db", f"sqlite:///{tmp_path / 'i.db'}", "--mirror-cache",
         str(cache / "m")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, (line, proc.stderr.read() if proc.stderr else "")
        base = f"http://127.0.0.1:{m.group(1)}"
        inside = Path(f"/proc/{proc.pid}/root") / str(cache / "m").lstrip("/")
        status, _, body = get(base, "/registry/big/resolve/1/config.json")
        assert status == 200 and hashlib.sha256(body).hexdigest() == files["config.json"]
        before = json.loads(get(base, "/api/v1/hub/stats")[2])["store_bytes"]
        for _ in range(5):
            status, headers, body = get(base, "/registry/big/resolve/1/model.safetensors")
            assert status == 507, (status, body)
            assert headers["x-error-code"] == "InsufficientStorage"
            msg = headers["x-error-message"]
            needs = re.search(r"needs (\d+) bytes .*, (\d+) are free", msg)
            assert str(cache / "m") in msg and needs, msg
            assert int(needs.group(1)) > WEIGHTS > TMPFS > int(needs.group(2)), msg
        assert json.loads(get(base, "/api/v1/hub/stats")[2])["store_bytes"] == before
        assert not list((inside / "tmp").iterdir())  # no temp file left behind
        assert (inside / "blobs" / "sha256" / files["config.json"]).exists()
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
        proc.communicate()


def test_a_failed_fill_leaves_nothing_behind_and_the_next_one_completes(
        s3_bucket: str, proxy: FaultProxy, tmp_path: Path) -> None:
    url, _, weights = tiny_on_s3(s3_bucket, tmp_path, 2)
    mirror = tmp_path / "m"
    with serve(url, f"sqlite:///{tmp_path / 'i.db'}", "--mirror-cache", str(mirror),
               env={"AWS_ENDPOINT_URL": proxy.endpoint, **FAST}) as base:
        assert get(base, "/registry/tiny/resolve/1/config.json")[0] == 200
        proxy.rules.append(lambda r: Action("error", status=500, code="InternalError")
                           if r.key.endswith("model.safetensors") else None)
        for _ in range(3):
            status, headers, _ = get(base, "/registry/tiny/resolve/1/model.safetensors")
            assert status == 503 and headers["x-error-code"] == "StoreUnavailable"
        left = list((mirror / "tmp").iterdir())
        # nothing, or one partial with its log of verified pieces (taken over next)
        assert len([p for p in left if p.name.endswith(".incomplete")]) <= 1, left
        proxy.rules.clear()
        status, _, body = get(base, "/registry/tiny/resolve/1/model.safetensors")
        assert status == 200 and hashlib.sha256(body).hexdigest() == weights
        assert not list((mirror / "tmp").iterdir())
        assert (mirror / "blobs" / "sha256" / weights).exists()
