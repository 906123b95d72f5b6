"""A damaged alias pointer (garbled bytes in ``refs/<alias>``: bit rot, or a
store writer) is named wherever aliases are read, never treated as absent:
``alias ls`` warns and still lists the others; ``release delete`` and
``release gc`` keep what it may point at; ``index rebuild`` reports it;
``ledger revoke`` warns that it serves nothing; ``alias set`` mends it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from registry.api import Registry
from registry.protocol.layout import alias_key, release_prefix, tombstone_key
from registry.protocol.manifest import MANIFEST
from registry.store import open_store
from tests.conftest import run_cli_batch
from tests.lifecycle_util import cli_error, cli_ok, publish

GARBLED = b"\x00\xffnot a pointer\n"


def test_a_damaged_alias_is_named_and_protects_every_release(durable_store_url: str,
                                                           tmp_path: Path) -> None:
    url, db = durable_store_url, f"sqlite:///{tmp_path / 'i.db'}"
    with Registry(url, db=db) as reg:
        publish(reg, tmp_path, "1", "2", "3")
        reg.set_alias("m", "prod", "3")
        reg.set_alias("m", "canary", "1")
    store = open_store(url)
    store.write_bytes(alias_key("m", "canary"), GARBLED)
    pointer = store.url_of(alias_key("m", "canary"))
    s = ["--store", url]
    ls, ls_json, delete, gc, rebuild, revoke = run_cli_batch([
        ["alias", "ls", "m", *s],
        ["alias", "ls", "m", "--json", *s],
        ["release", "delete", "m@1", "--reason", "old", *s, "--db", db],
        ["release", "gc", "--unaliased", "--json", *s, "--db", db],
        ["index", "rebuild", "--json", *s, "--db", db],
        ["ledger", "revoke", "nope", "--reason", "r", *s, "--db", db],
    ])

    # alias ls: the readable alias listed, the damaged one named on stderr
    assert ls.returncode == 0 and ls.stdout == "prod\t3\n", (ls.stdout, ls.stderr)
    warning = ls.stderr.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("warning: damaged alias canary"), warning
    assert pointer in warning[0] and "registry alias set" in warning[0]
    assert json.loads(ls_json.stdout) == {"prod": "3"}

    # release delete: refused (it may be what canary pointed at), nothing changed
    cli_error(delete, 4, "not deleted", "canary", "cannot be read")
    assert store.exists(f"{release_prefix('m', '1')}/{MANIFEST}")
    assert not store.exists(tombstone_key("m", "1"))

    # release gc --unaliased: every release kept, the damaged alias the reason
    report = cli_ok(gc)
    assert report["deleted"] == []
    kept = {r["version"]: r["reason"] for r in report["kept"]}
    assert kept["3"] == "alias prod points at it"
    assert "canary" in kept["1"] and "cannot be read" in kept["2"], kept
    for v in ("1", "2", "3"):
        assert store.exists(f"{release_prefix('m', v)}/{MANIFEST}")

    # index rebuild: succeeds, reports it
    done = cli_ok(rebuild)
    assert {"action": "damaged", "what": "m@canary"} == {
        k: v for r in done["report"] if r["what"] == "m@canary" for k, v in r.items()
        if k != "reason"}, done["report"]
    assert done["aliases"] == 1

    # ledger revoke: the damaged alias serves nothing, said without a Python repr
    assert revoke.returncode == 0, revoke.stderr
    line = [x for x in revoke.stderr.splitlines() if "m@canary" in x]
    assert len(line) == 1 and "damaged alias" in line[0] and "None" not in line[0], line

    # alias set mends it; then it is listed and protects only its own release
    mend, ls2, delete2 = run_cli_batch([
        ["alias", "set", "m", "canary", "2", *s, "--db", db],
        ["alias", "ls", "m", *s],
        ["release", "delete", "m@1", "--reason", "old", *s, "--db", db],
    ])
    assert mend.returncode == 0, mend.stderr
    assert ls2.stdout == "canary\t2\nprod\t3\n" and ls2.stderr == "", (ls2.stdout, ls2.stderr)
    assert delete2.returncode == 0, delete2.stderr
    assert store.exists(tombstone_key("m", "1"))


def _entry(store_url: str, new: str) -> bytes:
    """prod's pointer (an alias entry) rewritten as canary's, naming ``new``."""
    store = open_store(store_url)
    doc = json.loads(store.read_bytes(alias_key("m", "prod")))
    return json.dumps({**doc, "alias": "canary", "new": new}).encode()


DAMAGE = {
    "oversized": lambda url: b"1\n" + b" " * (70 << 10),
    "not utf-8": lambda url: b"\xff\xfe\n",
    "empty": lambda url: b"",
    "version with a newline": lambda url: _entry(url, "1\n"),
    "a reserved version name": lambda url: _entry(url, "refs"),
    "a staging name": lambda url: _entry(url, "x.tmp"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_every_kind_of_damaged_pointer_is_named_and_mended(
        kind: str, durable_store_url: str, tmp_path: Path) -> None:
    """Each damage is named by ``alias ls`` and keeps ``release delete`` off
    every release; ``alias set`` replaces the pointer (an oversized one too:
    the mend reads it once, bounded by REGISTRY_MAX_READ_BYTES) and ``alias
    rm`` removes a damaged alias outright."""
    url, db = durable_store_url, f"sqlite:///{tmp_path / 'i.db'}"
    with Registry(url, db=db) as reg:
        publish(reg, tmp_path, "1", "2")
        reg.set_alias("m", "prod", "2")
    store = open_store(url)
    bad = DAMAGE[kind](url)
    s = ["--store", url]
    for mend in (["alias", "set", "m", "canary", "1"], ["alias", "rm", "m", "canary"]):
        store.write_bytes(alias_key("m", "canary"), bad)
        ls, delete, fix, after = run_cli_batch([
            ["alias", "ls", "m", *s],
            ["release", "delete", "m@1", "--reason", "old", *s, "--db", db],
            [*mend, *s, "--db", db],
            ["alias", "ls", "m", "--json", *s],
        ])
        assert ls.returncode == 0 and ls.stdout == "prod\t2\n", (ls.stdout, ls.stderr)
        assert ls.stderr.startswith("warning: damaged alias canary"), ls.stderr
        assert len(ls.stderr.strip().splitlines()) == 1 and "None" not in ls.stderr
        cli_error(delete, 4, "canary", "cannot be read")
        assert fix.returncode == 0, (mend, fix.stdout, fix.stderr)
        want = {"prod": "2", "canary": "1"} if mend[1] == "set" else {"prod": "2"}
        assert json.loads(after.stdout) == want and after.stderr == "", after.stderr
        assert store.exists(f"{release_prefix('m', '1')}/{MANIFEST}")
        if mend[1] == "rm":  # said without a Python None, and so is its history
            assert fix.stdout == "m@canary removed (was a damaged pointer)\n", fix.stdout
            log, = run_cli_batch([["alias", "log", "m", "canary", *s]])
            assert log.returncode == 0 and "None" not in log.stdout + log.stderr, log.stdout


@pytest.mark.parametrize("kind", ["folder", "link", "fifo"])
def test_a_folder_or_link_where_a_pointer_goes_is_a_damaged_alias(
        kind: str, tmp_path: Path) -> None:
    """Local disk: a folder, a link (to a file outside the store) or a FIFO at
    ``refs/canary``. Listings skip links and special files; the alias is still
    named damaged, delete refuses, and a rebuild over an index that held
    canary reports it instead of failing."""
    url, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    with Registry(url, db=db) as reg:
        publish(reg, tmp_path, "1", "2")
        reg.set_alias("m", "prod", "2")
        reg.set_alias("m", "canary", "1")
    pointer = tmp_path / "store" / "models" / "m" / "refs" / "canary"
    outside = tmp_path / "outside"
    outside.write_text("1\n")
    pointer.unlink()
    {"folder": lambda: pointer.mkdir(), "link": lambda: pointer.symlink_to(outside),
     "fifo": lambda: os.mkfifo(pointer)}[kind]()
    s = ["--store", url]
    ls, delete, rebuild = run_cli_batch([
        ["alias", "ls", "m", *s],
        ["release", "delete", "m@1", "--reason", "old", *s, "--db", db],
        ["index", "rebuild", "--json", *s, "--db", db],
    ])
    assert ls.returncode == 0 and ls.stdout == "prod\t2\n", (ls.stdout, ls.stderr)
    assert "damaged alias canary" in ls.stderr, ls.stderr
    cli_error(delete, 4, "canary")
    assert store_has(url, f"{release_prefix('m', '1')}/{MANIFEST}")
    assert rebuild.returncode == 0, rebuild.stderr
    report = json.loads(rebuild.stdout)["report"]
    assert [r["action"] for r in report if r["what"] == "m@canary"] == ["damaged"], report
    assert outside.read_text() == "1\n"  # the link's target is never touched


def store_has(url: str, key: str) -> bool:
    return open_store(url).exists(key)


def test_a_long_lived_store_forgets_a_link_once_it_is_gone(tmp_path: Path) -> None:
    """A Store keeps what its listings skipped; an alias named damaged for a
    link at its pointer is not damaged once the link is gone (or replaced)."""
    from registry.refs.aliases import list_aliases

    url = str(tmp_path / "store")
    with Registry(url, db=f"sqlite:///{tmp_path / 'i.db'}") as reg:
        publish(reg, tmp_path, "1")
        reg.set_alias("m", "canary", "1")
    pointer = tmp_path / "store" / "models" / "m" / "refs" / "canary"
    saved = pointer.read_bytes()
    pointer.unlink()
    pointer.symlink_to(tmp_path / "elsewhere")
    store = open_store(url)
    damaged: dict[str, str] = {}
    assert list_aliases(store, "m", damaged=damaged) == {} and list(damaged) == ["canary"]
    pointer.unlink()
    pointer.write_bytes(saved)  # mended by hand
    damaged.clear()
    assert list_aliases(store, "m", damaged=damaged) == {"canary": "1"} and damaged == {}
    pointer.unlink()  # and gone
    assert list_aliases(store, "m", damaged=damaged) == {} and damaged == {}
