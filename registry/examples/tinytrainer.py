"""A small real trainer that checkpoints through the registry (seed 000).

A character-level MLP language model (Bengio-style: the previous ``context``
tokens are embedded, concatenated, passed through one tanh layer, and a
softmax over the vocabulary predicts the next token), trained with AdamW on a
deterministic synthetic corpus, on the CPU, with numpy only. Every step is
float32 throughout, so the F32 checkpoints hold the exact training state and a
resumed run continues *bitwise* as the uninterrupted one would have
(seed 000, "Resuming")::

    python -m registry.examples.tinytrainer --store ./artifacts --run-id r1 --steps 300 \\
        --ckpt-every 20 --keep-ckpts 3 --progress progress.jsonl --out out.json
    # killed? run it again with --resume (LATEST) or --resume step-000120

What a checkpoint holds (``runs/<run_id>/ckpt/step-<nnnnnn>/``):

- ``model.safetensors``: ``emb [vocab, d_embed]``, ``w1 [context*d_embed, d_hidden]``,
  ``b1 [d_hidden]``, ``w2 [d_hidden, vocab]``, ``b2 [vocab]``, F32;
- ``optimizer.safetensors``: ``<name>.exp_avg`` and ``<name>.exp_avg_sq`` per parameter;
- ``config.json``: the ``model`` section of the train spec;
- ``trainer_state.json``: the step (it drives the warmup + cosine schedule and
  AdamW's bias correction), tokens seen, the cursor of the next window, the
  PCG32 generator that draws the windows after it, the learning rate of the
  last step, and the sha256 of the canonical JSON of the train spec.

Data order: the corpus is ``shards`` token arrays of ``shard_tokens`` tokens;
a window is ``context + 1`` consecutive tokens (inputs and the target). The
window of each batch row is the cursor ``{source, shard, offset}``; once it is
taken, the PCG32 generator draws the next cursor (shard, then offset, each with
PCG32's unbiased bounded draw). So the cursor in a checkpoint names the next
window and the generator state continues the stream from there.

The spec, data stream, model and AdamW are :mod:`registry.examples.tinymodel`.
Checkpoints are saved every ``ckpt_every`` steps and at the last one with a
:class:`~registry.checkpoint.CheckpointManager`, asynchronously by default (a
background thread writes while the next steps run; ``poll()`` at each step).
"""

from __future__ import annotations

import os

# Single-threaded BLAS: a fixed summation order in every process, set before
# numpy is first imported when run as ``python -m registry.examples.tinytrainer``
# (examples/tinytrainer.py does the same). Importing the module changes no
# environment: a process that imported it once started every later child with
# these variables (and its fork-server children as new interpreters).
if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from registry.host import interrupt  # noqa: E402
from registry.rules import numbers  # noqa: E402
from registry.checkpoint import CheckpointManager, CheckpointSkippedWarning  # noqa: E402
from registry.protocol.commit import delete_directory  # noqa: E402
from registry.examples.tinymodel import (  # noqa: E402
    F32,
    PARAMS,
    PCG32,
    AdamW,
    Cursor,
    DataStream,
    eval_loss,
    forward,
    init_params,
    learning_rate,
    make_corpus,
    make_spec,
    spec_sha256,
    tensors_sha256,
)
from registry.errors import (  # noqa: E402
    CheckpointError,
    NoValidCheckpointError,
    PointerRegressionError,
    RegistryError,
)
from registry.store import join  # noqa: E402

# -- the training loop ---------------------------------------------------------------------


class TrainerError(CheckpointError):
    """The checkpoint tree of the run does not fit this trainer or its spec."""


def _log(msg: str) -> None:
    print(f"tinytrainer: {msg}", file=sys.stderr, flush=True)


