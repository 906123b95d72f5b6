"""Issue 13 item 5: retries are bounded and their settings are real.

The S3 store retries each request itself (registry.store.s3retry), botocore
and s3fs not at all: a server that keeps failing gets exactly
``REGISTRY_S3_ATTEMPTS`` tries of the request, then one line; a fault that
passes is retried to success; bad settings are one line, exit 2.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from registry.errors import StorageError, UsageError
from registry.store import open_store
from registry.store.s3retry import RetryPolicy, is_transient
from tests.conftest import proxied, run_cli
from tests.support.faultproxy import Action, FaultProxy, Request


def _always(op: str, action: Action) -> Callable[[Request], Action | None]:
    def rule(req: Request) -> Action | None:
        return action if req.op == op and req.key.endswith("x.bin") else None
    return rule


@pytest.mark.parametrize("attempts", [1, 3])
@pytest.mark.parametrize("fault", ["503", "500", "reset"])
def test_a_server_that_keeps_failing_gets_exactly_the_attempts(
        s3_bucket: str, proxy: FaultProxy, fault: str, attempts: int) -> None:
    action = {"503": Action("error", status=503, code="SlowDown"),
              "500": Action("error", status=500, code="InternalError"),
              "reset": Action("reset")}[fault]
    store = proxied(f"s3://{s3_bucket}/r", proxy, retry_attempts=attempts, retry_delay=0.01)
    store.write_bytes("x.bin", b"1")
    proxy.log.clear()
    proxy.rules[:] = [_always("GetObject", action)]
    with pytest.raises(StorageError) as e:
        store.read_bytes("x.bin")
    assert len(str(e.value).splitlines()) == 1 and s3_bucket in str(e.value), str(e.value)
    sent = [r.op for r in proxy.log].count("GetObject")
    # aiohttp re-sends an idempotent request once when a reused keep-alive
    # connection turns out closed: a reset costs at most two sends per try.
    assert sent == attempts if fault != "reset" else attempts <= sent <= 2 * attempts, sent
    proxy.rules.clear()
    assert store.read_bytes("x.bin") == b"1"


def test_a_passing_fault_is_retried_to_success(s3_bucket: str, proxy: FaultProxy) -> None:
    store = proxied(f"s3://{s3_bucket}/r", proxy, retry_delay=0.01)
    store.write_bytes("x.bin", b"payload")
    left = [2]

    def twice(req: Request) -> Action | None:
        if req.op == "GetObject" and left[0]:
            left[0] -= 1
            return Action("error", status=503, code="SlowDown")
        return None

    proxy.rules[:] = [twice]
    assert store.read_bytes("x.bin") == b"payload" and left == [0]


def test_answers_are_not_retried(s3_bucket: str, proxy: FaultProxy) -> None:
    """404 and 403 are answers: one request each, no retry."""
    store = proxied(f"s3://{s3_bucket}/r", proxy, retry_delay=0.01)
    store.write_bytes("x.bin", b"1")
    proxy.log.clear()
    assert not store.exists("absent.bin")
    assert [r.op for r in proxy.log if r.key.endswith("absent.bin")] == ["HeadObject"]
    proxy.log.clear()
    proxy.rules[:] = [_always("GetObject", Action("error", status=403, code="AccessDenied"))]
    with pytest.raises(StorageError):
        store.read_bytes("x.bin")
    assert [r.op for r in proxy.log] == ["GetObject"]


def test_settings_from_the_environment_and_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_S3_ATTEMPTS", "7")
    monkeypatch.setenv("REGISTRY_S3_RETRY_DELAY", "0.25")
    assert RetryPolicy.from_options({}) == RetryPolicy(attempts=7, delay=0.25)
    assert RetryPolicy.from_options({"retry_attempts": 2, "retry_delay": 0}) == \
        RetryPolicy(attempts=2, delay=0.0)
    policy = RetryPolicy(attempts=5, delay=0.5)
    for n in range(1, 12):
        assert 0 <= policy.backoff(n) <= min(20.0, 0.5 * 2 ** (n - 1))
    monkeypatch.setenv("REGISTRY_S3_READ_TIMEOUT", "2.5")
    store = open_store("s3://some-bucket/p")
    assert store.fs.config_kwargs["read_timeout"] == 2.5
    assert store.fs.config_kwargs["retries"] == {"total_max_attempts": 1} and store.fs.retries == 1
    for bad in ({"retry_attempts": 0}, {"retry_delay": -1}, {"retry_attempts": "many"}):
        with pytest.raises(UsageError):
            RetryPolicy.from_options(dict(bad))


def test_a_bad_setting_is_one_line_exit_2(s3_server: object) -> None:
    r = run_cli("gc", "--dry-run", "--store", "s3://some-bucket/p",
                env={"REGISTRY_S3_ATTEMPTS": "lots"})
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "REGISTRY_S3_ATTEMPTS" in r.stderr, r.stderr


def test_transient_errors_are_told_from_answers() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

    def client_error(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code}}, "GetObject")

    for code in ("SlowDown", "InternalError", "503", "RequestTimeout", "429"):
        assert is_transient(client_error(code)), code
    for code in ("NoSuchKey", "AccessDenied", "PreconditionFailed", "412", "NoSuchBucket"):
        assert not is_transient(client_error(code)), code
    assert is_transient(EndpointConnectionError(endpoint_url="http://x"))
    assert is_transient(ReadTimeoutError(endpoint_url="http://x"))
    assert not is_transient(ValueError("x"))
