"""A clock a test moves by hand: pass it where code takes a ``clock`` callable
(``time.monotonic``'s shape) and add to ``now``."""

from __future__ import annotations


class FakeClock:
    """Reads ``now`` (seconds, starting at ``start``) when called."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
