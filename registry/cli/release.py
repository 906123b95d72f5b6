"""``registry publish``, ``release create``, ``gate check``, ``alias``, ``policy``, ``gc``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from registry.aliases import list_aliases, parse_ref, resolve
from registry.checkpoint import get_layout
from registry.cli.app import DbOpt, JsonOpt, StoreOpt, app, print_json
from registry.cli.errors import EXIT_FAILED, EXIT_USAGE, error_boundary
from registry.errors import GateFailedError, InvalidNameError, UsageError
from registry.gates import GateResult, passed
from registry.gc import collect, parse_duration
from registry.release import ModelRelease, ReleaseResult
from registry.release.policy import thresholds
from registry.store import open_store

ModelIdOpt = Annotated[str, typer.Option("--model-id", help="Model id.")]
VersionOpt = Annotated[str, typer.Option("--version", help="New, immutable version.")]
LedgerOpt = Annotated[str, typer.Option("--ledger", help="ledger.json: rows of every "
                                                         "training data source.")]
EvalsOpt = Annotated[str, typer.Option("--evals", help="EvalSuite summary JSON file.")]
HeadOpt = Annotated[list[str] | None, typer.Option("--head", help="Linear head JSON file "
                                                                  "(repeatable).")]
RequireOpt = Annotated[list[str] | None, typer.Option(
    "--require", help="Extra gate threshold METRIC>=VALUE or METRIC<=VALUE (repeatable).")]


if TYPE_CHECKING:
    from registry.api import Registry


def _registry(store: str | None, db: str | None) -> Registry:
    """The Registry facade, imported on use: SQLAlchemy and Alembic load only
    for the commands that touch the index."""
    from registry.api import Registry

    return Registry(store, db)



def _print_gates(results: tuple[GateResult, ...] | list[GateResult]) -> None:
    for r in results:
        typer.echo(f"{'PASS' if r.passed else 'FAIL'} {r.name}: {r.reason}")


def _report(result: ReleaseResult, as_json: bool) -> None:
    if as_json:
        print_json(result.to_dict())
        return
    _print_gates(result.gates)
    m = result.manifest
    typer.echo(f"released {result.model_id}@{result.version} at {result.url}: "
               f"{len(m.files)} files, {m.total_size} bytes, manifest sha256 {m.digest}")


@contextmanager
def _gate_failures(as_json: bool) -> Iterator[None]:
    """Print every gate (failing ones with their reasons) before exiting 1."""
    try:
        yield
    except GateFailedError as e:
        if as_json:
            print_json({"passed": False, "gates": [r.to_dict() for r in e.results]})
        else:
            _print_gates(e.results)
        typer.echo(f"error: {e.where}: not released: fails the release gates", err=True)
        raise typer.Exit(EXIT_FAILED) from None


@app.command()
def publish(
    model_dir: Annotated[str, typer.Argument(help="Model directory (folder or URL) holding "
                                                  "model.safetensors and config.json.")],
    model_id: ModelIdOpt, version: VersionOpt, ledger: LedgerOpt, evals: EvalsOpt,
    card: Annotated[str | None, typer.Option("--card", help="MODEL_CARD.md to use "
                                                            "(default: rendered).")] = None,
    head: HeadOpt = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="Convert weights: f32, bf16, "
                                                              "int4 (default: as is).")] = None,
    group_size: Annotated[int, typer.Option("--group-size", help="int4 group size.")] = 128,
    require: RequireOpt = None, store: StoreOpt = None, db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Release an existing model directory (e.g. a Hugging Face one) as MODEL_ID@VERSION."""
    with error_boundary(), _gate_failures(as_json):
        result = _registry(store, db).publish(
            model_dir, model_id, version, ledger=ledger, eval_summary=evals,
            heads=head or [], card=card, dtype=dtype, group_size=group_size,
            require=require or [])
    _report(result, as_json)


release_app = typer.Typer(help="Releases from checkpoints.", no_args_is_help=True)
app.add_typer(release_app, name="release")


