"""A writer for the pointer race tests, with ``flock`` stubbed out (as on
Lustre, GPFS or some NFS mounts, where it returns success and locks nothing).

    python -m tests.support.cas_child STORE KEY N     # N increments of KEY
    python -m tests.support.cas_child STORE alias M A V   # set_alias, prints ok/conflict

Each increment reads the pointer (``n000041``) and swaps in the next value
with compare-and-swap, retrying a lost race; a lost update shows as a final
count below the sum of every writer's N.
"""

import fcntl
import sys

fcntl.flock = lambda *a, **k: None  # type: ignore[assignment]
fcntl.lockf = lambda *a, **k: None  # type: ignore[assignment]

from registry.refs.aliases import set_alias  # noqa: E402
from registry.errors import PointerConflictError  # noqa: E402
from registry.protocol.pointer import move_pointer, read_pointer  # noqa: E402
from registry.store import open_store  # noqa: E402


def main() -> None:
    store = open_store(sys.argv[1])
    if sys.argv[2] == "alias":
        try:
            set_alias(store, sys.argv[3], sys.argv[4], sys.argv[5])
            print("ok")
        except PointerConflictError:
            print("conflict")
        return
    key, n = sys.argv[2], int(sys.argv[3])
    store.ensure_root()  # a writer of a new store
    done = 0
    while done < n:
        current = read_pointer(store, key)
        nxt = f"n{(int(current[1:]) if current else 0) + 1:06d}"
        try:
            move_pointer(store, key, nxt, expected=current, check_expected=True)
        except PointerConflictError:
            continue
        done += 1
    print(done)


if __name__ == "__main__":
    main()