@functools.lru_cache(maxsize=8)
def git_sha(cwd: str) -> str | None:
    """The commit (40 hex) checked out in the git work tree holding ``cwd``, or
    None when ``cwd`` is in none (or git is not installed): trainer_state.json's
    ``git_sha`` (seed 000), the code a checkpoint was trained with."""
    try:
        p = subprocess.run(["git", "-C", cwd, "rev-parse", "--verify", "-q", "HEAD"],
                           capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = p.stdout.strip()
    return sha if p.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", sha) else None


def _trainer_state(spec: Mapping[str, Any], sha: str, step: int, tokens_seen: int,
                   data: DataStream) -> dict[str, Any]:
    return {"step": step, "tokens_seen": tokens_seen, "data_cursor": data.cursor.to_dict(),
            "generator": data.gen.to_dict(),
            "learning_rate": learning_rate(spec, step) if step else 0.0,
            "spec_sha256": sha, "git_sha": git_sha(os.getcwd()), "spec": dict(spec)}


#: spec fields the command line sets, and the option that sets each
_OPTIONS = {"steps": "--steps", "seed": "--seed"}


def spec_difference(saved: Any, spec: Mapping[str, Any], saved_config: Any) -> str:
    """What differs between the spec a checkpoint was written with and this
    run's: each differing field with both values (``seed: 0 in the
    checkpoint, 1 now (--seed)``). ``saved`` is trainer_state's ``spec``
    (None for checkpoints written before it was recorded: then the model
    config is compared, and the fields that could differ are named)."""
    if not isinstance(saved, Mapping):
        if isinstance(saved_config, Mapping) and dict(saved_config) != spec["model"]:
            saved = {**spec, "model": dict(saved_config)}
        else:
            return ("written with another train spec (this checkpoint does not record "
                    "its spec: give the --steps and --seed it was trained with)")
    diffs = []  # the fields an option sets first: what the user changed
    for path, old, new in sorted(_differences(saved, spec, ""),
                                 key=lambda d: (d[0].split(".")[0] not in _OPTIONS, d[0])):
        top = path.split(".")[0]
        how = f" ({_OPTIONS[top]})" if top in _OPTIONS else ""
        diffs.append(f"{path}: {_short(old)} in the checkpoint, {_short(new)} now{how}")
    return "written with another train spec: " + "; ".join(diffs[:5]) + (
        f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else "")


def _differences(old: Any, new: Any, path: str) -> list[tuple[str, Any, Any]]:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{key}" if path else str(key)
            out += _differences(old.get(key, "(none)"), new.get(key, "(none)"), sub)
        return out
    return [] if old == new else [(path, old, new)]


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


class _Saver:
    """Saves through the manager, adopting step directories a killed
    predecessor committed but never pointed LATEST at (see ``save``)."""

    def __init__(self, mgr: CheckpointManager, start_step: int) -> None:
        self.mgr = mgr
        self.tree = mgr.tree
        self.leftovers = {s for s in self.tree.steps() if s > start_step}
        self.saved: list[int] = []
        self.adopted: list[int] = []

    def save(self, step: int, params: Mapping[str, np.ndarray], opt: AdamW,
             config: Mapping[str, Any], state: dict[str, Any]) -> None:
        # A step directory above the one we resumed from was left by a killed
        # predecessor: uncommitted (the manager cleans it), committed but
        # never named by LATEST (killed between the seed's steps 3 and 4), or
        # half deleted. The manager refuses to save onto a committed step, so
        # an identical committed one is adopted and anything else is removed.
        if step in self.leftovers:
            self.mgr.wait()  # LATEST is forward-only: earlier saves land first
            prefix = self.tree.prefix(step)
            info = self.tree.info(step, full=True)
            if info.report.ok and json.loads(self.mgr.store.read_bytes(
                    join(prefix, "trainer_state.json"))) == state:
                with contextlib.suppress(PointerRegressionError):  # LATEST is further
                    self.tree.set_latest(step)
                self.tree.retain(self.mgr.keep_ckpts)
                self.adopted.append(step)
                return
            delete_directory(self.mgr.store, prefix)
        self.mgr.save(step, params, opt.state, optimizer="adamw", config=config,
                      trainer_state=state)
        self.saved.append(step)


def train(store_url: str, run_id: str, steps: int, *, ckpt_every: int, keep_ckpts: int,
          resume: bool | str | None = False, progress_file: str | os.PathLike[str] | None = None,
          async_save: bool = True, out: str | os.PathLike[str] | None = None, seed: int = 0,
          batch_size: int = 64, model: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Train (or continue) run ``run_id`` to ``steps`` steps, checkpointing in the store.

    Args:
        store_url: registry store URL (local path, ``s3://``, ``memory://``).
        run_id: checkpoints go to ``runs/<run_id>/ckpt/``.
        steps: total optimizer steps of the run.
        ckpt_every: save every that many steps (and always at ``steps``).
        keep_ckpts: committed checkpoints kept (``<= 0``: all).
        resume: False: start fresh (the run must have no checkpoint);
            True or None: continue from the step LATEST names (or the newest
            older one that verifies); a string: from that step directory.
            When resuming finds no checkpoint that verifies, start fresh.
        progress_file: JSON Lines file for the ``{"kind": "ckpt", ...}`` events.
        async_save: save on a background thread (``poll()`` at every step).
        out: write the result (below) there as JSON too (atomically).
        seed, batch_size, model: the train spec (see :func:`make_spec`);
            resuming requires the same spec (its sha256 is in trainer_state).

    Returns:
        ``{"run_id", "steps", "spec_sha256", "resumed_from" (step or None),
        "final_loss" (eval loss of the final weights, ``float.hex``),
        "final_loss_repr", "last_train_loss" (hex, None if no step ran here),
        "weights_sha256", "optimizer_sha256", "trainer_state", "saved",
        "adopted" (steps committed by a killed predecessor and re-pointed),
        "seconds"}``. Identical for a run resumed any number of times and an
        uninterrupted one, except ``resumed_from``, ``last_train_loss``,
        ``saved``, ``adopted`` and ``seconds``.

    Raises:
        TrainerError: a fresh start on a run that has checkpoints, or a
            checkpoint of another spec or optimizer.
        CheckpointError: ``resume`` names no step directory of the run.
        Any error of a checkpoint save.
    """
    t0 = time.perf_counter()
    if ckpt_every < 1:
        raise ValueError(f"ckpt_every {ckpt_every} must be >= 1")
    spec = make_spec(steps, seed=seed, batch_size=batch_size, model=model)
    sha = spec_sha256(spec)
    shards, eval_shard = make_corpus(spec)
    mgr = CheckpointManager(store_url, run_id, keep_ckpts=keep_ckpts,
                            progress_file=progress_file, async_save=async_save)
    try:
        params, opt, data, step, tokens_seen, resumed_from = _start(
            mgr, spec, sha, shards, resume)
        saver = _Saver(mgr, step)
        last_loss: np.float32 | None = None
        while step < steps:
            mgr.poll()  # finalize a landed async save; raise if it failed
            tokens = data.batch(spec["batch_size"])
            loss, grads = forward(params, tokens, grad=True)
            assert grads is not None
            step += 1
            lr = learning_rate(spec, step)
            opt.step(params, grads, step=step, lr=lr)
            tokens_seen += tokens.size
            last_loss = loss
            if step % ckpt_every == 0 or step == steps:
                saver.save(step, params, opt, spec["model"],
                           {**_trainer_state(spec, sha, step, tokens_seen, data),
                            "loss": float(loss)})
        mgr.close()
    except BaseException:
        with contextlib.suppress(Exception):  # let an in-flight save land
            mgr.close()
        raise
    final_loss = eval_loss(params, spec, eval_shard)
    result = {
        "run_id": run_id, "steps": steps, "spec_sha256": sha, "resumed_from": resumed_from,
        "final_loss": float(final_loss).hex(), "final_loss_repr": repr(float(final_loss)),
        "last_train_loss": float(last_loss).hex() if last_loss is not None else None,
        "weights_sha256": tensors_sha256(params), "optimizer_sha256": tensors_sha256(opt.state),
        "trainer_state": _trainer_state(spec, sha, step, tokens_seen, data),
        "saved": saver.saved, "adopted": saver.adopted,
        "seconds": round(time.perf_counter() - t0, 6),
    }
    if out is not None:
        tmp = f"{os.fspath(out)}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(numbers.dumps(result, indent=2))
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    return result


def _start(mgr: CheckpointManager, spec: Mapping[str, Any], sha: str, shards: list[np.ndarray],
           resume: bool | str | None,
           ) -> tuple[dict[str, np.ndarray], AdamW, DataStream, int, int, int | None]:
    """The training state to begin with: resumed from a checkpoint, or fresh."""
    if resume is not False:
        path = resume if isinstance(resume, str) else None
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", CheckpointSkippedWarning)
                rs = mgr.resume(path)
        except NoValidCheckpointError as e:
            _log(f"no checkpoint to resume from ({e}); starting fresh")
        else:
            for w in caught:
                _log(str(w.message))
            ts = rs.trainer_state
            if ts["spec_sha256"] != sha:
                raise TrainerError(f"{rs.path}: {spec_difference(ts.get('spec'), spec, rs.config)}"
                                   "; resume with the arguments the run was started with, "
                                   "or train another run id")
            if rs.optimizer != "adamw" or rs.config != spec["model"]:
                raise TrainerError(f"{rs.path}: optimizer {rs.optimizer!r} / config "
                                   "differ from the spec")
            moments = {f"{k}.{s}" for k in PARAMS for s in ("exp_avg", "exp_avg_sq")}
            if set(rs.model) != set(PARAMS) or set(rs.optimizer_state) != moments:
                raise TrainerError(f"{rs.path}: tensors {sorted(rs.model)} / "
                                   f"{sorted(rs.optimizer_state)} are not this model's")
            c = ts["data_cursor"]
            data = DataStream(spec, shards, PCG32.from_dict(ts["generator"]),
                              Cursor(c["source"], c["shard"], c["offset"]))
            params = {k: np.array(rs.model[k], dtype=F32, copy=True) for k in PARAMS}
            _log(f"resumed from {rs.path} (step {rs.step})")
            return (params, AdamW(spec, params, rs.optimizer_state), data, rs.step,
                    ts["tokens_seen"], rs.step)
    elif any(mgr.tree.info(s).report.manifest is not None for s in mgr.tree.steps()):
        raise TrainerError(f"{mgr.store.url_of(mgr.tree.root)}: run {mgr.run_id} already "
                           "has checkpoints; resume it or use another run id")
    params = init_params(spec)
    data = DataStream(spec, shards, PCG32.seeded(spec["seed"], 54))
    return params, AdamW(spec, params), data, 0, 0, None


# -- CLI ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tinytrainer", description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True, help="store URL (path, s3://, memory://)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--steps", type=int, required=True, help="total optimizer steps")
    p.add_argument("--ckpt-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--keep-ckpts", type=int, default=3,
                   help="committed checkpoints to keep (<= 0: all)")
    p.add_argument("--resume", nargs="?", const=True, default=False, metavar="STEP_DIR",
                   help="continue from LATEST, or from STEP_DIR; fresh if none verifies")
    p.add_argument("--progress", help="JSON Lines progress file (ckpt events)")
    p.add_argument("--sync", action="store_true", help="save synchronously")
    p.add_argument("--out", help="write the result JSON here")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    interrupt.terminate_like_interrupt()  # preempted (SIGTERM): unwind as on Ctrl-C
    try:
        result = train(args.store, args.run_id, args.steps, ckpt_every=args.ckpt_every,
                       keep_ckpts=args.keep_ckpts, resume=args.resume,
                       progress_file=args.progress, async_save=not args.sync, out=args.out,
                       seed=args.seed)
    except RegistryError as e:  # a user error: one line, no traceback
        _log(f"error: {e}")
        return 2
    except KeyboardInterrupt:  # the save in flight landed or was unwound; LATEST is whole
        _log(f"interrupted by {interrupt.signal_name()}: resume with --resume")
        return interrupt.exit_code()
    _log(f"step {result['trainer_state']['step']}: eval loss {result['final_loss_repr']}, "
         f"weights {result['weights_sha256'][:16]}, {result['seconds']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
