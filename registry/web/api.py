"""``/api/v1``: the CLI's ``--json`` documents over HTTP, built by the same code.

| route | the CLI command whose ``--json`` document it returns |
|---|---|
| ``/api/v1/models`` | ``registry ls`` |
| ``/api/v1/models/{model_id}/releases`` | ``registry ls MODEL_ID`` |
| ``/api/v1/models/{model_id}/passing`` | ``registry query MODEL_ID --passing [--require] [--latest]`` |
| ``/api/v1/models/{model_id}/aliases`` | ``registry alias ls MODEL_ID`` |
| ``/api/v1/models/{model_id}/aliases/{alias}/log[?at=]`` | ``registry alias log MODEL_ID ALIAS [--at TIME]`` (the moves under ``moves``) |
| ``/api/v1/models/{model_id}/diff?a=&b=`` | ``registry diff MODEL_ID@A MODEL_ID@B`` |
| ``/api/v1/releases/{model_id}/{ref}`` | ``registry show MODEL_ID@REF`` |
| ``/api/v1/releases/{model_id}/{ref}/gates`` | ``registry gate check MODEL_ID@REF [--require]`` |
| ``/api/v1/sources/{source_id}/releases`` | ``registry query --source SOURCE_ID`` |
| ``/api/v1/revocations`` | ``registry ledger ls`` |
| ``/api/v1/runs/{run_id}/checkpoints`` | ``registry ckpt ls RUN_ID`` |
| ``/api/v1/hub/stats`` | (the Hub API's counters: bytes read from the store, bytes sent) |

Errors are the CLI's error document with an HTTP status for its exit code
(:mod:`registry.web.app`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from registry.facade import documents
from registry.api import Registry
from registry.checkpoint import CheckpointTree
from registry.cli.app import nothing_stored
from registry.errors import ObjectNotFoundError
from registry.protocol.layout import run_root
from registry.rules.names import check_model_id, check_name
from registry.web.modelpath import model_param

router = APIRouter(prefix="/api/v1", tags=["registry"])
RequireQ = Annotated[list[str] | None, Query(description="Extra threshold METRIC>=VALUE or "
                                                         "METRIC<=VALUE (repeatable).")]


def _reg(request: Request) -> Registry:
    reg: Registry = request.app.state.registry
    return reg


@router.get("/models", summary="Models: release count, newest and newest passing version, "
                               "aliases (registry ls --json)")
def models(request: Request) -> list[dict[str, Any]]:
    return _reg(request).ls()


@router.get("/models/{model_id}/releases",
            summary="Releases of a model, newest first (registry ls MODEL_ID --json)")
def releases(request: Request, model_id: str) -> list[dict[str, Any]]:
    return _reg(request).ls(model_param(model_id))


@router.get("/models/{model_id}/passing",
            summary="Versions passing every gate now (registry query MODEL_ID --passing --json)")
def passing(request: Request, model_id: str, require: RequireQ = None,
            latest: bool = False) -> list[dict[str, Any]]:
    return _reg(request).passing(model_param(model_id), require=require or [],
                                 latest=latest)


@router.get("/models/{model_id}/aliases",
            summary="Aliases of a model (registry alias ls MODEL_ID --json)")
def aliases(request: Request, model_id: str) -> dict[str, str]:
    return documents.alias_map(_reg(request).store, model_param(model_id))


@router.get("/models/{model_id}/aliases/{alias}/log",
            summary="An alias's moves newest first, and with ?at=TIME what it designated "
                    "then (registry alias log MODEL_ID ALIAS [--at TIME] --json)")
def alias_log(request: Request, model_id: str, alias: str,
              at: Annotated[str | None, Query(max_length=64)] = None) -> dict[str, Any]:
    from registry.cli.aliases import parse_time
    from registry.trust.moves import alias_log as log_document
    from registry.trust.source import current

    return log_document(_reg(request).store, model_param(model_id),
                        check_name(alias, "alias"), at=parse_time(at) if at else None,
                        trust=current(request.app.state.hub.trust))


@router.get("/models/{model_id}/diff",
            summary="Files and evals that differ between two releases (registry diff --json)")
def diff(request: Request, model_id: str, a: str, b: str) -> dict[str, Any]:
    reg = _reg(request)
    model_id = model_param(model_id)
    _, va = reg.resolve(f"{model_id}@{a}")
    _, vb = reg.resolve(f"{model_id}@{b}")
    return reg.diff(model_id, va, vb)


@router.get("/releases/{model_id}/{ref}",
            summary="One release: manifest summary, gates with reasons, evals, sources "
                    "(registry show --json)")
def show(request: Request, model_id: str, ref: str) -> dict[str, Any]:
    reg = _reg(request)
    return reg.show(*trusted_ref(request, model_param(model_id), ref))


def trusted_ref(request: Request, model_id: str, ref: str) -> tuple[str, str]:
    """``(model_id, version)`` of ``ref`` as the server's trust function resolves it
    (:func:`registry.trust.release.resolve_for_pull`: with trusted keys an alias only
    through a signed move; never below this server's marks)."""
    from registry.trust.release import resolve_for_pull
    from registry.trust.source import current

    hub = request.app.state.hub
    return model_id, resolve_for_pull(_reg(request).store, model_id,
                                      check_name(ref, "version or alias"),
                                      current(hub.trust), hub.marks)


@router.get("/releases/{model_id}/{ref}/gates",
            summary="Every gate of a release, evaluated now from the store "
                    "(registry gate check --json)")
def gates(request: Request, model_id: str, ref: str,
          require: RequireQ = None) -> dict[str, Any]:
    return documents.gate_check(_reg(request).store,
                                f"{model_param(model_id)}@{ref}",
                                require=require or [])


@router.get("/search", summary="Releases matching every filter given: tags (KEY=VALUE or "
                                "KEY, repeatable), since, dtype, source "
                                "(registry query --tag --since --dtype --source --json)")
def search(request: Request, tag: Annotated[list[str] | None, Query(max_length=400)] = None,
           since: Annotated[str | None, Query(max_length=64)] = None,
           dtype: Annotated[str | None, Query(max_length=32)] = None,
           source: Annotated[str | None, Query(max_length=300)] = None,
           model: Annotated[str | None, Query(max_length=128)] = None) -> list[dict[str, Any]]:
    return _reg(request).search(model_id=check_model_id(model) if model else None,
                                tags=tag or [], since=since, dtype=dtype, source=source)


@router.get("/sources/{source_id}/releases",
            summary="Releases trained on a data source (registry query --source --json)")
def source_releases(request: Request, source_id: str) -> list[dict[str, Any]]:
    return _reg(request).releases_for_source(check_name(source_id, "source_id"))


@router.get("/revocations", summary="Revoked data sources (registry ledger ls --json)")
def revocations(request: Request) -> list[dict[str, Any]]:
    return documents.revocation_list(_reg(request).store)


@router.get("/runs/{run_id}/checkpoints",
            summary="Checkpoint steps of a run and the step LATEST names "
                    "(registry ckpt ls RUN_ID --json)")
def checkpoints(request: Request, run_id: str) -> dict[str, Any]:
    reg = _reg(request)
    tree = CheckpointTree(reg.store, run_root(check_name(run_id, "run_id")))
    if nothing_stored(reg.store, tree.root):  # as `registry ckpt ls`: an unknown run is 404
        raise ObjectNotFoundError(f"{reg.store.url_of(tree.root)}: no such run {run_id!r} "
                                  "(nothing stored there)", key=tree.root)
    return documents.checkpoint_list(tree)


@router.get("/hub/stats", summary="Bytes the Hub API read from the store and sent to "
                                  "clients since the server started")
def hub_stats(request: Request) -> dict[str, int]:
    stats: dict[str, int] = request.app.state.hub_stats.to_dict()
    return stats
