"""48 clients on one cold file while another polls the JSON API (issue 51, items 3 and 6).

The store is slowed by the delaying proxy on the file's reads, so the fill
is still running while the clients wait. Checked without any clock: every
client gets the file's bytes (sha256), the store sends each byte of the
file once, and the JSON API answers while the fill is still running (before
any of the 48 clients got its file), which a server whose request threads
all wait on the fill cannot do.
"""

from __future__ import annotations

import hashlib
import http.client
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.hub_util import tiny_on_s3
from tests.support.faultproxy import Action, FaultProxy
from tests.test_hub_mirror import bytes_read, total
from tests.web_util import serve

CLIENTS = 48


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_a_cold_stampede_reads_the_store_once_and_stalls_no_other_route(
        s3_bucket: str, proxy: FaultProxy, tmp_path: Path) -> None:
    url, src, digest = tiny_on_s3(s3_bucket, tmp_path, 3)
    size = (src / "model.safetensors").stat().st_size
    with serve(url, f"sqlite:///{tmp_path / 'i.db'}", "--mirror-cache",
               str(tmp_path / "m"), env={"AWS_ENDPOINT_URL": proxy.endpoint}) as base:
        port = int(base.rsplit(":", 1)[1])
        assert get(port, "/registry/tiny/resolve/1/config.json")[0] == 200  # facts warm
        fill_started = threading.Event()

        def slow(req: object) -> Action | None:
            if getattr(req, "op", "") == "GetObject" and \
                    getattr(req, "key", "").endswith("model.safetensors"):
                fill_started.set()
                return Action("delay", seconds=6.0)
            return None
        proxy.rules.append(slow)
        proxy.log.clear()
        first_done = threading.Event()

        def client(_: int) -> tuple[int, str]:
            status, body = get(port, "/registry/tiny/resolve/1/model.safetensors")
            first_done.set()
            return status, hashlib.sha256(body).hexdigest()

        with ThreadPoolExecutor(CLIENTS) as pool:
            futures = [pool.submit(client, i) for i in range(CLIENTS)]
            assert fill_started.wait(120)
            polls_during_fill = 0
            while not first_done.is_set():
                status, body = get(port, "/api/v1/models")
                assert status == 200, body
                if not first_done.is_set():
                    polls_during_fill += 1
            results = [f.result() for f in futures]
        assert results == [(200, digest)] * CLIENTS
        assert polls_during_fill >= 1  # the JSON API answered while 48 clients waited
        spans = bytes_read(proxy, "tiny/1/model.safetensors")
        assert total(spans, size) == size, spans  # every byte of the file read once
