"""A writer recognises its own writes under any retry pattern (issue 47).

An S3 front that carries out a write and loses (or replaces) its answer
makes the client send it again; a conditional write then fails on the
writer's own first attempt. The writer must take that for its own, through
its write token or, for a claim, the claim's ``owner`` token, never for
another writer's. Retry patterns (each on every write: PUT, POST, DELETE;
through the fault proxy, in front of moto and SeaweedFS): the first two
answers lost (two retries), the answer replaced by 500 InternalError after
the write landed, and by 503 SlowDown after it landed. Each publish commits
and verifies; and a claim whose create answer is lost on a server that keeps
no user metadata (the write token gone) is still its writer's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from registry.checkpoint.lease import WriterLease
from registry.protocol.claim import Claim
from registry.release import ModelRelease
from registry.store import Store, open_store
from registry.protocol.verify import verify_directory
from tests.release_util import ledger_row, summary
from tests.support.faultproxy import Action, FaultProxy, Request
from tests.test_pull import release_files

_WRITES = ("PUT", "POST", "DELETE")


def _lose(times: int, action: Callable[[], Action]) -> Callable[[Request], Action | None]:
    """A rule: the first ``times`` sends of each write are carried out and
    answered by ``action`` (a reset, or an error) instead of the server's answer."""
    seen: dict[tuple[str, str, str], int] = {}

    def rule(req: Request) -> Action | None:
        if req.method not in _WRITES or ".registry-probe" in req.key:
            return None
        key = (req.method, req.key, repr(sorted(req.query.items())))
        seen[key] = seen.get(key, 0) + 1
        return action() if seen[key] <= times else None
    return rule


PATTERNS = {
    "two-answers-lost": lambda: _lose(2, lambda: Action("reset_after")),
    "500-after-write": lambda: _lose(1, lambda: Action("error_after", status=500,
                                                       code="InternalError")),
    "503-after-write": lambda: _lose(1, lambda: Action("error_after", status=503,
                                                       code="SlowDown")),
}


@pytest.fixture(params=["moto", "seaweed"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, FaultProxy]]:
    """``(bucket, proxy)`` on moto or SeaweedFS, the proxy in front of it."""
    fixture = "s3_bucket" if request.param == "moto" else "seaweed_bucket"
    bucket = request.getfixturevalue(fixture)
    proxy = FaultProxy(os.environ["AWS_ENDPOINT_URL"]).start()
    yield bucket, proxy
    proxy.stop()


def _through(bucket: str, proxy: FaultProxy) -> Store:
    return open_store(f"s3://{bucket}/root", client_kwargs={"endpoint_url": proxy.endpoint},
                      retry_delay=0.01)


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_publish_commits_when_write_answers_are_lost(server: tuple[str, FaultProxy],
                                                     tmp_path: Path, pattern: str) -> None:
    bucket, proxy = server
    src = tmp_path / "src"
    for rel, data in release_files().items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    store = _through(bucket, proxy)
    proxy.rules.append(PATTERNS[pattern]())
    result = ModelRelease(store).publish(src, "tiny", "1", ledger=[ledger_row()],
                                         eval_summary=summary())
    proxy.rules.clear()
    direct = open_store(f"s3://{bucket}/root")
    assert verify_directory(direct, "models/tiny/1", full=True).ok
    assert result.manifest.digest
    assert not direct.exists("models/tiny/1.claim")  # released, not left behind
    lost = [r for r in proxy.log if r.method in _WRITES]
    assert len(lost) > 10  # the faults were met


def _no_metadata(req: Request) -> Action | None:
    """A front that shows no user metadata (``x-amz-meta-*``: the write token)
    in its answers and loses the answer of the claim's first create."""

    def strip(req: Request, status: int, headers: list[tuple[str, str]],
              body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        return status, [(k, v) for k, v in headers
                        if not k.lower().startswith("x-amz-meta-")], body
    first = (req.method == "PUT" and req.key.endswith(".claim")
             and not getattr(_no_metadata, "done", False))
    if first:
        _no_metadata.done = True  # type: ignore[attr-defined]
    return Action("edit", edit_response=strip, drop_answer=first)


@pytest.mark.parametrize("key", ["models/m/1.claim", "runs/r/ckpt/step-000001.claim"])
def test_a_claim_whose_create_answer_is_lost_is_its_writers(server: tuple[str, FaultProxy],
                                                            key: str) -> None:
    """No write token on the server: the claim's owner token decides."""
    bucket, proxy = server
    _no_metadata.done = False  # type: ignore[attr-defined]
    proxy.rules.append(_no_metadata)
    claim = Claim(_through(bucket, proxy), key)
    assert claim.take() is None
    claim.renew()
    claim.release()
    proxy.rules.clear()
    assert not open_store(f"s3://{bucket}/root").exists(key)


def _lose_renewals(req: Request) -> Action | None:
    """A front showing no user metadata that loses the answer of every
    conditional PUT (If-Match: a renewal) the first time it is sent."""
    if req.method == "PUT" and any(h.lower() == "if-match" for h in req.headers):
        seen = _lose_renewals.seen  # type: ignore[attr-defined]
        if req.key not in seen:
            seen.add(req.key)
            return Action("edit", drop_answer=True,
                          edit_response=lambda q, st, h, b: (st, h, b))
    if req.method in ("HEAD", "GET"):
        return _no_metadata(Request(req.seq, "GET", req.bucket, req.key, req.query,
                                    req.headers))
    return None


@pytest.mark.parametrize("root", ["runs/r1/ckpt", "loong/ckpts"])
def test_a_lease_renewal_whose_answer_is_lost_keeps_the_lease(
        server: tuple[str, FaultProxy], root: str) -> None:
    """The writer lease (WRITER.lease) and a claim: a renewal that landed and
    lost its answer is the holder's own, not a takeover by another writer."""
    bucket, proxy = server
    _no_metadata.done = True  # type: ignore[attr-defined]
    _lose_renewals.seen = set()  # type: ignore[attr-defined]
    store = _through(bucket, proxy)
    lease = WriterLease(store, root, seconds=60)
    lease.hold()
    claim = Claim(store, f"{root}/step-000002.claim")
    claim.take()
    proxy.rules.append(_lose_renewals)
    lease.hold()  # a renewal
    claim.renew()
    assert lease.held and not claim.lost
    proxy.rules.clear()
    lease.release()
    claim.release()
