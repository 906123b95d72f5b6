"""The store's own time: the one clock every host of a registry shares (issue 31 item 1).

Trainers, publishers, gc cron jobs and serving hosts have clocks that
disagree; a decision such as "this claim was renewed 700 s ago, its lease is
600 s: take it over" must not depend on them agreeing. The store stamps
every object it writes (S3's ``LastModified``, a file's mtime set by the
file server): comparing two such stamps involves one clock only. So "now"
is the stamp of a probe object written and read back in the same call::

    .registry-probe/clock-<random>     written, HEADed, deleted

and an object's age is ``store now - its stamp``. The probe also measures
how far this host's clock is from the store's (``skew``); beyond
:func:`tolerance` (``REGISTRY_CLOCK_TOLERANCE``, seconds, default 60) a
caller that decides on liveness refuses to act (``registry gc`` leaves every
claim alone and says why). S3 stamps have one-second resolution, hence a
tolerance in tens of seconds, far below the leases (minutes).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

from registry.errors import UsageError
from registry.store import Store

PROBE_PREFIX = ".registry-probe"
TOLERANCE_ENV = "REGISTRY_CLOCK_TOLERANCE"
DEFAULT_TOLERANCE = 60.0


def tolerance() -> float:
    """Seconds of clock difference between a host and its store accepted
    before liveness decisions are refused (``REGISTRY_CLOCK_TOLERANCE``).

    Raises:
        UsageError: the setting is not a finite number from 1 to 86400.
    """
    text = os.environ.get(TOLERANCE_ENV, "")
    if not text:
        return DEFAULT_TOLERANCE
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 1 <= value <= 86400:  # NaN fails both
        raise UsageError(f"{TOLERANCE_ENV}={text!r}: must be a number of seconds from 1 to "
                         "86400")
    return value


@dataclass(frozen=True, slots=True)
class StoreTime:
    """One reading of the store's clock.

    Attributes:
        now: the store's time, Unix seconds (the probe's stamp).
        skew: the store's time minus this host's (seconds; positive: the store
            is ahead), measured at the middle of the probe's write.
        rtt: seconds the probe's write took (the uncertainty of ``skew``).
    """

    now: float
    skew: float
    rtt: float

    def skewed(self, limit: float | None = None) -> bool:
        """Whether the difference exceeds ``limit`` (default :func:`tolerance`)
        beyond what the probe's own duration explains."""
        return abs(self.skew) > (tolerance() if limit is None else limit) + self.rtt

    def describe(self) -> str:
        ahead = "ahead of" if self.skew > 0 else "behind"
        return (f"the store's clock is {abs(self.skew):.0f} s {ahead} this host's "
                f"(tolerance {tolerance():.0f} s, {TOLERANCE_ENV})")


def store_time(store: Store) -> StoreTime:
    """Read the store's clock with a probe object (written, HEADed, deleted).

    Raises:
        StorageError: the probe could not be written or read (never a guess).
    """
    key = f"{PROBE_PREFIX}/clock-{uuid.uuid4().hex}"
    store.ensure_root()
    t0 = time.time()
    store.write_bytes(key, b"")
    t1 = time.time()
    try:
        stamp = store.info(key).mtime
    finally:
        store.delete(key)
    if stamp is None:  # a backend without stamps: its clock is this host's
        stamp = (t0 + t1) / 2
    return StoreTime(stamp, stamp - (t0 + t1) / 2, t1 - t0)
