"""Hub requests refused before any Hub route runs still answer in the Hub's terms (issue 47).

A revision with ``/`` (the client quotes it as ``%2F``), a file path with
``..`` or an encoded ``\\``, and a Hub path that matches no route each get
404 with the ``X-Error-Code`` and ``X-Error-Message`` that ``huggingface_hub``
maps, so the real client raises RevisionNotFoundError / EntryNotFoundError
instead of telling the user to check their connection. Inputs: revisions
``release/v2``, ``users/alice/exp`` (encoded and not), on the info, tree and
resolve routes, with the store on local disk (and two of them on S3).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import make_store_url
from tests.hub_util import hub_client, index_db, publish, tiny_bert
from tests.test_hub import get
from tests.web_util import serve

REPO_ID = "registry/tiny"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One ``registry serve`` over a local store holding tiny@1, for the module."""
    root = tmp_path_factory.mktemp("hub-codes")
    url = str(root / "store")
    publish(url, tiny_bert(root / "src", 1), "tiny", "1")
    with serve(url, index_db(root)) as b:
        yield b


@pytest.mark.parametrize(("path", "code"), [
    ("/api/models/registry/tiny/revision/release%2Fv2", "RevisionNotFound"),
    ("/api/models/tiny/revision/users%2Falice%2Fexp", "RevisionNotFound"),
    ("/api/models/registry/tiny/revision/users/alice/exp", "RevisionNotFound"),
    ("/api/models/registry/tiny/tree/release%2Fv2", "RevisionNotFound"),
    ("/api/models/registry/tiny/tree/release%2Fv2/evals", "RevisionNotFound"),
    ("/registry/tiny/resolve/release%2Fv2/config.json", "RevisionNotFound"),
    ("/tiny/resolve/users%2Falice%2Fexp/config.json", "RevisionNotFound"),
    ("/registry/tiny/resolve/1/a%5Cb.json", "EntryNotFound"),
    ("/registry/tiny/resolve/1/evals/%2e%2e/config.json", "EntryNotFound"),
    ("/api/models/registry/tiny/extra/thing/here", "RepoNotFound"),
])
def test_refusals_on_hub_paths_carry_the_hubs_error_code(base: str, path: str,
                                                         code: str) -> None:
    for method in ("GET", "HEAD"):
        status, h, _ = get(base, path, method=method)
        assert (status, h.get("x-error-code")) == (404, code), (method, path, h)
        assert h.get("x-error-message"), h
    if code == "RevisionNotFound":
        assert "no such revision" in get(base, path)[1]["x-error-message"]


def test_other_bad_paths_keep_the_registrys_answer(base: str) -> None:
    # an encoded '/' anywhere but a namespaced model id's segment (registry.web.modelpath)
    for path in ("/api/v1/runs/a%2Fb/checkpoints", "/api/v1/models/a%2Fb%2Fc/releases",
                 "/api/v1/models/a%252Fb/releases"):
        status, h, _ = get(base, path)
        assert status == 400 and "x-error-code" not in h, path


def test_huggingface_hub_raises_revision_not_found(base: str, tmp_path: Path) -> None:
    out = hub_client(base, tmp_path / "hf", "file", REPO_ID, "release/v2", "config.json")
    assert (out["ok"], out.get("error")) == (False, "RevisionNotFoundError"), out


def test_on_an_s3_store_too(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = make_store_url("s3", request, tmp_path)
    publish(url, tiny_bert(tmp_path / "src", 1), "tiny", "1")
    with serve(url, index_db(tmp_path)) as b:
        for path, code in (("/registry/tiny/resolve/users%2Falice%2Fexp/config.json",
                            "RevisionNotFound"),
                           ("/api/models/registry/tiny/revision/release%2Fv2",
                            "RevisionNotFound")):
            status, h, _ = get(b, path)
            assert (status, h.get("x-error-code")) == (404, code), (path, h)
