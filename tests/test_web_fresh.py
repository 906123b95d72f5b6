"""registry.web.fresh and registry.web.failure through the Python API (issue 51, items 1, 2).

The process-level behaviour is in tests/test_mirror_outage.py; here the rules
themselves, with a clock the test moves and a store that really is down (an
S3 endpoint nothing listens on).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from registry.errors import (
    InsufficientSpaceError,
    IntegrityError,
    NotCommittedError,
    ObjectNotFoundError,
    StorageError,
    StoragePermissionError,
)
from registry.store import open_store
from registry.web.failure import failure_of
from registry.web.fresh import Facts, reset_stale, stale_age
from tests.conftest import free_port
from tests.support.fakeclock import FakeClock


def down_error() -> StorageError:
    """The error a read of a store that cannot be reached raises."""
    store = open_store("s3://nobucket/root", client_kwargs={
        "endpoint_url": f"http://127.0.0.1:{free_port()}"}, retry_attempts=1,
        retry_delay=0)
    try:
        store.read_bytes("x")
    except StorageError as e:
        return e
    raise AssertionError("a read from a dead endpoint succeeded")


@pytest.fixture(scope="module")
def outage() -> StorageError:
    return down_error()


def test_the_one_mapping(outage: StorageError) -> None:
    f = failure_of(outage)
    assert f is not None and (f.status, f.code) == (503, "StoreUnavailable")
    assert int(f.headers()["Retry-After"]) > 0
    full = failure_of(InsufficientSpaceError("cache: 5 bytes needed", needed=5))
    assert full is not None and (full.status, full.code, full.retry_after) == \
        (507, "InsufficientStorage", None)
    refused = failure_of(StoragePermissionError("k: access denied"))
    assert refused is not None and (refused.status, refused.retry_after) == (502, None)
    for absent in (ObjectNotFoundError("k: not found"), NotCommittedError("no release"),
                   IntegrityError("f", reason="differs"), ValueError("x")):
        assert failure_of(absent) is None, absent


def test_one_read_per_interval_shared_by_every_request() -> None:
    clock = FakeClock()
    facts = Facts(5.0, 0.0, clock=clock)
    gate = threading.Event()
    reads: list[int] = []

    def read() -> str:
        reads.append(1)
        gate.wait(30)
        return "v1"
    out: list[Any] = []
    threads = [threading.Thread(target=lambda: out.append(facts.get("k", read)))
               for _ in range(8)]
    for t in threads:
        t.start()
    while not reads:
        threading.Event().wait(0.01)
    gate.set()
    for t in threads:
        t.join()
    assert out == ["v1"] * 8 and len(reads) == 1
    clock.now += 4.9
    assert facts.get("k", lambda: "v2") == "v1"  # still fresh
    clock.now += 0.2
    assert facts.get("k", lambda: "v2") == "v2"  # read again after the interval


def test_stale_only_within_the_bound_and_never_past_a_refusal(outage: StorageError) -> None:
    clock = FakeClock()
    facts = Facts(5.0, 60.0, clock=clock)

    def fail() -> str:
        raise outage
    assert facts.get("alias", lambda: "v1") == "v1"
    clock.now += 30
    reset_stale()
    assert facts.get("alias", fail) == "v1"  # the store is down: the last answer, stale
    assert stale_age() == pytest.approx(30)
    clock.now += 40  # 70 s old: past fresh-for + stale-for
    with pytest.raises(StorageError):
        facts.get("alias", fail)
    # a refusal the server saw stays through the outage
    assert facts.get("gates", lambda: None) is None
    clock.now += 10
    assert facts.get("gates", lambda: "source books is revoked") == "source books is revoked"
    clock.now += 10
    assert facts.get("gates", fail) == "source books is revoked"
    # a refusal raised (not found) is a fact too; an outage is never kept
    clock.now += 100
    with pytest.raises(NotCommittedError):
        facts.get("v9", lambda: (_ for _ in ()).throw(NotCommittedError("no v9")))
    with pytest.raises(NotCommittedError):
        facts.get("v9", fail)
    with pytest.raises(StorageError):
        facts.get("new", fail)
    assert facts.get("new", lambda: "ok") == "ok"
