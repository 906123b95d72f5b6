"""Numbers from users that compare false with every bound (NaN) or overflow
(infinity, 1e400, huge day counts) are refused as usage errors, in the API and
in settings read from the environment; found by a break-test where
``cache prune --older-than nan`` selected the whole cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.trust.local_ca import make_ca
from registry.errors import UsageError
from registry.lifecycle.gc import parse_duration
from registry.protocol.pieces import piece_size
from registry.pull.cache_admin import PullCache
from registry.pull.cache_prune import parse_size
from registry.store.s3retry import RetryPolicy


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "nans", "infd", "1e400"])
def test_durations_and_sizes_must_be_finite(text: str) -> None:
    with pytest.raises(UsageError, match="finite|negative"):
        parse_duration(text)
    with pytest.raises(UsageError, match=f"size '{text}'"):  # never a size
        parse_size(text)


@pytest.mark.parametrize("kw", [
    {"older_than": float("nan")}, {"older_than": float("inf")}, {"older_than": "nan"},
    {"max_size": float("nan")}, {"max_size": "infG"}, {"max_size": [1]}, {"max_size": -1},
    {"keep_last": True}, {"keep_last": 1.5}, {"keep_last": "2"}, {"keep_last": -1},
])
def test_prune_refuses_options_that_would_select_everything(tmp_path: Path, kw: dict) -> None:
    cache = PullCache(tmp_path / "cache")
    with pytest.raises(UsageError):
        cache.prune(**kw)


def test_an_empty_cache_path_is_refused() -> None:
    with pytest.raises(UsageError, match="non-empty"):
        PullCache("")


@pytest.mark.parametrize("options", [
    {"retry_attempts": "inf"}, {"retry_attempts": 1e400}, {"retry_attempts": 101},
    {"retry_delay": "inf"}, {"retry_delay": "1e300"}, {"retry_delay": "nan"},
])
def test_retry_settings_are_bounded(options: dict) -> None:
    with pytest.raises(UsageError, match="must be a number from"):
        RetryPolicy.from_options(dict(options))


@pytest.mark.parametrize("value", ["inf", "1e400", "nan"])
def test_timeouts_are_bounded(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from registry.store import open_store

    monkeypatch.setenv("REGISTRY_S3_CONNECT_TIMEOUT", value)
    with pytest.raises(UsageError, match="REGISTRY_S3_CONNECT_TIMEOUT"):
        open_store("s3://some-bucket/p")


@pytest.mark.parametrize("value", ["abc", "0", "-1", "100"])
def test_piece_size_setting(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", value)
    with pytest.raises(UsageError, match="REGISTRY_PIECE_SIZE"):
        piece_size()


def test_certificate_lifetimes_and_paths(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--days"):
        make_ca(tmp_path / "ca.pem", subject="CN=x", days=3_000_000)
    with pytest.raises(UsageError, match="give --cert"):
        make_ca(tmp_path / "ca.crt", subject="CN=x")
    assert not list(tmp_path.iterdir())  # nothing written by a refusal
