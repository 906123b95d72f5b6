"""A child process that appends N events to a store (tests/test_events.py's race).

    python tests/support/event_writer.py STORE_URL TAG N
"""

from __future__ import annotations

import sys

from registry.events import append_event
from registry.store import open_store


def main() -> None:
    url, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open_store(url) as store:
        for i in range(count):
            append_event(store, "model_version_tag.set", model_id="m", version="1",
                         data={"writer": tag, "i": i})


if __name__ == "__main__":
    main()
