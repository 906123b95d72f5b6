"""``registry ckpt rollout`` and ``registry ckpt refs``: LoongSage rollout data
and the read-only weight sources of a run (seed 003 sections 1 and 2)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from registry.rules.numbers import INT_MAX
from registry.cli.app import JsonOpt, StoreOpt, print_json
from registry.cli.ckpt import _is_location, ckpt_app
from registry.cli.errors import at_least, error_boundary
from registry.cli.output import echo
from registry.errors import ObjectNotFoundError, UsageError
from registry.store import open_store

TEACHER_FORM = "hf_path=PATH[,dist_ckpt_path=PATH]"


def _url(path: str, store: str | None) -> str:
    """PATH itself when it is a URL or path (or no --store is given), else the
    key PATH in --store."""
    if store and not _is_location(path):
        return open_store(store).url_of(path.strip("/"))
    return path


@ckpt_app.command("rollout")
def ckpt_rollout(rollout_data_path: Annotated[str, typer.Argument(
                     help="rollout_data_path: folder or URL, or a key in --store.")],
                 step: Annotated[int | None, typer.Option(
                     "--step", max=INT_MAX, help="Verify this step only (default: every committed one).")
                 ] = None,
                 store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Verify rollout data: each committed step_<step>.pt against its manifest
    (size and sha256, read in full); list step, bytes, sha256."""
    from registry.checkpoint.loongsage_rollout import RolloutData  # torch, on use

    with error_boundary(as_json):
        if step is not None:
            at_least("--step", step, 0)
        if store and not _is_location(rollout_data_path):
            data = RolloutData(rollout_data_path, store=store)
        elif "://" not in rollout_data_path and not os.path.isdir(rollout_data_path):
            raise ObjectNotFoundError(f"{rollout_data_path}: no such rollout_data_path (no "
                                      "such folder)", key=rollout_data_path)
        else:
            data = RolloutData(rollout_data_path)
        steps = [step] if step is not None else data.steps()
        if step is None and not steps and not data.store.walk_files(data.root):
            raise ObjectNotFoundError(f"{data.url}: no such rollout_data_path (nothing "
                                      "stored there)", key=data.root)
        verified = [data.verify(s) for s in steps]
    if as_json:
        print_json({"rollout_data_path": data.url, "steps": [v.to_dict() for v in verified]})
        return
    if not verified:
        echo(f"{data.url}: no committed rollout steps", err=True)
        return
    echo(f"{'step':>10}  {'bytes':>14}  sha256")
    for v in verified:
        echo(f"{v.step:>10}  {v.bytes:>14}  {v.manifest.files[0].sha256}")


@ckpt_app.command("refs")
def ckpt_refs(ref_dist_ckpt_path: Annotated[str | None, typer.Option(
                  "--ref-dist-ckpt-path", metavar="PATH",
                  help="Reference model: one concrete train_step_<N>/dist_ckpt dir.")] = None,
              ref_hf_model_path: Annotated[str | None, typer.Option(
                  "--ref-hf-model-path", metavar="PATH",
                  help="Reference model: an HF model folder (pick one of the two).")] = None,
              teacher: Annotated[list[str] | None, typer.Option(
                  "--teacher", metavar=TEACHER_FORM,
                  help="An OPD teacher (repeatable); hf_path is required.")] = None,
              store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Verify a run's reference model and OPD teachers before use: each dist_ckpt
    dir (and each HF folder inside a step) against its step's MANIFEST.json."""
    with error_boundary(as_json):
        config: dict[str, object] = {}
        if ref_dist_ckpt_path:
            config["ref_dist_ckpt_path"] = _url(ref_dist_ckpt_path, store)
        if ref_hf_model_path:
            config["ref_hf_model_path"] = _url(ref_hf_model_path, store)
        teachers = []
        for i, spec in enumerate(teacher or []):
            fields = {}
            for part in spec.split(","):
                key, sep, value = part.partition("=")
                if not sep or not value:
                    raise UsageError(f"--teacher {spec!r}: expected {TEACHER_FORM}")
                if key not in ("hf_path", "dist_ckpt_path"):
                    raise UsageError(f"--teacher {spec!r}: unknown key {key!r} "
                                     f"(expected {TEACHER_FORM})")
                if key in fields:
                    raise UsageError(f"--teacher {spec!r}: key {key!r} given twice "
                                     "(one teacher per --teacher; repeat the option)")
                fields[key] = _url(value, store)
            teachers.append(fields)
            if "hf_path" not in fields:
                raise UsageError(f"--teacher {spec!r}: opd.teachers[{i}].hf_path is required "
                                 "alongside dist_ckpt_path (it gives the model structure)")
        if not config and not teachers:
            raise UsageError("name --ref-dist-ckpt-path, --ref-hf-model-path or --teacher")
        config["opd"] = {"teachers": teachers}
        from registry.checkpoint.loongsage_refs import check_weight_sources

        sources = check_weight_sources(config)
    if as_json:
        print_json(sources.to_dict())
        return
    rows = ([("ref", sources.ref)] if sources.ref else []) + [
        (f"teacher[{t.index}].{name}", s) for t in sources.teachers
        for name, s in (("hf_path", t.hf), ("dist_ckpt_path", t.dist_ckpt)) if s]
    for name, s in rows:
        where = f"step {s.step}, manifest {s.manifest_sha256}" if s.step is not None \
            else "not in a checkpoint step"
        echo(f"{name}: {s.kind} {s.path} verified ({where})")
