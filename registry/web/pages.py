"""The HTML pages: models, a model, a version, a data source, a run."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from registry.api import Registry
from registry.web import views
from registry.web.modelpath import model_param
from registry.web.render import render

router = APIRouter(include_in_schema=False, default_response_class=HTMLResponse)
CursorQ = Annotated[str | None, Query(max_length=300, description="page cursor")]


def _reg(request: Request) -> Registry:
    reg: Registry = request.app.state.registry
    return reg


@router.get("/")
def index(request: Request) -> HTMLResponse:
    reg = _reg(request)
    return HTMLResponse(render("index.html", title="Models", store=reg.store.url,
                               **views.index_view(reg)))


@router.get("/search")
def search(request: Request, tag: Annotated[str | None, Query(max_length=400)] = None,
           since: Annotated[str | None, Query(max_length=64)] = None,
           dtype: Annotated[str | None, Query(max_length=32)] = None,
           source: Annotated[str | None, Query(max_length=300)] = None,
           model: Annotated[str | None, Query(max_length=128)] = None) -> HTMLResponse:
    v = views.search_view(_reg(request), tag=tag, since=since, dtype=dtype, source=source,
                          model=model)
    return HTMLResponse(render("search.html", title="Search", **v))


@router.get("/models/{model_id}")
def model(request: Request, model_id: str, before: CursorQ = None,
          after: CursorQ = None) -> HTMLResponse:
    model_id = model_param(model_id)
    v = views.model_view(_reg(request), model_id, before=before, after=after)
    return HTMLResponse(render("model.html", title=model_id, **v))


@router.get("/models/{model_id}/aliases/{alias}")
def alias_log(request: Request, model_id: str, alias: str,
              at: Annotated[str | None, Query(max_length=64)] = None) -> HTMLResponse:
    from registry.cli.aliases import parse_time
    from registry.rules.names import check_name
    from registry.trust.moves import alias_log as log_document
    from registry.trust.source import current

    model_id = model_param(model_id)
    doc = log_document(_reg(request).store, model_id,
                       check_name(alias, "alias"), at=parse_time(at) if at else None,
                       trust=current(request.app.state.hub.trust))
    return HTMLResponse(render("alias.html", title=f"{model_id}@{alias} history",
                               asked=at or "", **doc))


@router.get("/models/{model_id}/{ref}")
def version(request: Request, model_id: str, ref: str) -> HTMLResponse:
    from registry.web.api import trusted_ref

    # the trust function admits the ref (with keys: an alias only through a signed move,
    # never below this server's marks); the page then shows it as asked
    model_id = model_param(model_id)
    trusted_ref(request, model_id, ref)
    v = views.version_view(_reg(request), model_id, ref, request.app.state.release_files)
    d = v["doc"]
    return HTMLResponse(render("version.html", title=f"{d['model_id']}@{d['version']}", **v))


@router.get("/sources/{source_id}")
def source(request: Request, source_id: str, before: CursorQ = None,
           after: CursorQ = None) -> HTMLResponse:
    v = views.source_view(_reg(request), source_id, before=before, after=after)
    return HTMLResponse(render("source.html", title=f"source {source_id}", **v))


@router.get("/runs/{run_id}")
def run(request: Request, run_id: str) -> HTMLResponse:
    v = views.run_view(_reg(request), run_id)
    return HTMLResponse(render("run.html", title=f"run {run_id}", **v))
