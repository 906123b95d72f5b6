"""Training checkpoints: layouts, trees, the CheckpointManager (seeds 000 and 003).

The names load on first use (:mod:`registry.host.lazy`): code that needs only the
key shapes of :mod:`registry.checkpoint.layout` does not load the writers.


Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.host.lazy import exports

if TYPE_CHECKING:
    from registry.checkpoint.layout import LAYOUTS, LOONGSAGE, TINYLLM, Layout, get_layout
    from registry.checkpoint.lease import WriterLease
    from registry.checkpoint.loongsage import (
        LoongSageCheckpointer,
        LoongSaveResult,
        TrainingState,
        load_dist_ckpt,
        load_training_state,
    )
    from registry.checkpoint.manager import CheckpointManager, ResumeState, SaveResult
    from registry.checkpoint.preempt import PreemptionWatch, Preempted
    from registry.checkpoint.retention import RetentionPolicy
    from registry.checkpoint.tree import (
        CheckpointSkippedWarning,
        CheckpointTree,
        RetentionSkippedWarning,
        StepInfo,
    )
    from registry.protocol.layout import run_root

__getattr__, __dir__, __all__ = exports(__name__, {
    "registry.checkpoint.layout": ("LAYOUTS", "LOONGSAGE", "TINYLLM", "Layout", "get_layout"),
    "registry.checkpoint.lease": ("WriterLease",),
    "registry.checkpoint.loongsage": ("LoongSageCheckpointer", "LoongSaveResult",
                                      "TrainingState", "load_dist_ckpt",
                                      "load_training_state"),
    "registry.checkpoint.manager": ("CheckpointManager", "ResumeState", "SaveResult"),
    "registry.checkpoint.preempt": ("PreemptionWatch", "Preempted"),
    "registry.checkpoint.retention": ("RetentionPolicy",),
    "registry.checkpoint.tree": ("CheckpointSkippedWarning", "CheckpointTree",
                                 "RetentionSkippedWarning", "StepInfo"),
    "registry.protocol.layout": ("run_root",),
})
