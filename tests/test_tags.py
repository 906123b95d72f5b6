"""Tags of releases and searching the index (issue 32 items 3 and 8).

On local disk and S3 (a real moto server), CLI (real processes) and API;
writers tagging one release at once as real processes lose no update; the
index rebuilt from the store reproduces the tags (SQLite and Postgres).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from registry.api import Registry
from registry.errors import DocumentError, NotCommittedError, ReleaseDeletedError, UsageError
from registry.protocol.layout import tags_key
from registry.lifecycle.tags import read_tags
from registry.store import open_store
from tests.conftest import run_cli, run_cli_batch
from tests.lifecycle_util import cli_error, cli_ok, event_names, publish, workers_ok


def _db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'i.db'}"


def test_tag_set_rm_ls_show(durable_store_url: str, tmp_path: Path) -> None:
    db, url = _db(tmp_path), durable_store_url
    with Registry(url, db=db) as reg:
        publish(reg, tmp_path, "1", "2")
        reg.set_alias("m", "prod", "2")
    doc = cli_ok(run_cli("tag", "set", "m@prod", "team=nlp", "stage=canary", "--json",
                         "--store", url, "--db", db))
    assert doc == {"model_id": "m", "version": "2",
                   "tags": {"stage": "canary", "team": "nlp"}}
    store = open_store(url)
    rec = json.loads(store.read_bytes(tags_key("m", "2")))
    assert rec["tags"] == {"stage": "canary", "team": "nlp"} and rec["actor"]["user"]
    assert cli_ok(run_cli("tag", "set", "m@2", "stage=prod", "--store", url, "--db",
                          db)).splitlines() == ["stage=prod", "team=nlp"]
    # the reads in one process (run_cli_batch)
    tag_ls, show_json, show_text, ls = run_cli_batch([
        ["tag", "ls", "m@2", "--store", url], ["show", "m@2", "--json", "--store", url, "--db", db],
        ["show", "m@2", "--store", url, "--db", db], ["ls", "m", "--json", "--store", url,
                                                      "--db", db]])
    assert cli_ok(tag_ls).splitlines() == ["stage=prod", "team=nlp"]
    show = cli_ok(show_json)
    assert show["tags"] == {"stage": "prod", "team": "nlp"}
    assert "tags: stage=prod team=nlp" in cli_ok(show_text)
    rows = cli_ok(ls)
    assert [r["tags"] for r in rows] == [{"stage": "prod", "team": "nlp"}, {}]
    cli_error(run_cli("tag", "rm", "m@2", "owner", "--store", url, "--db", db), 2,
              "no tag owner")
    assert cli_ok(run_cli("tag", "rm", "m@2", "stage", "--json", "--store", url,
                          "--db", db))["tags"] == {"team": "nlp"}
    assert event_names(store) [-4:] == ["model_version_tag.set", "model_version_tag.set",
                                        "model_version_tag.set", "model_version_tag.deleted"]
    # bad input: one line, exit 2, nothing written
    bad = (["team"], ["-x=1"], ["a=b\x1b[2K"], ["k=" + "v" * 300], ["a=1", "a=2"])
    refused = run_cli_batch([["tag", "set", "m@2", *b, "--store", url, "--db", db] for b in bad]
                            + [["tag", "set", "m@9", "a=1", "--store", url, "--db", db]])
    for p in refused[:-1]:
        cli_error(p, 2)
    cli_error(refused[-1], 3)
    assert read_tags(store, "m", "2") == {"team": "nlp"}


def test_tags_api_and_deleted_release(durable_store_url: str, tmp_path: Path) -> None:
    with Registry(durable_store_url, db=_db(tmp_path)) as reg:
        publish(reg, tmp_path, "1", "2")
        assert reg.set_tags("m", "1", {"a": "1", "b": ""}) == {"a": "1", "b": ""}
        assert reg.tags("m", "1") == {"a": "1", "b": ""}
        assert reg.remove_tags("m", "1", ["b"]) == {"a": "1"}
        with pytest.raises(UsageError, match="at least one"):
            reg.set_tags("m", "1", {})
        with pytest.raises(UsageError, match="at most 64"):
            reg.set_tags("m", "1", {f"k{i}": "v" for i in range(64)})
        assert reg.tags("m", "1") == {"a": "1"}
        with pytest.raises(NotCommittedError):
            reg.set_tags("m", "3", {"a": "1"})
        reg.delete_release("m", "2", "gone")
        with pytest.raises(ReleaseDeletedError):
            reg.set_tags("m", "2", {"a": "1"})
        # a store writer's garbage is refused, bounded, never a traceback
        reg.store.write_bytes(tags_key("m", "1"), b'{"schema": 1, "tags": [1]}')
        with pytest.raises(DocumentError, match="tags"):
            reg.tags("m", "1")
        cli_error(run_cli("tag", "ls", "m@1", "--store", durable_store_url), 5, "tags/m/1.json")


def test_concurrent_taggers_lose_no_update(durable_store_url: str, db_url: str,
                                           tmp_path: Path) -> None:
    """Four processes each set five tags of their own on one release at once:
    all twenty land in the store and the index, each with its event."""
    with Registry(durable_store_url, db=db_url) as reg:
        publish(reg, tmp_path, "1")
    workers_ok(durable_store_url, db_url, "tag", 4, 5)
    want = {f"w{i}-{j}": str(j) for i in range(4) for j in range(5)}
    store = open_store(durable_store_url)
    assert read_tags(store, "m", "1") == want
    assert event_names(store).count("model_version_tag.set") == 20
    with Registry(durable_store_url, db=db_url) as reg:
        assert reg.show("m", "1")["tags"] == want


def test_query_search(durable_store_url: str, db_url: str, tmp_path: Path) -> None:
    url = durable_store_url
    with Registry(url, db=db_url) as reg:
        publish(reg, tmp_path, "1", "2", "3")
        publish(reg, tmp_path, "1", model_id="other")
        reg.set_tags("m", "1", {"team": "nlp", "stage": "eval"})
        reg.set_tags("m", "3", {"team": "nlp"})
        reg.set_tags("other", "1", {"team": "vision"})
        reg.yank("m", "3", "bad")
        created = {r["version"]: r["created_at"] for r in reg.ls("m")}

    # The read-only queries of each step run in one process (run_cli_batch):
    # each through the console script's main(), as a fresh process would.
    def store_db(*args: str) -> list[str]:
        return ["query", *args, "--store", url, "--db", db_url]

    def names(p: subprocess.CompletedProcess[str]) -> list[str]:
        return [f"{r['model_id']}@{r['version']}" for r in cli_ok(p)]

    expected = [
        (("--tag", "team=nlp"), ["m@3", "m@1"]),
        (("--tag", "team"), ["m@3", "m@1", "other@1"]),
        (("--tag", "team=nlp", "--tag", "stage=eval"), ["m@1"]),
        (("other", "--tag", "team"), ["other@1"]),
        (("--tag", "team=nobody"), []),
        (("--dtype", "f32", "m"), ["m@3", "m@2", "m@1"]),
        (("--dtype", "bf16"), []),
        (("--since", created["2"], "m"), ["m@3", "m@2"]),
        (("--since", "1d", "--tag", "team=vision"), ["other@1"]),
        (("--since", "2099-01-01"), []),
        (("--tag", "team=nlp", "--source", "wiki"), ["m@3", "m@1"]),
        (("--tag", "team=nlp", "--source", "books"), []),
    ]
    refused = [(("--since", "yesterday"), "--since"), (("--tag", "-bad"), "tag key"),
               (("m", "--passing", "--tag", "a"), "--passing")]
    again = [("--tag", "team"), ("--tag", "stage=eval")]
    got = run_cli_batch([store_db(*a, "--json") for a, _ in expected]
                        + [store_db("--tag", "team=nlp", "--json"),
                           store_db("--tag", "stage=eval")]
                        + [store_db(*a) for a, _ in refused]
                        + [store_db(*a, "--json") for a in again])
    for (args, want), p in zip(expected, got, strict=False):
        assert names(p) == want, args
    rows = cli_ok(got[len(expected)])
    assert [r["yanked"] for r in rows] == [True, False]
    assert rows[1]["tags"] == {"stage": "eval", "team": "nlp"}
    text = cli_ok(got[len(expected) + 1])
    assert text.split("\t")[0] == "m@1" and "stage=eval team=nlp" in text
    for (_, needle), p in zip(refused, got[len(expected) + 2:], strict=False):
        cli_error(p, 2, needle)
    before = [names(p) for p in got[-len(again):]]
    # the index rebuilt from the store answers the same
    cli_ok(run_cli("index", "rebuild", "--json", "--store", url, "--db", db_url))
    assert [names(p) for p in run_cli_batch([store_db(*a, "--json") for a in again])] == before


def test_web_search_box_tags_and_yanks(tmp_path: Path) -> None:
    """The web's search box, the version page's tags and yank, the JSON API; a
    store writer's tag value is shown escaped, never as markup."""
    from fastapi.testclient import TestClient

    from registry.web import create_app

    url, db = str(tmp_path / "store"), _db(tmp_path)
    with Registry(url, db=db) as reg:
        publish(reg, tmp_path, "1", "2")
        reg.set_tags("m", "1", {"team": "nlp", "note": "<script>alert(1)</script>"})
        reg.yank("m", "2", "licence <b>withdrawn</b>")
        with TestClient(create_app(reg), base_url="http://localhost") as c:
            home = c.get("/")
            assert home.status_code == 200 and 'action="/search"' in home.text
            r = c.get("/search", params={"tag": "team=nlp"})
            assert r.status_code == 200 and 'href="/models/m/1"' in r.text
            assert 'href="/models/m/2"' not in r.text
            assert "<script>" not in r.text and "&lt;script&gt;" in r.text
            r = c.get("/search", params={"dtype": "f32"})
            assert 'href="/models/m/1"' in r.text and "yanked" in r.text
            assert c.get("/search", params={"since": "yesterday"}).status_code == 400
            page = c.get("/models/m/2").text
            assert 'id="yanked"' in page and "licence &lt;b&gt;withdrawn&lt;/b&gt;" in page
            assert "<b>withdrawn" not in page
            assert 'id="tags"' in c.get("/models/m/1").text
            api = c.get("/api/v1/search", params=[("tag", "team"), ("tag", "note")]).json()
            assert [(r["model_id"], r["version"]) for r in api] == [("m", "1")]
            assert c.get("/api/v1/releases/m/1").json()["tags"]["team"] == "nlp"
            gates = c.get("/api/v1/releases/m/2/gates").json()
            assert gates["passed"] is False and gates["gates"][-1]["gate"] == "yanked"


