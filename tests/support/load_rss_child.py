"""Stream a release through the weights reader, dropping each tensor, and
report the resident set (tests/test_load_sources.py).

Usage: ``load_rss_child.py STORE_URL REF WINDOW_BYTES``; prints one JSON line
``{"base": KiB, "peak": KiB, "tensors": n, "bytes": n}`` (Linux
/proc/self/status VmRSS before, VmHWM after; the mark reset first).
"""

from __future__ import annotations

import json
import re
import sys


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    assert m is not None, field
    return int(m.group(1))


def main() -> None:
    url, ref, window = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from registry.load import open_weights

    with open_weights(ref, store=url, framework="np", window_bytes=window, workers=2) as w:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _kib("VmRSS")
        for _name, tensor in w:
            del tensor
        stats = w.stats.to_dict()
    print(json.dumps({"base": base, "peak": _kib("VmHWM"), "tensors": stats["tensors"],
                      "bytes": stats["bytes"]}))


if __name__ == "__main__":
    main()
