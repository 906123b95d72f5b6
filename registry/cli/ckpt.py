"""``registry ckpt``: list, inspect, verify and prune a run's checkpoints."""

from __future__ import annotations

from typing import Annotated

import typer

from registry.checkpoint import LOONGSAGE, TINYLLM, CheckpointTree, get_layout, run_root
from registry.cli.app import JsonOpt, StoreOpt, app, print_json
from registry.cli.errors import EXIT_FAILED, error_boundary
from registry.errors import NoValidCheckpointError
from registry.names import check_name
from registry.store import open_store

ckpt_app = typer.Typer(help="Checkpoints of training runs (seed 000 and LoongSage trees).",
                       no_args_is_help=True)
app.add_typer(ckpt_app, name="ckpt")

RunArg = Annotated[str, typer.Argument(
    help="Run id (tinyllm: runs/<run>/ckpt in --store), or a LoongSage checkpoint_path "
         "(folder or URL).")]
LayoutOpt = Annotated[str, typer.Option(
    "--layout", help="tinyllm, loongsage, or auto (loongsage when the tracker file exists "
                     "at RUN, or RUN is a path/URL).")]


def open_tree(run: str, store_url: str | None, layout: str) -> CheckpointTree:
    """The checkpoint tree RUN names, in the layout asked for or detected."""
    if layout == "auto":
        looks_like_path = "/" in run or "://" in run or run.startswith(".")
        if looks_like_path and open_store(run).exists(LOONGSAGE.pointer):
            layout = "loongsage"
        elif looks_like_path and not store_url:
            layout = "loongsage"
        else:
            layout = "tinyllm"
    if get_layout(layout) is LOONGSAGE:
        return CheckpointTree(open_store(run), "", LOONGSAGE)
    return CheckpointTree(open_store(store_url), run_root(check_name(run, "run_id")), TINYLLM)


@ckpt_app.command("ls")
def ckpt_ls(run: RunArg, store: StoreOpt = None, layout: LayoutOpt = "auto",
            full: Annotated[bool, typer.Option("--full", help="Verify sha256 too.")] = False,
            as_json: JsonOpt = False) -> None:
    """List step directories: step, committed, verified, bytes."""
    with error_boundary():
        tree = open_tree(run, store, layout)
        infos = [tree.info(s, full=full) for s in tree.steps()]
        latest = tree.latest()
    if as_json:
        print_json({"tree": tree.store.url_of(tree.root), "layout": tree.layout.name,
                    "latest": latest, "steps": [i.to_dict() for i in infos]})
        return
    typer.echo(f"{'step':>10}  {'committed':9}  {'verified':8}  {'bytes':>14}  latest")
    for i in infos:
        d = i.to_dict()
        typer.echo(f"{i.step:>10}  {'yes' if d['committed'] else 'no':9}  "
                   f"{'yes' if d['verified'] else 'no':8}  {d['bytes'] or 0:>14}  "
                   f"{'*' if i.step == latest else ''}")


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
    """Verify every step (or --step N) fully, sha256 included. Exits 1 on any failure."""
    with error_boundary():
        tree = open_tree(run, store, layout)
        steps = [step] if step is not None else tree.steps()
        infos = [tree.info(s, full=True) for s in steps]
    if as_json:
        print_json([i.to_dict() for i in infos])
    else:
        for i in infos:
            problems = i.to_dict()["problems"]
            typer.echo(f"{'OK  ' if i.report.ok else 'FAIL'} {tree.layout.step_dir(i.step)}"
                       + (": " + "; ".join(map(str, problems)) if problems else ""))  # type: ignore[arg-type]
    if not infos or not all(i.report.ok for i in infos):
        raise typer.Exit(EXIT_FAILED)


@ckpt_app.command("gc")
def ckpt_gc(run: RunArg, keep: Annotated[int, typer.Option("--keep", help="Committed steps "
                                                           "to keep (the pointer's always).")],
            store: StoreOpt = None, layout: LayoutOpt = "auto", as_json: JsonOpt = False) -> None:
    """Delete committed steps beyond the KEEP newest, stale staging dirs, claims and
    uncommitted steps older than the pointer (MANIFEST.json first)."""
    with error_boundary():
        tree = open_tree(run, store, layout)
        deleted = tree.retain(keep)
    if as_json:
        print_json({"deleted": [tree.store.url_of(k) for k in deleted]})
    else:
        for k in deleted:
            typer.echo(f"deleted {tree.store.url_of(k)}")
