"""An orphan multipart upload is judged by its own age and the absence of a claim (issue 47).

Every writer claims its directory before its first upload, so an upload
inside a model or run directory that no claim covers is a dead writer's
(a writer SIGKILLed while its server restarted, its claim gone): gc aborts
it once its own age, on the server's clock, passes ``orphan_after`` (a
minute by default), not after ``--older-than``'s hour. An upload under a
live claim, and one outside any writer's directory, keep the old rules.
Inputs: a release file and a checkpoint file with no claim, on moto and
SeaweedFS (real upload timestamps).
"""

from __future__ import annotations

import boto3
import pytest

from registry.protocol.claim import Claim
from registry.lifecycle.gc import collect
from registry.store import open_store

ORPHANS = ["models/m/1/weights.bin", "runs/r/ckpt/step-000001/model.safetensors"]


def _start(bucket: str, key: str) -> None:
    boto3.client("s3").create_multipart_upload(Bucket=bucket, Key=f"root/{key}")


def _uploads(bucket: str) -> set[str]:
    return {u["Key"].removeprefix("root/") for u in boto3.client("s3").list_multipart_uploads(
        Bucket=bucket).get("Uploads", [])}


@pytest.mark.parametrize("server", ["s3", "seaweed"])
def test_an_upload_no_claim_covers_goes_by_its_own_age(server: str,
                                                       request: pytest.FixtureRequest) -> None:
    bucket = request.getfixturevalue("s3_bucket" if server == "s3" else "seaweed_bucket")
    store = open_store(f"s3://{bucket}/root")
    live = Claim(store, "models/m/2.claim")
    live.take()
    try:
        for key in [*ORPHANS, "models/m/2/weights.bin", "scratch/big.bin"]:
            _start(bucket, key)
        if server == "seaweed":  # real timestamps: seconds old, under the minute
            assert collect(store, older_than=3600) == []
            assert _uploads(bucket) >= set(ORPHANS)
        removed = collect(store, older_than=3600, orphan_after=0)
        aged = ["scratch/big.bin"] if server == "s3" else []  # moto dates uploads 2010
        assert sorted(removed) == sorted(f"{k} (multipart upload)" for k in ORPHANS + aged)
        left = _uploads(bucket)
        assert "models/m/2/weights.bin" in left  # under a live claim
        assert not set(ORPHANS) & left
        if server == "seaweed":
            assert "scratch/big.bin" in left  # no writer's directory: --older-than
    finally:
        live.release()
