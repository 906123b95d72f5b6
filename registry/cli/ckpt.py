"""``registry ckpt``: list, inspect, verify and prune a run's checkpoints."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from registry.rules.numbers import INT_MAX
from registry.checkpoint.layout import LOONGSAGE, TINYLLM, get_layout
from registry.checkpoint.tree import CheckpointTree, StepInfo
from registry.checkpoint.lease import describe as describe_holder
from registry.cli.app import JsonOpt, StoreOpt, RegistryTyper, app, nothing_stored, print_json
from registry.cli.errors import EXIT_FAILED, at_least, error_boundary, fail
from registry.cli.output import echo
from registry.errors import (
    NoValidCheckpointError,
    NotCommittedError,
    ObjectNotFoundError,
    PointerError,
    UsageError,
)
from registry.facade.documents import checkpoint_list
from registry.protocol.layout import claim_key, run_root
from registry.rules.names import check_name
from registry.store import Store, join, open_store
from registry.protocol.verify import verify_directory
from registry.rules.words import count

ckpt_app = RegistryTyper(help="Checkpoints of training runs (seed 000 and LoongSage trees).",
                       no_args_is_help=True)
app.add_typer(ckpt_app, name="ckpt")

RunArg = Annotated[str, typer.Argument(
    help="Run id (tinyllm: runs/<run>/ckpt in --store), or a LoongSage checkpoint_path: a "
         "folder or URL, or a key in --store.")]
LayoutOpt = Annotated[str, typer.Option(
    "--layout", help="tinyllm, loongsage, or auto (loongsage when RUN holds the tracker "
                     "file or train_step_<N> dirs, or is a URL or path).")]


def _is_location(run: str) -> bool:
    """RUN is a URL or a local path, never a run id or a key in --store."""
    return "://" in run or run.startswith(("/", ".", "~")) or os.path.isabs(run)


def _loongsage_location(run: str, store_url: str | None) -> tuple[Store, str]:
    """The store and key of a LoongSage checkpoint_path: RUN itself when it is a
    URL or path (or no --store is given), else the key RUN in --store."""
    if store_url and not _is_location(run):
        return open_store(store_url), run.strip("/")
    return open_store(run), ""


def _looks_loongsage(store: Store, root: str) -> bool:
    if store.exists(join(root, LOONGSAGE.pointer)):
        return True
    return any(is_dir and LOONGSAGE.parse_dir(name) is not None
               for name, is_dir in store.list_dir(root))


def _looks_loongsage_at(run: str, store_url: str | None) -> bool:
    """RUN (a key in --store, or without --store a relative folder) holds a
    LoongSage tree. Without --store, a folder that does not exist is no tree:
    RUN is then a run id of the default store."""
    if store_url is None and not os.path.isdir(os.path.expanduser(run)):
        return False
    return _looks_loongsage(*_loongsage_location(run, store_url))


def open_tree(run: str, store_url: str | None, layout: str) -> CheckpointTree:
    """The checkpoint tree RUN names, in the layout asked for or detected."""
    if layout == "auto":
        if _is_location(run):
            layout = "loongsage"
        elif _looks_loongsage_at(run, store_url):
            layout = "loongsage"
        elif "/" in run and not store_url:
            layout = "loongsage"
        else:
            layout = "tinyllm"
    if get_layout(layout) is LOONGSAGE:
        return CheckpointTree(*_loongsage_location(run, store_url), LOONGSAGE)
    return CheckpointTree(open_store(store_url), run_root(check_name(run, "run_id")), TINYLLM)


def _require_tree(tree: CheckpointTree, run: str) -> None:
    """Raise ObjectNotFoundError when nothing is stored where RUN points (a typo
    in a run id or path must not read as "a run without checkpoints")."""
    if nothing_stored(tree.store, tree.root):
        what = "run" if tree.layout is TINYLLM else "checkpoint tree"
        raise ObjectNotFoundError(f"{tree.store.url_of(tree.root)}: no such {what} {run!r} "
                                  "(nothing stored there)", key=tree.root)


def _refuse_foreign(tree: CheckpointTree) -> None:
    """Raise UsageError when retention would delete LoongSage-written steps."""
    try:
        latest = tree.latest()
    except PointerError:
        return  # retention deletes no uncommitted step without a usable pointer
    if latest is None:
        return
    foreign = [tree.layout.step_dir(s) for s in tree.steps() if s < latest
               and verify_directory(tree.store, tree.prefix(s)).manifest is None
               and not tree.store.exists(claim_key(tree.prefix(s)))]
    if foreign:
        raise UsageError(f"{tree.store.url_of(tree.root)}: {', '.join(foreign)} "
                         f"{'has' if len(foreign) == 1 else 'have'} no MANIFEST.json and no "
                         "claim (written by LoongSage itself, or half deleted); gc would "
                         "delete them: pass --force to")


@ckpt_app.command("ls")
def ckpt_ls(run: RunArg, store: StoreOpt = None, layout: LayoutOpt = "auto",
            full: Annotated[bool, typer.Option("--full", help="Verify sha256 too.")] = False,
            as_json: JsonOpt = False) -> None:
    """List step directories: step, committed, verified, bytes."""
    with error_boundary(as_json):
        tree = open_tree(run, store, layout)
        _require_tree(tree, run)
        doc = checkpoint_list(tree, full=full)
    if as_json:
        print_json(doc)
        return
    if not doc["steps"]:
        echo(f"{doc['tree']}: no step directories", err=True)
        return
    echo(f"{'step':>10}  {'committed':9}  {'verified':8}  {'bytes':>14}  latest")
    for d in doc["steps"]:
        echo(f"{d['step']:>10}  {'yes' if d['committed'] else 'no':9}  "
                   f"{'yes' if d['verified'] else 'no':8}  {d['bytes'] or 0:>14}  "
                   f"{'*' if d['step'] == doc['latest'] else ''}")


@ckpt_app.command("latest")
def ckpt_latest(run: RunArg, store: StoreOpt = None, layout: LayoutOpt = "auto",
                as_json: JsonOpt = False) -> None:
    """Print the step the pointer (LATEST or the tracker file) names, verified.

    Exits 1 when there is no pointer or the step it names does not verify.
    """
    with error_boundary(as_json):
        tree = open_tree(run, store, layout)
        _require_tree(tree, run)
        step = tree.latest()
        if step is None:
            raise NoValidCheckpointError(f"{tree.store.url_of(tree.pointer_key)}: no pointer")
        info = tree.info(step, full=False)
    if as_json:
        print_json(info.to_dict())
    else:
        echo(f"{tree.layout.step_dir(step)}\t{tree.store.url_of(info.prefix)}\t"
                   f"{'verified' if info.report.ok else 'NOT COMMITTED'}")
    if not info.report.ok:
        fail(f"{tree.store.url_of(info.prefix)}: the pointer names a step that does not "
             f"verify ({info.report.error or 'files differ from MANIFEST.json'})", EXIT_FAILED,
             as_json=as_json, path=tree.store.url_of(info.prefix))


@ckpt_app.command("verify")
def ckpt_verify(run: RunArg, store: StoreOpt = None, layout: LayoutOpt = "auto",
                step: Annotated[int | None, typer.Option("--step", max=INT_MAX,
                                                         help="Only this step.")] = None,
                as_json: JsonOpt = False) -> None:
    """Verify every step (or --step N) fully, sha256 included. Exits 1 on any failure.

    A step directory without MANIFEST.json (a crashed save, or a deletion cut
    short) is not a checkpoint: readers ignore it, the next save or `ckpt gc`
    removes it. It is listed as SKIP and fails the run only when named with
    --step or when the pointer names it."""
    with error_boundary(as_json):
        at_least("--step", step, 0)
        tree = open_tree(run, store, layout)
        _require_tree(tree, run)
        if step is not None and step not in tree.steps():
            key = tree.prefix(step)
            raise ObjectNotFoundError(f"{tree.store.url_of(key)}: no such step", key=key)
        steps = [step] if step is not None else tree.steps()
        infos = [tree.info(s, full=True) for s in steps]
        try:
            latest = tree.latest()
        except PointerError:
            latest = None

    def ignored(i: StepInfo) -> bool:
        return (i.report.manifest is None and isinstance(i.report.error, NotCommittedError)
                and step is None and i.step != latest)
    if as_json:
        print_json([{**i.to_dict(), "ignored": ignored(i)} for i in infos])
    else:
        for i in infos:
            problems = i.to_dict()["problems"]
            label = "OK  " if i.report.ok else ("SKIP" if ignored(i) else "FAIL")
            note = " (ignored by readers; removed by the next save or `ckpt gc`)" \
                if ignored(i) else ""
            echo(f"{label} {tree.layout.step_dir(i.step)}"
                       + (": " + "; ".join(map(str, problems)) if problems else "") + note)  # type: ignore[arg-type]
    checked = [i for i in infos if not ignored(i)]
    bad = [tree.layout.step_dir(i.step) for i in checked if not i.report.ok]
    if not checked:
        fail(f"{tree.store.url_of(tree.root)}: no committed step to verify", EXIT_FAILED,
             as_json=as_json, path=tree.store.url_of(tree.root))
    if bad:
        fail(f"{tree.store.url_of(tree.root)}: {', '.join(bad)} "
             f"{'does' if len(bad) == 1 else 'do'} not verify", EXIT_FAILED, as_json=as_json,
             path=tree.store.url_of(tree.root))


@ckpt_app.command("gc")
def ckpt_gc(run: RunArg, keep: Annotated[int | None, typer.Option(
                "--keep", help="Committed steps to keep, at least 1 (the pointer's "
                                      "step is always kept too).")] = None,
            keep_best: Annotated[int, typer.Option(
                "--keep-best", metavar="K", help="Also keep the K steps with the best "
                "--metric (a number in the step's trainer_state.json).")] = 0,
            metric: Annotated[str | None, typer.Option(
                "--metric", help="trainer_state.json field --keep-best ranks by, e.g. "
                                 "loss.")] = None,
            mode: Annotated[str, typer.Option(
                "--mode", help="min (lowest is best, default) or max.")] = "min",
            keep_every: Annotated[int, typer.Option(
                "--keep-every", metavar="K", help="Also keep every step that is a multiple "
                                                  "of K.")] = 0,
            keep_interval: Annotated[str | None, typer.Option(
                "--keep-interval", metavar="DURATION", help="Also keep the newest step of "
                "each interval of commit time, e.g. 1h or 30m.")] = None,
            store: StoreOpt = None, layout: LayoutOpt = "auto",
            force: Annotated[bool, typer.Option(
                "--force", help="LoongSage trees: delete step dirs without a manifest (and "
                                "without a claim) too.")] = False,
            as_json: JsonOpt = False) -> None:
    """Delete committed steps beyond the KEEP newest (and the KEEP newest resumable
    ones), stale staging dirs, claims and uncommitted steps older than the pointer
    (MANIFEST.json first). Deletes nothing (exit 5) when the pointer cannot be read.

    A resumable step (optimizer.safetensors, dist_ckpt/) is never deleted to keep
    a newer export-only one; without a pointer every resumable step is kept. On a
    LoongSage tree, step directories without a manifest that no crashed save of
    ours claimed were most likely written by LoongSage itself: gc refuses to
    delete them (exit 2) unless --force. Beside a live writer (the run's
    WRITER.lease held by a process that is alive or renewed it in time) only
    committed steps older than the pointer go; staging dirs, claims and
    uncommitted steps stay, and a note names the writer.

    --keep-best/--keep-every/--keep-interval add retention rules (kept: the
    union of every rule given; see docs/loongsage-ranks.md). Whatever the
    rules, the pointer's step, the newest resumable step and every step a
    release names are kept."""
    with error_boundary(as_json):
        if keep is not None:
            at_least("--keep", keep, 1)
        from registry.checkpoint.retention import RetentionPolicy
        from registry.lifecycle.gc import parse_duration

        policy = RetentionPolicy(
            keep_last=keep or 0, keep_best=keep_best, metric=metric, mode=mode,
            keep_every=keep_every,
            keep_interval=0.0 if keep_interval is None else parse_duration(
                keep_interval, what="--keep-interval"))
        if not policy.active:
            raise UsageError("ckpt gc needs --keep, --keep-best, --keep-every or "
                             "--keep-interval")
        tree = open_tree(run, store, layout)
        _require_tree(tree, run)
        if tree.layout is LOONGSAGE and not force:
            _refuse_foreign(tree)
        busy = tree.live_writer()
        deleted = tree.retain(keep or 0, policy=policy)
    spared = None if busy is None else describe_holder(busy)
    if spared:
        echo(f"{tree.store.url_of(tree.root)}: a writer is saving into this run "
                   f"({spared}): its staging directories, claims and uncommitted steps, "
                   "and steps past the pointer, were left alone", err=True)
    if as_json:
        print_json({"deleted": [tree.store.url_of(k) for k in deleted], "live_writer": spared})
    else:
        for k in deleted:
            echo(f"deleted {tree.store.url_of(k)}")
        if not deleted:
            what = f"the {keep} newest committed steps" if keep else "the steps its rules name"
            echo(f"nothing to delete in {tree.store.url_of(tree.root)} (keeping "
                       f"{what} and the pointer's)", err=True)


@ckpt_app.command("adopt")
def ckpt_adopt(checkpoint_path: Annotated[str, typer.Argument(
                   help="LoongSage checkpoint_path written without manifests (folder or "
                        "URL, or a key in --store).")],
               store: StoreOpt = None,
               run_id: Annotated[str | None, typer.Option(
                   "--run-id", help="run_id for the manifest (default: from the path).")] = None,
               as_json: JsonOpt = False) -> None:
    """Hash the step the tracker file vouches for and commit it in place: write its
    MANIFEST.json (conditional create). Afterwards `ckpt verify` checks it."""
    with error_boundary(as_json):
        tree = open_tree(checkpoint_path, store, "loongsage")
        _require_tree(tree, checkpoint_path)
        from registry.checkpoint.loongsage import adopt  # the LoongSage stack: numpy

        result = adopt(tree.store, tree.root, run_id=run_id)
    if as_json:
        print_json(result.to_dict())
    elif result.already:
        echo(f"{result.path}: already adopted (manifest verifies)")
    else:
        echo(f"adopted {result.path}: {count(len(result.manifest.files), 'file')}, "
                   f"{result.manifest.total_size} bytes, manifest sha256 "
                   f"{result.manifest.digest}")
