"""A damaged alias pointer (garbled bytes in ``refs/<alias>``: bit rot, or a
store writer) is named wherever aliases are read, never treated as absent:
``alias ls`` warns and still lists the others; ``release delete`` and
``release gc`` keep what it may point at; ``index rebuild`` reports it;
``ledger revoke`` warns that it serves nothing; ``alias set`` mends it."""

from __future__ import annotations

import json
from pathlib import Path

from registry.api import Registry
from registry.layout import alias_key, release_prefix, tombstone_key
from registry.manifest import MANIFEST
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
