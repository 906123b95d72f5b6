"""Stream a release through the weights reader, dropping each tensor, and
report the resident set (tests/test_load_sources.py).

Usage: ``load_rss_child.py STORE_URL REF WINDOW_BYTES``; prints one JSON line
``{"base": KiB, "peak": KiB, "tensors": n, "bytes": n}`` (Linux
/proc/self/status VmRSS before, VmHWM after; the mark reset first).
"""

from __future__ import annotations

import json
import sys

from tests.support.rss import reset_peak, status_kib


def main() -> None:
    url, ref, window = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from registry.load import open_weights

    with open_weights(ref, store=url, framework="np", window_bytes=window, workers=2) as w:
        base = reset_peak()
        for _name, tensor in w:
            del tensor
        stats = w.stats.to_dict()
    print(json.dumps({"base": base, "peak": status_kib("VmHWM"), "tensors": stats["tensors"],
                      "bytes": stats["bytes"]}))


if __name__ == "__main__":
    main()
