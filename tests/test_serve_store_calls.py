"""Store requests of a repeated download from ``registry serve`` (issue 48 item 8,
issue 51 item 2).

A plain server (freshness interval 0: every mutable fact read each request)
in front of the session's moto S3 server through the fault proxy, whose log
is what the store was asked. Once a release was opened, a download asks the
store for the mutable facts once each (the tombstone, the yank record, the
version's existence, the alias of that name, the model's versions) and the
file's bytes: never the same record twice, never the manifest again (a
committed release's manifest is immutable).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.hub_util import index_db, publish, release_files, srcs  # noqa: F401 - fixture
from tests.support.faultproxy import FaultProxy
from tests.test_mirror_outage import REPO, get, sha
from tests.web_util import serve

DOWNLOADS = 3


def test_a_repeated_download_reads_each_fact_once_and_the_manifest_never(
        s3_bucket: str, proxy: FaultProxy, srcs: dict[str, Path], tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/root"
    publish(url, srcs["1"], "tiny", "1")
    digest = release_files(url, "tiny", "1")["config.json"]
    with serve(url, index_db(tmp_path), env={"AWS_ENDPOINT_URL": proxy.endpoint}) as base:
        assert get(base, f"/{REPO}/resolve/1/config.json")[0] == 200
        proxy.reset()
        for _ in range(DOWNLOADS):
            status, _, body = get(base, f"/{REPO}/resolve/1/config.json")
            assert status == 200 and sha(body) == digest
        asked = Counter((r.op, r.key.removeprefix("root/")) for r in proxy.log)
    keys = Counter(key for _, key in asked.elements())
    log = sorted(asked.items())
    assert not any(k.endswith("MANIFEST.json") and op.startswith("Get") for (op, k) in asked), log
    for key in ("ledger/tombstones/tiny/1.json", "ledger/yanks/tiny/1.json"):
        assert keys[key] == DOWNLOADS, log  # once per download, not twice
    assert sum(asked.values()) <= 6 * DOWNLOADS, log
