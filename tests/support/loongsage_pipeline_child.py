"""A fully_async LoongSage training job for the kill test (tests/test_loongsage_pipeline.py).

``python tests/support/loongsage_pipeline_child.py URL CHECKPOINT_PATH HF_DIR [--no-pipeline]``

A toy of seed 003's fully_async mode, with every item traceable:

* the data source ``prompts.jsonl`` is the prompt ids ``0..N-1``; its state is
  the cursor (the next id to read);
* the dataloader reads prompts in chunks of ``CHUNK`` into the *prompt buffer*
  (read, not yet consumed);
* rollout takes ``ROLLOUT`` prompts at a time from the prompt buffer and puts
  their trajectories into the *pipeline buffer* (in flight), keeping it
  ``DEPTH`` items ahead of the trainer;
* each train step consumes ``BATCH`` items from the pipeline buffer; the model
  is ``counts`` (shape ``[N]``, F32): ``counts[id] += 1`` per consumed item.

Every item is consumed exactly once iff the final ``counts`` are all 1. The job
saves every ``SAVE_FREQ`` steps with async save, capturing the cursor and the
prompt buffer in ``data_source/`` and the pipeline buffer with
``snapshot_pipeline_buf``; it resumes from the tracked step when there is one.
It prints ``STEP <n>`` after each step (the test SIGKILLs it after one) and
``DONE`` at the end. ``--no-pipeline`` saves no pipeline snapshot (the control
that shows the test can see a loss). The S3 endpoint comes from ``AWS_*``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque

import numpy as np

N, CHUNK, ROLLOUT, DEPTH, BATCH = 48, 4, 3, 6, 3
TOTAL_STEPS, SAVE_FREQ = N // BATCH, 2
SOURCE = "prompts.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("checkpoint_path")
    ap.add_argument("hf_dir")
    ap.add_argument("--no-pipeline", action="store_true")
    ap.add_argument("--step-seconds", type=float, default=0.05)
    args = ap.parse_args()
    from registry.checkpoint.loongsage import LoongSageCheckpointer, load_training_state

    counts = np.zeros(N, dtype=np.float32)
    cursor, prompts, pipeline = 0, deque(), deque()
    # The writer first: it creates a new local store that loading then reads.
    ckpt = LoongSageCheckpointer(
        args.url, args.checkpoint_path, save_freq=SAVE_FREQ, total_steps=TOTAL_STEPS,
        async_save=True,
        snapshot_pipeline_buf=None if args.no_pipeline else (lambda: list(pipeline)))
    state = load_training_state(args.url, args.checkpoint_path, hf_model_path=args.hf_dir,
                                data_sources=[SOURCE])
    if state.source == "checkpoint":
        counts = state.model["counts"].copy()
        ds = state.data_sources[0]
        cursor = ds.state["cursor"]
        prompts.extend(ds.prompt_buffer)
        pipeline.extend(state.pipeline_buf or ())
    print(f"RESUMED {state.step}", flush=True)
    for step in range(state.step + 1, TOTAL_STEPS + 1):
        ckpt.on_step_start()
        while len(pipeline) < DEPTH + BATCH:  # rollout runs ahead of the trainer
            if len(prompts) < ROLLOUT and cursor < N:
                take = min(CHUNK, N - cursor)
                prompts.extend(range(cursor, cursor + take))
                cursor += take
            if not prompts:
                break
            for _ in range(min(ROLLOUT, len(prompts))):
                pid = prompts.popleft()
                pipeline.append({"prompt": pid, "response": f"r{pid}"})
        for _ in range(min(BATCH, len(pipeline))):  # short only once items were lost
            counts[pipeline.popleft()["prompt"]] += 1
        time.sleep(args.step_seconds)
        ckpt.maybe_save(step, model={"counts": counts},
                        optimizer_state={"counts.exp_avg": np.zeros(N, np.float32),
                                         "counts.exp_avg_sq": np.zeros(N, np.float32)},
                        scheduler_state={"step": step}, rng_state=None,
                        data_sources=[{"prompt_data_path": SOURCE,
                                       "state": {"cursor": cursor},
                                       "prompt_buffer": list(prompts)}])
        print(f"STEP {step}", flush=True)
    ckpt.finish()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