def test_query_source_finds_the_family_when_no_source_matches_exactly(tmp_path: Path) -> None:
    """``query --source books`` finds ``books-2025`` (issue 44): an exact id
    first; when no release lists it, the ids of its family (``books`` followed
    by - _ . / :), never another word that starts the same (``bookshelf``)."""
    from tests.lifecycle_util import model_dir
    from tests.release_util import ledger_row, summary

    url, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    with Registry(url, db=db) as reg:
        for version, sources in (("1", ["books-2025"]), ("2", ["books-2026", "wiki"]),
                                 ("3", ["bookshelf"]), ("4", ["books_v2"])):
            reg.publish(model_dir(tmp_path), "m", version,
                        ledger=[ledger_row(s) for s in sources], eval_summary=summary())
        family = reg.releases_for_source("books")
        assert [(r["version"], r["source_id"]) for r in family] == [
            ("1", "books-2025"), ("2", "books-2026"), ("4", "books_v2")]
        assert [r["version"] for r in reg.releases_for_source("books-2025")] == ["1"]
        assert [r["version"] for r in reg.releases_for_source("bookshelf")] == ["3"]
        assert reg.releases_for_source("book") == []  # no separator after "book"
        assert reg.releases_for_source("books%") == []  # LIKE wildcards are literal
        r = run_cli("query", "--source", "books", "--store", url, "--db", db)
        assert r.returncode == 0, r.stderr
        assert r.stderr == ("no source is named books exactly: showing the releases of "
                            "books-2025, books-2026, books_v2\n")
        assert [ln.split("\t")[0] + " " + ln.split("\t")[-1]
                for ln in r.stdout.splitlines()] == [
            "m@1 books-2025", "m@2 books-2026", "m@4 books_v2"]
        reg.publish(model_dir(tmp_path), "m", "5", ledger=[ledger_row("books")],
                    eval_summary=summary())
        assert [r["version"] for r in reg.releases_for_source("books")] == ["5"]  # exact wins
    r = run_cli("query", "--source", "books-20", "--store", url, "--db", db)
    assert r.returncode == 0 and r.stdout == "" and "no release" in r.stderr
    r = run_cli("query", "--source", "wiki", "--store", url, "--db", db)
    assert r.returncode == 0 and r.stdout.splitlines()[0].startswith("m@2\t")
    assert r.stderr == ""
