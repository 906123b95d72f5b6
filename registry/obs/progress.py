"""Progress of long work: what the library reports, and the measured rate.

The library never draws anything. A long operation (publish, release create,
pull, load, gc, index rebuild) is handed a :class:`Progress` and tells it:

* ``start(what, files=N, total=BYTES, unit="files")`` once the amount of work
  is known (from the manifest, or the scan of the source directory), before
  the first byte moves; ``total`` is None for work counted in items only
  (``unit`` names them: files, tensors, objects, releases);
* ``advance(n)`` as ``n`` more bytes (or items) are done, from any thread;
* ``file_done(name, size)`` as each file is complete (``size`` in bytes);
* ``gates(results)`` as release gates are decided (before a byte is written);
* ``finish()`` when the work is done (not called when it failed).

The CLI renders it (registry.cli.progress: a bar on a terminal, JSON lines for
``--json --progress``, nothing otherwise). :class:`RateWindow` is the one rate
and ETA rule every renderer uses: a rate measured over a sliding window, and
no ETA until there is such a rate.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol


class Progress(Protocol):
    """What a long operation reports; every method is cheap and thread-safe."""

    def start(self, what: str, *, files: int | None = None,
              total: int | None = None, unit: str = "files") -> None: ...

    def advance(self, n: int) -> None: ...

    def file_done(self, name: str, size: int) -> None: ...

    def gates(self, results: Sequence[Any]) -> None: ...

    def finish(self) -> None: ...


class NullProgress:
    """Reports to nobody (the default of every library call)."""

    def start(self, what: str, *, files: int | None = None,
              total: int | None = None, unit: str = "files") -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def file_done(self, name: str, size: int) -> None:
        pass

    def gates(self, results: Sequence[Any]) -> None:
        pass

    def finish(self) -> None:
        pass


NULL: Progress = NullProgress()


class RateWindow:
    """Bytes (or items) per second over the last ``window`` seconds.

    Args:
        window: seconds of samples kept (older ones are dropped).
        min_span: a rate exists only once the samples span at least this many
            seconds and count at least one byte: the first chunk of a transfer
            alone says nothing about its speed (it would promise an ETA of
            hours, or of nothing).
        clock: seconds, monotonic (``time.monotonic``; tests pass their own).

    Thread-safe: :meth:`add` may be called from download threads.
    """

    def __init__(self, window: float = 5.0, *, min_span: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window, self.min_span, self._clock = window, min_span, clock
        self._samples: deque[tuple[float, int]] = deque()
        self._sum = 0  # of the samples' counts: rate() is O(1) amortized
        self._lock = threading.Lock()
        self._started = clock()

    def add(self, n: int) -> None:
        """Count ``n`` more units done now."""
        now = self._clock()
        with self._lock:
            self._samples.append((now, n))
            self._sum += n
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._samples and now - self._samples[0][0] >= self.window:
            self._sum -= self._samples.popleft()[1]

    def rate(self) -> float | None:
        """Units per second over the window; None while unmeasured (less than
        ``min_span`` seconds of samples, or nothing counted)."""
        now = self._clock()
        with self._lock:
            self._trim(now)
            if not self._samples:
                return None
            # the window reaches back to its start (or the first sample's
            # predecessor: the time since the work began)
            begin = max(self._started, now - self.window)
            span = now - begin
            done = self._sum
        if span < self.min_span or done <= 0:
            return None
        return done / span

    def eta(self, done: int, total: int | None) -> float | None:
        """Seconds left for ``total - done`` at :meth:`rate`; None when there is
        no total or no measured rate yet."""
        if total is None:
            return None
        r = self.rate()
        if r is None:
            return None
        return max(0, total - done) / r
