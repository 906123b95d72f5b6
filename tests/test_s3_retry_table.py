"""Retryable answers are classified per server in one table (issue 47 item 2).

Every code of :data:`registry.store.s3retry.SERVER_TRANSIENT` (Ceph RGW's
``UnknownError``, MinIO's quorum answers, SeaweedFS's, AWS's) is retried on
each server the suite runs (moto and SeaweedFS, the answer injected by the
fault proxy): as the answer to a plain PUT that never reached the server,
and to a conditional create that landed (the retry meets its own write and
takes it for its own). A code of no table (``AccessDenied``) is final.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from registry.errors import StoragePermissionError
from registry.store import open_store
from registry.store.s3retry import SERVER_TRANSIENT
from tests.support.faultproxy import Action, FaultProxy, Request


@pytest.fixture(params=["moto", "seaweed"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, FaultProxy]]:
    bucket = request.getfixturevalue("s3_bucket" if request.param == "moto"
                                     else "seaweed_bucket")
    proxy = FaultProxy(os.environ["AWS_ENDPOINT_URL"]).start()
    yield bucket, proxy
    proxy.stop()


def _once(key: str, kind: str, code: str, status: int) -> object:
    done: list[int] = []

    def rule(req: Request) -> Action | None:
        if req.method == "PUT" and req.key.endswith(key) and not done:
            done.append(req.seq)
            return Action(kind, status=status, code=code)
        return None
    return rule


@pytest.mark.parametrize("family", sorted(SERVER_TRANSIENT))
def test_every_transient_answer_of_the_table_is_retried(server: tuple[str, FaultProxy],
                                                        family: str) -> None:
    bucket, proxy = server
    store = open_store(f"s3://{bucket}/root",
                       client_kwargs={"endpoint_url": proxy.endpoint}, retry_delay=0.001)
    for i, code in enumerate(sorted(SERVER_TRANSIENT[family])):
        status = int(code) if code.isdigit() else 503
        proxy.rules[:] = [_once(f"plain-{i}", "error", code, status)]
        store.write_bytes(f"{family}/plain-{i}", b"p")
        proxy.rules[:] = [_once(f"cond-{i}", "error_after", code, status)]
        store.create(f"{family}/cond-{i}", b"c")  # landed, answered an error: ours
        assert store.read_bytes(f"{family}/plain-{i}") == b"p", code
        assert store.read_bytes(f"{family}/cond-{i}") == b"c", code


def test_an_answer_of_no_table_is_final(server: tuple[str, FaultProxy]) -> None:
    bucket, proxy = server
    store = open_store(f"s3://{bucket}/root",
                       client_kwargs={"endpoint_url": proxy.endpoint}, retry_delay=0.001)
    proxy.rules[:] = [_once("denied", "error", "AccessDenied", 403)]
    with pytest.raises(StoragePermissionError):
        store.write_bytes("x/denied", b"d")
    assert sum(1 for r in proxy.log if r.method == "PUT" and r.key.endswith("denied")) == 1
