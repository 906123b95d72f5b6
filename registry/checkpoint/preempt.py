"""Save on preemption (issue 46 item 4): a preemption notice (SIGTERM, as
every cloud and Slurm send, or another configured signal) makes a training
job finish the save in flight, save the step it is on, move the tracker and
exit 143, instead of losing everything since its last scheduled save.

The signal handler only records the notice (the time it arrived); the
checkpointer acts on it at its next ``maybe_save`` (the end of the step the
notice interrupted), on the training loop's thread, where a save may run.
On N ranks the notice may reach the ranks at different steps, or only some
of them: every ``maybe_save`` first agrees, with one all-reduce (MAX) of a
one-element tensor on a process group of its own (never training's, never
the save's: the save's group may be busy on the writer thread, see
docs/loongsage-ranks.md), so all ranks save the same step and exit together.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from registry.host.interrupt import EXIT_SIGTERM

#: :meth:`PreemptionWatch.state` values, ordered: the largest wins across ranks.
NONE, SAVE, LATE = 0, 1, 2


class Preempted(SystemExit):
    """The job saved ``step`` on a preemption notice and exits (code 143,
    128 + SIGTERM, what a shell reports for a process SIGTERM ended).

    Attributes:
        step: the step saved (and tracked), or None when no save was due or
            possible (both save switches off, or the grace period was over).
    """

    def __init__(self, step: int | None, signum: int) -> None:
        super().__init__(EXIT_SIGTERM)
        self.step = step
        self.signum = signum

    def __str__(self) -> str:
        name = signal.Signals(self.signum).name if self.signum else "a peer rank's notice"
        saved = f"saved step {self.step}" if self.step is not None else "no step saved"
        return f"preempted by {name}: {saved}"


class PreemptionWatch:
    """Records preemption notices: ``signals`` handled (in the main thread)
    by noting the time, until :meth:`close` restores the previous handlers.

    Args:
        signals: the notices (default SIGTERM).
        grace_seconds: how long after the notice the extra save may still
            start (a scheduler's kill follows its notice: Kubernetes 30 s by
            default, Slurm's ``--signal`` lead time); past it the job only
            finishes the save in flight and exits.

    Raises:
        ValueError: ``grace_seconds`` not positive.
    """

    def __init__(self, signals: Iterable[int] = (signal.SIGTERM,), *,
                 grace_seconds: float = 60.0) -> None:
        if not grace_seconds > 0:
            raise ValueError(f"grace_seconds {grace_seconds!r} must be positive")
        self.grace_seconds = float(grace_seconds)
        self.signum = 0
        self.at: float | None = None
        self._old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for s in signals:
                self._old[int(s)] = signal.signal(s, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        if self.at is None:
            self.signum, self.at = signum, time.monotonic()

    @property
    def requested(self) -> bool:
        """Whether a notice arrived in this process."""
        return self.at is not None

    def state(self) -> int:
        """0: no notice; 1: a notice within the grace period; 2: past it."""
        if self.at is None:
            return NONE
        return SAVE if time.monotonic() - self.at < self.grace_seconds else LATE

    def agreed(self, group: Any = None) -> int:
        """The :meth:`state` of the rank furthest along (collective under a
        process group, see :func:`agree`), so every rank acts the same."""
        return agree([self.state()], group)[0]

    def close(self) -> None:
        """Restore the handlers the watch replaced."""
        old, self._old = self._old, {}
        for s, handler in old.items():
            signal.signal(s, handler)


def agree(values: list[int], group: Any = None) -> list[int]:
    """Each of ``values`` at its largest over the ranks of ``group``
    (collective: one all-reduce MAX of a small tensor on ``group``; without
    an initialized process group, ``values`` themselves)."""
    dist = sys.modules.get("torch.distributed")  # a one-process job may have no torch
    if dist is None or not dist.is_initialized():
        return list(values)
    import torch

    flags = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    return [int(v) for v in flags.tolist()]
