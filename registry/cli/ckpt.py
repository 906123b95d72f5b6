"""``registry ckpt``: list, inspect, verify and prune a run's checkpoints."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from registry.checkpoint import LOONGSAGE, TINYLLM, CheckpointTree, StepInfo, get_layout, run_root
from registry.checkpoint.loongsage import adopt
from registry.cli.app import JsonOpt, StoreOpt, app, print_json
from registry.cli.errors import EXIT_FAILED, error_boundary
from registry.commit import CLAIM_SUFFIX
from registry.documents import checkpoint_list
from registry.errors import NoValidCheckpointError, NotCommittedError, PointerError, UsageError
from registry.names import check_name
from registry.store import Store, join, open_store
from registry.verify import verify_directory

ckpt_app = typer.Typer(help="Checkpoints of training runs (seed 000 and LoongSage trees).",
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


def open_tree(run: str, store_url: str | None, layout: str) -> CheckpointTree:
    """The checkpoint tree RUN names, in the layout asked for or detected."""
    if layout == "auto":
        if _is_location(run):
            layout = "loongsage"
        elif _looks_loongsage(*_loongsage_location(run, store_url)):
            layout = "loongsage"
        elif "/" in run and not store_url:
            layout = "loongsage"
        else:
            layout = "tinyllm"
    if get_layout(layout) is LOONGSAGE:
        return CheckpointTree(*_loongsage_location(run, store_url), LOONGSAGE)
    return CheckpointTree(open_store(store_url), run_root(check_name(run, "run_id")), TINYLLM)


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
               and not tree.store.exists(tree.prefix(s) + CLAIM_SUFFIX)]
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
    with error_boundary():
        doc = checkpoint_list(open_tree(run, store, layout), full=full)
    if as_json:
        print_json(doc)
        return
    typer.echo(f"{'step':>10}  {'committed':9}  {'verified':8}  {'bytes':>14}  latest")
    for d in doc["steps"]:
        typer.echo(f"{d['step']:>10}  {'yes' if d['committed'] else 'no':9}  "
                   f"{'yes' if d['verified'] else 'no':8}  {d['bytes'] or 0:>14}  "
                   f"{'*' if d['step'] == doc['latest'] else ''}")


@ckpt_app.command("latest")
def ckpt_latest(run: RunArg, store: StoreOpt = None, layout: LayoutOpt = "auto",
                as_json: JsonOpt = False) -> None:
    """Print the step the pointer (LATEST or the tracker file) names, verified.

    Exits 1 when there is no pointer or the step it names does not verify.
    """
    with error_boundary():
        tree = open_tree(run, store, layout)
        step = tree.latest()
        if step is None:
            raise NoValidCheckpointError(f"{tree.store.url_of(tree.pointer_key)}: no pointer")
        info = tree.info(step, full=False)
    if as_json:
        print_json(info.to_dict())
    else:
        typer.echo(f"{tree.layout.step_dir(step)}\t{tree.store.url_of(info.prefix)}\t"
                   f"{'verified' if info.report.ok else 'NOT COMMITTED'}")
    if not info.report.ok:
        raise typer.Exit(EXIT_FAILED)


@ckpt_app.command("verify")
def ckpt_verify(run: RunArg, store: StoreOpt = None, layout: LayoutOpt = "auto",
                step: Annotated[int | None, typer.Option("--step", help="Only this step.")] = None,
                as_json: JsonOpt = False) -> None:
    """Verify every step (or --step N) fully, sha256 included. Exits 1 on any failure.

    A step directory without MANIFEST.json (a crashed save, or a deletion cut
    short) is not a checkpoint: readers ignore it, the next save or `ckpt gc`
    removes it. It is listed as SKIP and fails the run only when named with
    --step or when the pointer names it."""
    with error_boundary():
        tree = open_tree(run, store, layout)
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
            typer.echo(f"{label} {tree.layout.step_dir(i.step)}"
                       + (": " + "; ".join(map(str, problems)) if problems else "") + note)  # type: ignore[arg-type]
    checked = [i for i in infos if not ignored(i)]
    if not checked or not all(i.report.ok for i in checked):
        raise typer.Exit(EXIT_FAILED)


@ckpt_app.command("gc")
def ckpt_gc(run: RunArg, keep: Annotated[int, typer.Option("--keep", help="Committed steps "
                                                           "to keep (the pointer's always).")],
            store: StoreOpt = None, layout: LayoutOpt = "auto",
            force: Annotated[bool, typer.Option(
                "--force", help="LoongSage trees: delete step dirs without a manifest (and "
                                "without a claim) too.")] = False,
            as_json: JsonOpt = False) -> None:
    """Delete committed steps beyond the KEEP newest, stale staging dirs, claims and
    uncommitted steps older than the pointer (MANIFEST.json first).

    On a LoongSage tree, step directories without a manifest that no crashed save
    of ours claimed were most likely written by LoongSage itself: gc refuses to
    delete them (exit 2) unless --force."""
    with error_boundary():
        tree = open_tree(run, store, layout)
        if tree.layout is LOONGSAGE and not force:
            _refuse_foreign(tree)
        deleted = tree.retain(keep)
    if as_json:
        print_json({"deleted": [tree.store.url_of(k) for k in deleted]})
    else:
        for k in deleted:
            typer.echo(f"deleted {tree.store.url_of(k)}")


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
    with error_boundary():
        tree = open_tree(checkpoint_path, store, "loongsage")
        result = adopt(tree.store, tree.root, run_id=run_id)
    if as_json:
        print_json(result.to_dict())
    elif result.already:
        typer.echo(f"{result.path}: already adopted (manifest verifies)")
    else:
        typer.echo(f"adopted {result.path}: {len(result.manifest.files)} files, "
                   f"{result.manifest.total_size} bytes, manifest sha256 "
                   f"{result.manifest.digest}")
