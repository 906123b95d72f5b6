"""A retried conditional PUT whose first answer was lost recognizes its own
object by the write token it carries (``x-amz-meta-registry-write``), with any
ETag form (issue 31 item 6): through the fault proxy, a server whose ETags are
not MD5s (SSE-KMS, many S3-compatible servers) and answers that are lost after
the write landed."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from registry.protocol.commit import commit_local_directory
from registry.errors import ObjectExistsError, PointerConflictError
from registry.store import Store
from registry.protocol.verify import verify_directory
from tests.conftest import proxied
from tests.support.faultproxy import Action, FaultProxy, Request
from tests.support.skewproxy import OpaqueETags


def _conditional(req: Request) -> bool:
    names = {h.lower() for h in req.headers}
    return (req.op in ("PutObject", "CompleteMultipart") and ".registry-probe" not in req.key
            and bool(names & {"if-none-match", "if-match"}))


@pytest.fixture
def through(proxy: FaultProxy, s3_bucket: str) -> Store:
    return proxied(f"s3://{s3_bucket}/root", proxy, retry_delay=0.01)


def _puts(proxy: FaultProxy, key: str) -> int:
    return sum(1 for r in proxy.log if r.op == "PutObject" and r.key.endswith(key))


def test_create_and_swap_after_a_lost_answer(proxy: FaultProxy, through: Store) -> None:
    etags = OpaqueETags(drop=_conditional)
    proxy.rules.append(etags)
    through.create("p/a", b"one")
    assert _puts(proxy, "p/a") == 2 and through.read_bytes("p/a") == b"one"
    _, token = through.read_versioned("p/a")
    through.swap("p/a", b"two", token)
    assert _puts(proxy, "p/a") == 4 and through.read_bytes("p/a") == b"two"
    with pytest.raises(ObjectExistsError):  # a real conflict stays one
        through.create("p/a", b"two")
    with pytest.raises(PointerConflictError):
        through.swap("p/a", b"three", token)


def test_equal_bytes_of_another_writer_are_not_ours(proxy: FaultProxy, through: Store,
                                                    s3_bucket: str) -> None:
    """Another writer put the same bytes first (two writers moving a counter
    write the same next value); our request is lost before it reaches the
    server and retried: the 412 is a lost race, not our own object."""
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="root/p/n", Body=b"6")
    first: list[int] = []

    def lost_before(req: Request) -> Action | None:
        if req.op == "PutObject" and req.key.endswith("p/n") and not first:
            first.append(req.seq)
            return Action("reset")
        return None

    proxy.rules.append(lost_before)
    with pytest.raises(ObjectExistsError):
        through.create("p/n", b"6")
    assert len(first) == 1 and _puts(proxy, "p/n") == 2


def test_commit_with_opaque_etags_and_lost_answers(proxy: FaultProxy, through: Store,
                                                   tmp_path: Path) -> None:
    """A directory commit (a single-PUT file, a two-part multipart file, the
    claim, the manifest), every conditional request's first answer lost, on
    a server whose ETags are not MD5s: committed, and it verifies."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text('{"a": 1}')
    (src / "model.bin").write_bytes(b"w" * (9 * 1024 * 1024))  # two 8 MiB parts
    etags = OpaqueETags(drop=_conditional)
    proxy.rules.append(etags)
    commit_local_directory(through, src, "models/m/1", kind="checkpoint", run_id="r", step=1)
    assert {"root/models/m/1/config.json", "root/models/m/1/model.bin",
            "root/models/m/1/MANIFEST.json"} <= set(etags.dropped)
    proxy.rules.clear()
    assert verify_directory(through, "models/m/1", full=True).ok
