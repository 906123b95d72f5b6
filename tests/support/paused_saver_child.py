"""A training run's writer that pauses in the middle of a save (tests/test_ckpt_gc_live.py).

``python -m tests.support.paused_saver_child URL LAYOUT TREE BARRIER_DIR``

Saves step 100, then step 200 -- pausing with every file of step 200 staged
but nothing committed: it creates ``BARRIER_DIR/staged`` and waits for
``BARRIER_DIR/go``. Then it commits, moves the pointer, closes its writer
(releasing the writer lease) and prints one JSON line ``{"ok", "error",
"latest"}``. ``LAYOUT`` ``tinyllm``: a CheckpointManager of run ``TREE``;
``loongsage``: a LoongSageCheckpointer of ``checkpoint_path`` ``TREE``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def main() -> int:
    url, layout, tree, barrier = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
    from registry.checkpoint import CheckpointManager
    from registry.checkpoint.loongsage import LoongSageCheckpointer
    from registry.protocol.commit import DirectoryWriter
    from registry.errors import RegistryError
    from registry.store import open_store
    from tests.ckpt_util import adamw, model, save

    real_commit = DirectoryWriter.commit

    def paused_commit(self: DirectoryWriter) -> Any:
        if self.prefix.rsplit("/", 1)[-1].endswith("_200") or self.prefix.endswith("-000200"):
            (barrier / "staged").touch()
            deadline = time.monotonic() + 120
            while not (barrier / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return real_commit(self)

    DirectoryWriter.commit = paused_commit  # type: ignore[method-assign]
    out: dict[str, Any] = {"ok": False, "error": None, "latest": None}
    try:
        if layout == "tinyllm":
            with CheckpointManager(open_store(url), tree, keep_ckpts=0, async_save=False) as mgr:
                save(mgr, 100)
                save(mgr, 200)
                out["latest"] = mgr.tree.latest()
        else:
            ckpt = LoongSageCheckpointer(open_store(url), tree, save_freq=100, total_steps=1000,
                                         async_save=False)
            try:
                for step in (100, 200):
                    params = model(step)
                    ckpt.maybe_save(step, model=params, optimizer_state=adamw(params),
                                    scheduler_state={"last_step": step}, rng_state={"seed": 1},
                                    data_sources=[{"prompt_data_path": "data/a.jsonl",
                                                   "state": {"offset": step}}])
            finally:
                ckpt.finish()
            out["latest"] = ckpt.tree.latest()
        out["ok"] = True
    except RegistryError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
