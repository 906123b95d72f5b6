"""Namespaced model ids ``<org>/<name>`` (issue 44 item 4): the naming rule,
the store layout (``models/<org>@<name>/``), the CLI on a local and an S3
store with a SQLite and a Postgres index, the pages and JSON API (one
``%2F``-encoded segment) and a real ``huggingface_hub`` client asking a
running ``registry serve`` for ``acme/tiny`` exactly as on the Hub."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from registry.errors import InvalidNameError
from registry.protocol.layout import alias_key, model_ids, model_root, release_prefix, yank_key
from registry.rules.names import check_model_id, model_from_key, model_key
from registry.store import open_store
from tests.conftest import make_store_url, run_cli, run_cli_batch
from tests.hub_util import commit_of, hub_client, publish, release_files, tiny_bert
from tests.release_util import ledger_row, summary
from tests.web_util import serve

BAD = {"a//b": "an empty part around '/'", "../x": "reserved name",
       "a/b/c": "at most one '/'", "/a": "an empty part around '/'",
       "a/": "an empty part around '/'", "acme/..": "reserved name",
       "acme/refs": "reserved name", "a@b/c": "must match",
       f"{'o' * 64}/{'n' * 64}": "at most 128 characters"}


# -- the rule and the layout ------------------------------------------------------------

@pytest.mark.parametrize("bad", sorted(BAD))
def test_bad_namespaced_ids_are_refused_naming_the_rule(bad: str) -> None:
    with pytest.raises(InvalidNameError) as e:
        check_model_id(bad)
    assert BAD[bad] in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(InvalidNameError):
        model_root(bad)  # no key is ever built from it


def test_a_namespaced_id_is_one_key_level_never_a_version_path() -> None:
    assert check_model_id("acme/tiny") == "acme/tiny"
    assert model_key("acme/tiny") == "acme@tiny" and model_key("tiny") == "tiny"
    assert model_from_key("acme@tiny") == "acme/tiny" and model_from_key("tiny") == "tiny"
    assert release_prefix("acme/tiny", "1") == "models/acme@tiny/1"
    assert alias_key("acme/tiny", "prod") == "models/acme@tiny/refs/prod"
    assert yank_key("acme/tiny", "1") == "ledger/yanks/acme@tiny/1.json"
    # model acme's release "tiny" and model acme/tiny never share a key
    assert release_prefix("acme", "tiny") == "models/acme/tiny" != model_root("acme/tiny")
    assert model_ids(["tiny", "acme@tiny", "a@b@c", "x.tmp-1", "acme@.."]) == \
        ["tiny", "acme/tiny"]


# -- the CLI on local and S3, SQLite and Postgres ---------------------------------------

@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ns-bert")
    src = tiny_bert(root, 1)
    (root / "ledger.json").write_text(json.dumps([ledger_row("wiki")]))
    (root / "evals.json").write_text(json.dumps(summary(0.9)))
    return src


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_publish_pull_alias_ls_and_rebuild_of_acme_tiny(kind: str, db_url: str, bert: Path,
                                                       request: pytest.FixtureRequest,
                                                       tmp_path: Path) -> None:
    url = make_store_url(kind, request, tmp_path)
    where = ["--store", url, "--db", db_url]
    files = ["--ledger", str(bert.parent / "ledger.json"),
             "--evals", str(bert.parent / "evals.json")]
    for model_id in ("acme/tiny", "tiny", "acme"):  # a single-name model acme beside org acme
        p = run_cli("publish", str(bert), "--model-id", model_id, "--version", "1", *files,
                    *where)
        assert p.returncode == 0, p.stderr
    p = run_cli("publish", str(bert), "--model-id", "acme", "--version", "tiny", *files, *where)
    assert p.returncode == 0, p.stderr  # release "tiny" of model acme: not model acme/tiny
    p = run_cli("alias", "set", "acme/tiny", "prod", "1", *where)
    assert p.returncode == 0, p.stderr
    with open_store(url) as s:
        assert s.exists("models/acme@tiny/1/MANIFEST.json")
        assert s.exists("models/acme@tiny/refs/prod")
        assert s.exists("models/acme/tiny/MANIFEST.json")
        assert not s.exists("models/acme/tiny/1/MANIFEST.json")
        assert sorted(model_ids(s.subdirs("ledger/aliases"))) == ["acme/tiny"]

    def listing() -> list[str]:
        ls, mine, org = run_cli_batch([["ls", "--json", *where],
                                       ["ls", "acme/tiny", "--json", *where],
                                       ["ls", "acme/", "--json", *where]])
        assert ls.returncode == mine.returncode == org.returncode == 0, ls.stderr + mine.stderr
        rows = json.loads(mine.stdout)
        assert [(r["version"], r["aliases"]) for r in rows] == [("1", ["prod"])]
        assert [r["model_id"] for r in json.loads(org.stdout)] == ["acme/tiny"]
        return sorted(r["model_id"] for r in json.loads(ls.stdout))
    assert listing() == ["acme", "acme/tiny", "tiny"]

    to = tmp_path / "served"
    p = run_cli("pull", "acme/tiny@prod", "--to", str(to), "--store", url)
    assert p.returncode == 0, p.stderr
    expected = release_files(url, "acme/tiny", "1")
    assert json.loads((to / "MANIFEST.json").read_text())["model_id"] == "acme/tiny"
    assert {f for f in expected if f != "MANIFEST.json"} <= {
        q.relative_to(to).as_posix() for q in to.rglob("*") if q.is_file()}
    bare = run_cli("pull", "acme/tiny", "--store", url, "--json")  # the default ref, cached
    assert bare.returncode == 0, bare.stderr
    placed = Path(json.loads(bare.stdout)["path"])
    assert placed.parent.name == "acme@tiny" and placed.name == "1"

    # the index rebuilt from the store alone finds the namespaced model, its alias and move
    p = run_cli("index", "rebuild", "--json", *where)
    assert p.returncode == 0, p.stderr
    assert listing() == ["acme", "acme/tiny", "tiny"]
    p = run_cli("alias", "log", "acme/tiny", "prod", "--json", "--store", url)
    assert p.returncode == 0, p.stderr
    assert [m["new"] for m in json.loads(p.stdout)["moves"]] == ["1"]


@pytest.mark.parametrize("bad", ["a//b", "../x", "a/b/c", "/a"])
def test_the_cli_refuses_bad_namespaced_ids_with_exit_2(bad: str, bert: Path,
                                                        tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    results = run_cli_batch([
        ["ls", bad, "--store", store, "--db", f"sqlite:///{tmp_path / 'i.db'}"],
        ["pull", f"{bad}@1", "--store", store, "--to", str(tmp_path / "out")],
        ["alias", "set", bad, "prod", "1", "--store", store],
        ["publish", str(bert), "--model-id", bad, "--version", "1",
         "--ledger", str(bert.parent / "ledger.json"),
         "--evals", str(bert.parent / "evals.json"), "--store", store,
         "--db", f"sqlite:///{tmp_path / 'i.db'}"]])
    for r in results:
        assert r.returncode == 2, (r.args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and BAD[bad] in lines[0] and repr(bad) in lines[0], r.stderr
    assert not (tmp_path / "store" / "models").exists() or \
        not any((tmp_path / "store" / "models").iterdir())


# -- the pages, the JSON API and the Hub routes of a running server ---------------------

def _get(base: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(base + path, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, bert: Path) -> tuple[str, str, Path]:
    root = tmp_path_factory.mktemp("ns-served")
    url = str(root / "store")
    publish(url, bert, "acme/tiny", "1")
    publish(url, tiny_bert(root, 2), "tiny", "1")
    assert run_cli("alias", "set", "acme/tiny", "prod", "1", "--store", url).returncode == 0
    assert run_cli("index", "rebuild", "--store", url,
                   "--db", f"sqlite:///{root / 'i.db'}").returncode == 0
    return url, f"sqlite:///{root / 'i.db'}", root


def test_hub_clients_download_acme_tiny_as_on_the_hub(served: tuple[str, str, Path],
                                                      tmp_path: Path) -> None:
    url, db, _ = served
    with serve(url, db) as base:
        got = hub_client(base, tmp_path / "hf", "file", "acme/tiny", "prod",
                         "model.safetensors")
        assert got["ok"], got
        assert got["files"]["model.safetensors"] == \
            release_files(url, "acme/tiny", "1")["model.safetensors"]
        snap = hub_client(base, tmp_path / "hf", "snapshot", "acme/tiny", "main")
        assert snap["ok"], snap
        assert snap["path"].endswith(f"/snapshots/{commit_of(url, 'acme/tiny', '1')}")
        # single-name ids keep their Hub names: registry/<name> and the bare name
        for repo in ("registry/tiny", "tiny"):
            old = hub_client(base, tmp_path / "hf-old", "file", repo, "1", "model.safetensors")
            assert old["ok"], old
            assert old["files"]["model.safetensors"] == \
                release_files(url, "tiny", "1")["model.safetensors"]
        missing = hub_client(base, tmp_path / "hf", "file", "acme/nope", "main")
        assert missing["error"] == "RepositoryNotFoundError", missing
        status, body = _get(base, "/api/models/acme/tiny")
        assert status == 200 and json.loads(body)["id"] == "acme/tiny"
        assert json.loads(body)["author"] == "acme"
        # registry pull --from the server (the verifying mirror's client) asks for acme/tiny
        p = run_cli("pull", "acme/tiny@prod", "--from", base, "--to", str(tmp_path / "via"),
                    "--cache", str(tmp_path / "c"), "--json")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["version"] == "1"
        m = json.loads((tmp_path / "via" / "MANIFEST.json").read_text())
        assert m["model_id"] == "acme/tiny" and \
            m["files"] == json.loads(Path(url, "models", "acme@tiny", "1",
                                          "MANIFEST.json").read_text())["files"]


def test_pages_and_json_api_take_the_id_as_one_encoded_segment(
        served: tuple[str, str, Path]) -> None:
    url, db, _ = served
    with serve(url, db) as base:
        status, body = _get(base, "/api/v1/releases/acme%2Ftiny/prod")
        assert status == 200, body
        assert (json.loads(body)["model_id"], json.loads(body)["version"]) == ("acme/tiny", "1")
        status, body = _get(base, "/api/v1/models/acme%2Ftiny/releases")
        assert status == 200 and [r["version"] for r in json.loads(body)] == ["1"]
        status, body = _get(base, "/api/v1/models/acme%2Ftiny/aliases")
        assert status == 200 and json.loads(body) == {"prod": "1"}
        status, body = _get(base, "/models/acme%2Ftiny/1")
        assert status == 200 and b'href="/models/acme%2Ftiny"' in body
        status, body = _get(base, "/")
        assert status == 200 and b'href="/models/acme%2Ftiny"' in body
        # unencoded, the slash is a path level: release "tiny" of a model "acme" (none here)
        assert _get(base, "/models/acme/tiny")[0] == 404
        for bad in ("/models/acme%252Ftiny", "/models/a%2F..%2Fb",
                    "/api/v1/releases/a%2Fb%2Fc/1"):
            status, body = _get(base, bad)
            assert status in (400, 404), (bad, status)
            assert b"acme/tiny" not in body
