"""A training run's writer that pauses in the middle of a save (tests/test_ckpt_gc_live.py).

``python -m tests.support.paused_saver_child URL RUN BARRIER_DIR``

Saves step 100 of run ``RUN``, then step 200 -- pausing with every file of
step 200 staged but nothing committed: it creates ``BARRIER_DIR/staged`` and
waits for ``BARRIER_DIR/go``. Then it commits, moves the pointer, closes its
manager (releasing the writer lease) and prints one JSON line ``{"ok",
"error", "latest"}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def main() -> int:
    url, run, barrier = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    from registry.checkpoint import CheckpointManager
    from registry.commit import DirectoryWriter
    from registry.errors import RegistryError
    from registry.store import open_store
    from tests.ckpt_util import save

    real_commit = DirectoryWriter.commit

    def paused_commit(self: DirectoryWriter) -> Any:
        if self.prefix.endswith("200"):
            (barrier / "staged").touch()
            deadline = time.monotonic() + 120
            while not (barrier / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return real_commit(self)

    DirectoryWriter.commit = paused_commit  # type: ignore[method-assign]
    out: dict[str, Any] = {"ok": False, "error": None, "latest": None}
    try:
        with CheckpointManager(open_store(url), run, keep_ckpts=0, async_save=False) as mgr:
            save(mgr, 100)
            save(mgr, 200)
            out["latest"] = mgr.tree.latest()
        out["ok"] = True
    except RegistryError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
