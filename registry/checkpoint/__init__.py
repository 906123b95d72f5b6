"""Training checkpoints: layouts, trees, the CheckpointManager (seeds 000 and 003)."""

from __future__ import annotations

from registry.checkpoint.layout import LAYOUTS, LOONGSAGE, TINYLLM, Layout, get_layout
from registry.checkpoint.manager import CheckpointManager, ResumeState, SaveResult
from registry.checkpoint.lease import WriterLease
from registry.checkpoint.tree import (
    CheckpointSkippedWarning,
    CheckpointTree,
    RetentionSkippedWarning,
    StepInfo,
)
from registry.checkpoint.loongsage import (
    LoongSageCheckpointer,
    LoongSaveResult,
    TrainingState,
    load_dist_ckpt,
    load_training_state,
)
from registry.layout import run_root

__all__ = ["LAYOUTS", "LOONGSAGE", "TINYLLM", "CheckpointManager", "CheckpointSkippedWarning",
           "CheckpointTree", "Layout", "LoongSageCheckpointer", "LoongSaveResult", "ResumeState",
           "RetentionSkippedWarning", "SaveResult", "StepInfo", "TrainingState", "WriterLease",
           "get_layout", "load_dist_ckpt", "load_training_state", "run_root"]
