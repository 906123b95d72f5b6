"""Training checkpoints: layouts, trees, the CheckpointManager (seeds 000 and 003)."""

from __future__ import annotations

from registry.checkpoint.layout import LAYOUTS, LOONGSAGE, TINYLLM, Layout, get_layout, run_root
from registry.checkpoint.manager import CheckpointManager, ResumeState, SaveResult
from registry.checkpoint.tree import CheckpointSkippedWarning, CheckpointTree, StepInfo

__all__ = ["LAYOUTS", "LOONGSAGE", "TINYLLM", "CheckpointManager", "CheckpointSkippedWarning",
           "CheckpointTree", "Layout", "ResumeState", "SaveResult", "StepInfo", "get_layout",
           "run_root"]
