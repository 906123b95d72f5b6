"""The resident set of this process (Linux /proc/self/status), for the
children that report a peak: tests/support/load_rss_child.py and
release_rss_child.py."""

from __future__ import annotations

import re


def status_kib(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM), in KiB."""
    with open("/proc/self/status") as f:
        m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
    assert m is not None, field
    return int(m.group(1))


def reset_peak() -> int:
    """Reset the high-water mark (VmHWM) to the resident set now, through
    /proc/self/clear_refs, and return that resident set (VmRSS, KiB)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kib("VmRSS")
