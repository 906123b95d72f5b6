"""A training job preempted in the middle of a save (tests/test_sigterm.py).

``python -m tests.support.sigterm_saver_child URL RUN BARRIER_DIR``

Handles SIGTERM as the registry's processes do
(:func:`registry.host.interrupt.terminate_like_interrupt`), saves step 100, then
step 200 -- pausing with every file of step 200 staged but nothing committed:
it creates ``BARRIER_DIR/staged`` and sleeps there until a signal arrives.
Exits with :func:`registry.host.interrupt.exit_code` once interrupted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any


def main() -> int:
    url, run, barrier = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    from registry.host import interrupt
    from registry.checkpoint import CheckpointManager
    from registry.protocol.commit import DirectoryWriter
    from tests.ckpt_util import save

    interrupt.terminate_like_interrupt()
    real_commit = DirectoryWriter.commit

    def paused_commit(self: DirectoryWriter) -> Any:
        if self.prefix.endswith("-000200"):
            (barrier / "staged").touch()
            time.sleep(120)
        return real_commit(self)

    DirectoryWriter.commit = paused_commit  # type: ignore[method-assign]
    try:
        with CheckpointManager(url, run, keep_ckpts=0, async_save=False) as mgr:
            save(mgr, 100)
            save(mgr, 200)
    except KeyboardInterrupt:
        print(f"interrupted by {interrupt.signal_name()}", file=sys.stderr)
        return interrupt.exit_code()
    return 0


if __name__ == "__main__":
    sys.exit(main())
