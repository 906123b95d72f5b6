"""A child process for the lifecycle races (tests/test_lifecycle.py, tests/test_tags.py).

    python tests/support/lifecycle_child.py STORE DB tag MODEL VERSION WRITER N
        sets WRITER-0 .. WRITER-(N-1) on MODEL@VERSION, one tag per call
    python tests/support/lifecycle_child.py STORE DB toggle MODEL VERSION WRITER N
        yanks then unyanks MODEL@VERSION N times
    python tests/support/lifecycle_child.py STORE DB delete MODEL VERSION
        deletes MODEL@VERSION; prints "deleted" or "already"
    python tests/support/lifecycle_child.py STORE DB alias MODEL VERSION ALIAS
        points ALIAS at VERSION; prints "set" or the error's class

Every call goes through the Registry facade (store, then index), as the CLI does.
"""

from __future__ import annotations

import sys
import warnings

from registry.api import Registry
from registry.errors import RegistryError


def main() -> None:
    store, db, op, model_id, version = sys.argv[1:6]
    rest = sys.argv[6:]
    warnings.simplefilter("error")
    with Registry(store, db) as reg:
        if op == "tag":
            writer, n = rest[0], int(rest[1])
            for i in range(n):
                reg.set_tags(model_id, version, {f"{writer}-{i}": str(i)})
        elif op == "toggle":
            writer, n = rest[0], int(rest[1])
            for i in range(n):
                reg.yank(model_id, version, f"{writer} {i}")
                reg.unyank(model_id, version)
        elif op == "delete":
            try:
                _, deleted = reg.delete_release(model_id, version, "race")
            except RegistryError as e:
                print(type(e).__name__)
                return
            print("deleted" if deleted else "already")
        elif op == "alias":
            try:
                reg.set_alias(model_id, rest[0], version, force=True)
            except RegistryError as e:
                print(type(e).__name__)
                return
            print("set")
        else:
            raise SystemExit(f"unknown op {op!r}")


if __name__ == "__main__":
    main()
