"""LoongSage checkpoint trees (seed 003): save, load, adopt.

The public API; the work is split over :mod:`~registry.checkpoint.loongsage_save`,
:mod:`~registry.checkpoint.loongsage_load`, :mod:`~registry.checkpoint.loongsage_adopt`
and the names in :mod:`~registry.checkpoint.loongsage_format`::

    ckpt = LoongSageCheckpointer("s3://bucket/exp", "run1", save_freq=10, total_steps=100,
                                 save_hf=True, hf_config=config, topology={"tp": 2})
    for step in range(start + 1, 101):
        ckpt.on_step_start()            # finalizes the previous async save
        ...train...
        ckpt.maybe_save(step, model=params, optimizer_state=opt, optimizer="adamw",
                        scheduler_state=sched, rng_state=rng,
                        data_sources=[{"prompt_data_path": p, "state": s}, ...])
    ckpt.finish()                       # blocking flush

    state = load_training_state("s3://bucket/exp", "run1", hf_model_path="/models/base",
                                data_sources=[p, ...], topology={"tp": 2})
    ref = load_dist_ckpt("s3://bucket/exp", "run1/train_step_50/dist_ckpt")
"""

from __future__ import annotations

from registry.checkpoint.loongsage_adopt import AdoptResult, adopt
from registry.checkpoint.loongsage_data import PIPELINE, DataSourceState, data_file
from registry.checkpoint.loongsage_format import (
    DataSourceFreshWarning,
    NoTrackerWarning,
    RngSkippedWarning,
    derive_run_id,
)
from registry.checkpoint.loongsage_load import (
    DistCheckpoint,
    TrainingState,
    load_dist_ckpt,
    load_training_state,
)
from registry.checkpoint.loongsage_refs import (
    Teacher,
    WeightSource,
    WeightSources,
    check_dist_ckpt_path,
    check_hf_path,
    check_reference,
    check_teachers,
    check_weight_sources,
)
from registry.checkpoint.loongsage_rollout import RolloutData, RolloutStep
from registry.checkpoint.loongsage_save import LoongSageCheckpointer, LoongSaveResult

__all__ = ["PIPELINE", "AdoptResult", "DataSourceFreshWarning", "DataSourceState",
           "DistCheckpoint", "LoongSageCheckpointer", "LoongSaveResult", "NoTrackerWarning",
           "RngSkippedWarning", "TrainingState", "adopt", "data_file", "derive_run_id",
           "load_dist_ckpt", "load_training_state",
           # issue 18 (data sources, rollout data, reference and teacher paths)
           "RolloutData", "RolloutStep", "Teacher", "WeightSource", "WeightSources",
           "check_dist_ckpt_path", "check_hf_path", "check_reference", "check_teachers",
           "check_weight_sources"]