@release_app.command("create")
def release_create(
    step: Annotated[int, typer.Option("--step", help="Checkpoint step.")],
    model_id: ModelIdOpt, version: VersionOpt, ledger: LedgerOpt, evals: EvalsOpt,
    dtype: Annotated[str, typer.Option("--dtype", help="f32, bf16 or int4.")] = "f32",
    group_size: Annotated[int, typer.Option("--group-size", help="int4 group size.")] = 128,
    head: HeadOpt = None,
    card_field: Annotated[list[str] | None, typer.Option(
        "--card-field", help="KEY=VALUE for the model card (description, intended_use, "
                             "limitations).")] = None,
    run: Annotated[str | None, typer.Option(
        "--run", help="Run id of the checkpoint (required for tinyllm; for loongsage, "
                      "default: the last part of --checkpoint-path).")] = None,
    layout: Annotated[str, typer.Option("--layout", help="tinyllm or loongsage.")] = "tinyllm",
    checkpoint_path: Annotated[str | None, typer.Option(
        "--checkpoint-path", help="LoongSage checkpoint_path, relative to the store.")] = None,
    require: RequireOpt = None, store: StoreOpt = None, db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Release checkpoint STEP of RUN as MODEL_ID@VERSION (weights converted to DTYPE)."""
    fields = {}
    for kv in card_field or []:
        key, sep, value = kv.partition("=")
        if not sep:
            typer.echo(f"error: --card-field {kv!r}: expected KEY=VALUE", err=True)
            raise typer.Exit(EXIT_USAGE)
        fields[key] = value
    with error_boundary(), _gate_failures(as_json):
        lay = get_layout(layout)
        loong = lay.name == "loongsage"
        if run is None:
            run = (checkpoint_path or "").rstrip("/").rpartition("/")[2] if loong else None
            if not run:
                raise UsageError("--run is required" + (
                    "" if loong else " with --layout tinyllm (runs/<run>/ckpt)"))
        result = _registry(store, db).create_release(
            run, step, model_id, version, dtype=dtype, group_size=group_size,
            ledger=ledger, eval_summary=evals, heads=head or [], card_fields=fields,
            require=require or [], layout=lay,
            checkpoint_root=(checkpoint_path or "") if loong else None,
            subdir="hf_model" if loong else "")
    _report(result, as_json)


gate_app = typer.Typer(help="Release gates.", no_args_is_help=True)
app.add_typer(gate_app, name="gate")


@gate_app.command("check")
def gate_check(ref: Annotated[str, typer.Argument(help="MODEL_ID@VERSION or MODEL_ID@ALIAS.")],
               require: RequireOpt = None, store: StoreOpt = None,
               as_json: JsonOpt = False) -> None:
    """Re-evaluate every gate of a committed release now (live ledger, policy).

    Exits 0 when all pass, 1 otherwise."""
    with error_boundary():
        rel = ModelRelease(store)
        model_id, name = parse_ref(ref)
        if name is None:
            raise InvalidNameError(f"{ref!r}: expected MODEL_ID@VERSION", name=ref)
        version = resolve(rel.store, model_id, name)
        results = rel.check(model_id, version, require=require or [])
    if as_json:
        print_json({"model_id": model_id, "version": version, "passed": passed(results),
                    "gates": [r.to_dict() for r in results]})
    else:
        _print_gates(results)
    if not passed(results):
        raise typer.Exit(EXIT_FAILED)


alias_app = typer.Typer(help="Mutable aliases (refs/<alias>) of releases.",
                        no_args_is_help=True)
app.add_typer(alias_app, name="alias")


@alias_app.command("set")
def alias_set(model_id: Annotated[str, typer.Argument(help="Model id.")],
              alias: Annotated[str, typer.Argument(help="Alias, e.g. prod.")],
              version: Annotated[str, typer.Argument(help="Committed version.")],
              force: Annotated[bool, typer.Option("--force", help="Allow a version that "
                                                                  "fails the gates.")] = False,
              store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Point ALIAS of MODEL_ID at VERSION (compare-and-swap); it must pass the gates."""
    with error_boundary():
        previous = _registry(store, db).set_alias(model_id, alias, version, force=force)
    if as_json:
        print_json({"model_id": model_id, "alias": alias, "version": version,
                    "previous": previous})
    else:
        typer.echo(f"{model_id}@{alias} -> {version}"
                   + (f" (was {previous})" if previous else ""))


@alias_app.command("ls")
def alias_ls(model_id: Annotated[str, typer.Argument(help="Model id.")],
             store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List the aliases of MODEL_ID."""
    with error_boundary():
        aliases = list_aliases(open_store(store), model_id)
    if as_json:
        print_json(aliases)
    else:
        for alias, version in aliases.items():
            typer.echo(f"{alias}\t{version}")


policy_app = typer.Typer(help="Per-model gate thresholds.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")


@policy_app.command("set")
def policy_set(model_id: Annotated[str, typer.Argument(help="Model id.")],
               require: RequireOpt = None, store: StoreOpt = None, db: DbOpt = None) -> None:
    """Replace MODEL_ID's thresholds (none given: clear them)."""
    with error_boundary():
        parsed = _registry(store, db).set_policy(model_id, require or [])
    typer.echo(f"{model_id}: " + (", ".join(map(str, parsed)) or "no thresholds"))


@policy_app.command("show")
def policy_show(model_id: Annotated[str, typer.Argument(help="Model id.")],
                store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Show MODEL_ID's thresholds."""
    with error_boundary():
        parsed = thresholds(open_store(store), model_id)
    if as_json:
        print_json([str(t) for t in parsed])
    else:
        typer.echo("\n".join(map(str, parsed)) or "no thresholds")


@app.command()
def gc(older_than: Annotated[str, typer.Option("--older-than", help="Only leftovers older "
                                               "than this (90s, 15m, 2h, 7d).")] = "1h",
       dry_run: Annotated[bool, typer.Option("--dry-run", help="List, delete nothing.")] = False,
       checkpoint_path: Annotated[list[str] | None, typer.Option(
           "--checkpoint-path", help="Also scan this LoongSage checkpoint tree (relative to "
                                     "the store; repeatable).")] = None,
       break_claims: Annotated[bool, typer.Option(
           "--break-claims", help="Also remove claims whose lease is still live (their "
                                  "writers are known to be gone).")] = False,
       store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Remove abandoned claims, staging dirs and uncommitted leftovers; never a commit."""
    with error_boundary():
        s = open_store(store)
        seconds = parse_duration(older_than)
        for tree in checkpoint_path or []:
            if not s.list_dir(tree.strip("/")):
                raise UsageError(f"{s.url_of(tree.strip('/'))}: no such checkpoint tree "
                                 "(nothing there)")
        removed = collect(s, older_than=seconds, dry_run=dry_run,
                          trees=checkpoint_path or [], break_claims=break_claims)
    if as_json:
        print_json({"removed": [s.url_of(k) for k in removed], "dry_run": dry_run})
    else:
        for k in removed:
            typer.echo(f"{'would remove' if dry_run else 'removed'} {s.url_of(k)}")
