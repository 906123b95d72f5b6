"""How the CLI shows the progress of long commands (one module for all of them).

publish, release create (conversion included), pull, load, gc and index
rebuild take ``--progress/--no-progress`` (:data:`ProgressOpt`) and report
through :func:`reporter`, which picks one of:

* a bar on stderr (rich): files done of files, bytes done of bytes, the rate
  over the last 5 s and an ETA, shown only once a rate is measured
  (:class:`registry.obs.progress.RateWindow`); the default when stderr is a
  terminal and ``--json`` is not given, or with ``--progress``;
* JSON lines on stderr with ``--json --progress`` (for CI), one object each,
  ``"record": "progress"`` and an ``"event"``: ``start`` (``what``, ``files``,
  ``bytes``: the totals, null when unknown), ``file`` (``name``, ``bytes``: one
  per file written; their ``bytes`` add up to the release's size),
  ``advance`` (``files_done``, ``bytes_done``, ``rate``: bytes/s or null; at
  most two a second), ``gate`` (``gate``, ``passed``, ``reason``) and
  ``finish`` (``files_done``, ``bytes_done``, ``seconds``). stdout's final
  JSON document is the same with or without them;
* nothing: ``--no-progress``, stderr not a terminal, or ``--json`` alone.

Gate results are printed (stdout, ``PASS``/``FAIL`` lines) as they are
decided, whichever of these is chosen, except with ``--json``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, TextIO

import typer

from registry.obs.progress import NULL, NullProgress, Progress, RateWindow

ProgressOpt = Annotated[bool | None, typer.Option(
    "--progress/--no-progress",
    help="Show progress on stderr: a bar (files, bytes, rate, ETA once measured), or with "
         "--json progress records as JSON lines [default: a bar when stderr is a "
         "terminal and --json is not given].")]


def _si(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class _Counts:
    """Totals and counts shared by the renderers (thread-safe)."""

    def __init__(self) -> None:
        self.what, self.unit = "", "files"
        self.files: int | None = None
        self.total: int | None = None
        self.files_done = self.done = 0
        self.rate = RateWindow()
        self.t0 = time.monotonic()
        self.lock = threading.Lock()

    def start(self, what: str, files: int | None, total: int | None, unit: str) -> None:
        with self.lock:
            self.what, self.files, self.total, self.unit = what, files, total, unit
            self.files_done = self.done = 0  # a new phase counts from nothing
        self.rate = RateWindow()

    def advance(self, n: int) -> None:
        with self.lock:
            self.done += n
        self.rate.add(n)

    def file_done(self) -> None:
        with self.lock:
            self.files_done += 1

    def finish(self) -> None:
        """The work is done: every file with it (work that reports bytes only,
        as pull does, reports no file one by one)."""
        with self.lock:
            if self.files is not None and not self.files_done:
                self.files_done = self.files
            if self.total is not None:
                self.total = max(self.total, self.done)

    def line(self) -> str:
        """``3/10 files  120.0 MB/300.0 MB  45.1 MB/s  ETA 0:00:04`` (no rate and
        no ETA until measured; no ``/?`` for an unknown total)."""
        parts = []
        if self.files is not None:  # "N files" until files are reported done
            parts.append(f"{self.files_done}/{self.files} {self.unit}" if self.files_done
                         else f"{self.files} {self.unit}")
        elif self.files_done:
            parts.append(f"{self.files_done} {self.unit}")
        if self.total is not None:  # an estimate (converted shards) never reads as overrun
            parts.append(f"{_si(self.done)}/{_si(max(self.total, self.done))}")
        elif self.done:
            parts.append(_si(self.done))
        r = self.rate.rate()
        if r is not None:
            parts.append(f"{_si(r)}/s")
            eta = self.rate.eta(self.done, self.total)
            if eta is not None:
                parts.append(f"ETA {_clock(eta)}")
        return "  ".join(parts)


class BarProgress:
    """A rich bar on stderr; removed when the work ends (the command's own
    summary line follows)."""

    def __init__(self, label: str, *, force: bool = False,
                 on_gates: Callable[[Sequence[Any]], None] | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn
        from rich.progress import Progress as RichProgress

        self.c = _Counts()
        self._on_gates = on_gates
        self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.fields[line]}"),
                                 console=Console(stderr=True, force_terminal=force or None),
                                 transient=True, refresh_per_second=8)
        self._task = self._bar.add_task(label, total=None, line="", start=False)
        self._label = label
        self._shown = 0.0
        self._bar.start()

    def _show(self, *, now: bool = True) -> None:
        """Update the bar; ``now=False`` (per chunk, from download threads) at
        most ten times a second (rich redraws eight times a second anyway)."""
        if not now:
            t = time.monotonic()
            if t - self._shown < 0.1:
                return
            self._shown = t
        total = self.c.total if self.c.total is not None else self.c.files
        done = self.c.done if self.c.total is not None else self.c.files_done
        self._bar.update(self._task, total=total, completed=done, line=self.c.line())

    def start(self, what: str, *, files: int | None = None, total: int | None = None,
              unit: str = "files") -> None:
        self.c.start(what, files, total, unit)
        self._bar.start_task(self._task)
        self._show()

    def advance(self, n: int) -> None:
        self.c.advance(n)
        self._show(now=False)

    def file_done(self, name: str, size: int) -> None:
        self.c.file_done()
        if self.c.total is None:
            self.c.advance(0)
        self._show()

    def gates(self, results: Sequence[Any]) -> None:
        if self._on_gates is not None:
            self._on_gates(results)

    def finish(self) -> None:
        self.c.finish()
        self._show()

    def close(self) -> None:
        self._bar.stop()


class JsonLinesProgress:
    """Progress records as JSON lines on ``out`` (stderr)."""

    def __init__(self, out: TextIO, *, interval: float = 0.5) -> None:
        self.c = _Counts()
        self._out, self._interval = out, interval
        self._last = 0.0
        self._write_lock = threading.Lock()

    def _emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"record": "progress", "event": event, **fields}, ensure_ascii=True)
        with self._write_lock:
            self._out.write(line + "\n")
            self._out.flush()

    def start(self, what: str, *, files: int | None = None, total: int | None = None,
              unit: str = "files") -> None:
        self.c.start(what, files, total, unit)
        self._emit("start", what=what, files=files, bytes=total, unit=unit)

    def advance(self, n: int) -> None:
        self.c.advance(n)
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._last = now
            self._emit("advance", files_done=self.c.files_done, bytes_done=self.c.done,
                       rate=self.c.rate.rate())

    def file_done(self, name: str, size: int) -> None:
        self.c.file_done()
        self._emit("file", name=name, bytes=size)

    def gates(self, results: Sequence[Any]) -> None:
        for r in results:
            self._emit("gate", gate=r.name, passed=r.passed, reason=r.reason)

    def finish(self) -> None:
        self.c.finish()
        self._emit("finish", files_done=self.c.files_done, bytes_done=self.c.done,
                   seconds=round(time.monotonic() - self.c.t0, 3))


class _GatesOnly(NullProgress):
    """No bar; gate results still reach ``on_gates`` as they are decided."""

    def __init__(self, on_gates: Callable[[Sequence[Any]], None] | None) -> None:
        self._on_gates = on_gates

    def gates(self, results: Sequence[Any]) -> None:
        if self._on_gates is not None:
            self._on_gates(results)


def wanted(flag: bool | None, as_json: bool) -> str:
    """Which renderer ``--progress/--no-progress`` (None: not given) and
    ``--json`` choose: ``"bar"``, ``"json"`` or ``"none"``."""
    if flag is False:
        return "none"
    if as_json:
        return "json" if flag else "none"
    if flag or sys.stderr.isatty():
        return "bar"
    return "none"


@contextmanager
def reporter(flag: bool | None, as_json: bool, label: str, *,
             on_gates: Callable[[Sequence[Any]], None] | None = None) -> Iterator[Progress]:
    """The :class:`registry.obs.progress.Progress` a command hands to the library,
    for as long as the block runs (the bar is removed on leaving it, error or
    not). ``on_gates`` prints gate results as they are decided (not with
    ``--json``: they are in its document)."""
    kind = wanted(flag, as_json)
    if kind == "json":
        yield JsonLinesProgress(sys.stderr)
        return
    gates = None if as_json else on_gates
    if kind == "none":
        yield _GatesOnly(gates) if gates is not None else NULL
        return
    bar = BarProgress(label, force=bool(flag), on_gates=gates)
    try:
        yield bar
    finally:
        bar.close()
