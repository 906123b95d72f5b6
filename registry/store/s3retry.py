"""One bounded retry policy for every S3 request (issue 13 item 5).

botocore retries a request up to 4 times with ``rand * 2**n`` s of backoff,
and s3fs retries botocore's final error up to 5 times more: up to 25 tries
of one request, with delays nobody can set. The S3 store turns both off and
retries here instead, once per request, with settings a deployment (or a
test) can choose:

- ``REGISTRY_S3_ATTEMPTS`` / store option ``retry_attempts``: tries of one
  request (default 5);
- ``REGISTRY_S3_RETRY_DELAY`` / ``retry_delay``: backoff base, seconds (0.5);
- ``REGISTRY_S3_READ_TIMEOUT`` / ``config_kwargs["read_timeout"]``: seconds
  without a byte before a request counts as failed (s3fs's 15);
- ``REGISTRY_S3_CONNECT_TIMEOUT`` / ``config_kwargs["connect_timeout"]`` (5).

The n-th retry waits a random time in ``[0, min(20, delay * 2**(n-1))]``
("full jitter"). Retried: throttling and server errors, per server in
:data:`SERVER_TRANSIENT` (503 SlowDown, 500 InternalError, 502, 504,
RequestTimeout, 429; Ceph RGW's UnknownError, MinIO's quorum and
not-initialized answers), connections refused, reset or
closed, timeouts, and answers cut short or unparsable. Everything else (404,
412, 403...) is an answer and is raised at once. The error raised after the
last try carries ``registry_attempts``: how many times the request was sent,
so a conditional write can tell a 412 caused by its own earlier try that
landed (see :func:`attempts_of`). Below this layer aiohttp re-sends an
idempotent request once when a reused keep-alive connection turns out to be
closed, so a reset costs at most two sends per try.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from registry.errors import UsageError
from registry.store.translate import causes, is_named, s3_error_code, unreachable

T = TypeVar("T")

ATTEMPTS_ENV, DELAY_ENV = "REGISTRY_S3_ATTEMPTS", "REGISTRY_S3_RETRY_DELAY"
READ_TIMEOUT_ENV, CONNECT_TIMEOUT_ENV = "REGISTRY_S3_READ_TIMEOUT", "REGISTRY_S3_CONNECT_TIMEOUT"
MAX_DELAY = 20.0
#: bounds of the settings: a request is never tried more than 100 times,
#: and no timeout is longer than an hour (seconds).
MAX_ATTEMPTS, MAX_TIMEOUT = 100, 3600.0
DEFAULT_ATTEMPTS, DEFAULT_DELAY = 5, 0.5

#: The answers worth sending a request again for, per server family, in one
#: table (issue 47): each code with what the server means by it. A request is
#: sent again when any server's table has its code (the server is not known
#: in advance; no server uses another's transient code for a final answer).
#: A conditional write retried after an answer whose request landed meets
#: its own write on the retry and recognises it by its write token.
SERVER_TRANSIENT: dict[str, dict[str, str]] = {
    "aws": {"SlowDown": "throttled (503)", "503": "unavailable",
            "ServiceUnavailable": "unavailable (503)", "InternalError": "failed (500)",
            "500": "failed", "502": "bad gateway", "504": "gateway timeout",
            "BadGateway": "bad gateway (502)", "GatewayTimeout": "gateway timeout (504)",
            "RequestTimeout": "the body came too slowly (400)",
            "Throttling": "throttled", "ThrottlingException": "throttled",
            "RequestLimitExceeded": "throttled", "TooManyRequests": "throttled (429)",
            "TooManyRequestsException": "throttled (429)", "429": "throttled"},
    "ceph-rgw": {"UnknownError": "RGW's 500 for a request it failed (a racing "
                                 "conditional PUT, an OSD timeout)"},
    "minio": {"XMinioServerNotInitialized": "a node still starting (503)",
              "XMinioReadQuorum": "too few disks answered a read (503)",
              "XMinioWriteQuorum": "too few disks took a write (503)",
              "SlowDownRead": "throttled reads (503)", "SlowDownWrite": "throttled writes (503)"},
    "seaweedfs": {"InternalError": "filer or volume server failed (500)",
                  "ServiceUnavailable": "volume server restarting (503)"},
    "gcs-interop": {"InternalError": "failed (500)", "SlowDown": "rate limited (429/503)"},
}
#: S3 error codes of a request worth sending again (the union of the table).
TRANSIENT_CODES = frozenset(code for codes in SERVER_TRANSIENT.values() for code in codes)
#: exception class names of an answer cut short or garbled (a proxy's rate
#: limiter answering invalid XML, a body that ended early).
_CUT_SHORT = ("ResponseParserError", "IncompleteReadError", "IncompleteRead",
              "ClientPayloadError")


def _number(name: str, value: object, *, least: float, most: float) -> float:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        out = float("nan")
    if not least <= out <= most:  # NaN and infinities fail too
        raise UsageError(f"{name}={value!r}: must be a number from {least:g} to {most:g}")
    return out


def is_transient(exc: BaseException) -> bool:
    """Whether the request that raised ``exc`` may succeed when sent again."""
    code = s3_error_code(exc)
    if code is not None:
        return code in TRANSIENT_CODES
    if unreachable(exc) is not None:
        return True
    return any(is_named(seen, _CUT_SHORT) for seen in causes(exc))


def attempts_of(exc: BaseException) -> int:
    """How many times the request that ended in ``exc`` was sent (1 if unknown)."""
    for seen in causes(exc):
        n = getattr(seen, "registry_attempts", None)
        if isinstance(n, int):
            return n
    return 1


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often, and how patiently, one S3 request is sent.

    Attributes:
        attempts: tries of one request, at least 1 (1: never retried).
        delay: seconds; the n-th retry waits up to ``delay * 2**(n-1)``
            (at most 20 s), a uniformly random share of it.
    """

    attempts: int = DEFAULT_ATTEMPTS
    delay: float = DEFAULT_DELAY

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> RetryPolicy:
        """The policy from ``retry_attempts`` / ``retry_delay`` (popped from
        ``options``), else ``REGISTRY_S3_ATTEMPTS`` / ``REGISTRY_S3_RETRY_DELAY``,
        else the defaults.

        Raises:
            UsageError: a value that is not a number, attempts outside 1..100,
                delay outside 0..20 s.
        """
        attempts = options.pop("retry_attempts", None)
        if attempts is None:
            attempts = os.environ.get(ATTEMPTS_ENV) or None
        delay = options.pop("retry_delay", None)
        if delay is None:
            delay = os.environ.get(DELAY_ENV) or None
        tries = (DEFAULT_ATTEMPTS if attempts is None
                 else _number(ATTEMPTS_ENV, attempts, least=1, most=MAX_ATTEMPTS))
        if tries != int(tries):
            raise UsageError(f"{ATTEMPTS_ENV}={attempts!r}: must be a whole number of tries")
        return cls(attempts=int(tries),
                   delay=(DEFAULT_DELAY if delay is None
                          else _number(DELAY_ENV, delay, least=0, most=MAX_DELAY)))

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (from 1)."""
        return random.uniform(0, min(MAX_DELAY, self.delay * 2 ** (retry - 1)))

    async def run(self, attempt: Callable[[], Awaitable[T]], *, body: Any = None,
                  transient: Callable[[BaseException], bool] | None = None) -> T:
        """Await ``attempt()`` until it succeeds, fails for good, or the tries
        run out. ``body``: a request body to rewind before each retry.
        ``transient``: which errors are worth another try (default
        :func:`is_transient`, S3's classes; the GCS and Azure stores pass
        their service's).

        Raises:
            the last error, with ``registry_attempts`` set on it.
        """
        for n in range(1, self.attempts + 1):
            if n > 1 and hasattr(body, "seek"):
                body.seek(0)
            try:
                return await attempt()
            except Exception as exc:
                if n >= self.attempts or not (transient or is_transient)(exc):
                    try:
                        exc.registry_attempts = n  # type: ignore[attr-defined]
                    except AttributeError:
                        pass
                    raise
            await asyncio.sleep(self.backoff(n))
        raise AssertionError("unreachable")  # pragma: no cover


def timeouts(config: dict[str, Any]) -> None:
    """Fill ``read_timeout`` / ``connect_timeout`` (seconds) of a botocore
    config from ``REGISTRY_S3_READ_TIMEOUT`` / ``REGISTRY_S3_CONNECT_TIMEOUT``
    when set and not given explicitly.

    Raises:
        UsageError: a value that is not a positive number.
    """
    for env, key in ((READ_TIMEOUT_ENV, "read_timeout"), (CONNECT_TIMEOUT_ENV, "connect_timeout")):
        value = os.environ.get(env)
        if value and key not in config:
            config[key] = _number(env, value, least=0.001, most=MAX_TIMEOUT)
