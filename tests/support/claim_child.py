"""A writer that claims a directory, writes one file, says so, and waits
(to be killed, or to hold its claim while another writer tries).

    python -m tests.support.claim_child STORE PREFIX          # hold the claim
    python -m tests.support.claim_child STORE PREFIX late     # a late writer

A late writer says it is ready in the middle of writing ``model.bin`` (the
test stops it there, lets its lease lapse and another writer commit), then
finishes the file and commits.
"""

import sys
import time

from registry.protocol.commit import DirectoryWriter
from registry.store import open_store

if __name__ == "__main__":
    store = open_store(sys.argv[1])
    with DirectoryWriter(store, sys.argv[2], kind="checkpoint",
                         meta={"run_id": "r", "step": 1}) as w:
        if sys.argv[3:] == ["late"]:
            with w.open("model.bin") as f:
                f.write(b"A" * 1000)
                print(w.staging, flush=True)
                time.sleep(3)
            w.commit()
            sys.exit(0)
        w.write_bytes("partial.bin", b"p" * 1000)
        print(w.staging, flush=True)
        time.sleep(600)
