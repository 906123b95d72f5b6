"""A child process that moves an alias (tests/test_alias_history.py).

    python -m tests.support.alias_child STORE_URL MODEL ALIAS VERSION [crash]

With ``crash`` it SIGKILLs itself after the history entry is created and before
the pointer's compare-and-swap. Prints ``ok`` or the error's class name.
"""

from __future__ import annotations

import os
import signal
import sys

from registry.refs.aliases import set_alias
from registry.errors import RegistryError
from registry.store import open_store


def main() -> None:
    url, model, alias, version = sys.argv[1:5]
    store = open_store(url)
    if sys.argv[5:] == ["crash"]:
        def killed(*_: object) -> None:
            os.kill(os.getpid(), signal.SIGKILL)
        store.swap = killed  # type: ignore[method-assign]
    try:
        set_alias(store, model, alias, version)
        print("ok")
    except RegistryError as e:
        print(type(e).__name__)


if __name__ == "__main__":
    main()
