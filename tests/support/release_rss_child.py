"""One ``release create`` from a dist_ckpt step, reporting its peak RSS
(tests/test_release_dist_ckpt.py, bench/dcp_bench.py).

Usage: ``release_rss_child.py STORE_URL CHECKPOINT_PATH STEP HF_MODEL_PATH``;
prints one JSON line ``{"base": KiB, "peak": KiB, "files": n}``: the resident
set before the release (every module imported) and its high-water mark during
it (Linux: /proc/self/status VmRSS, VmHWM; the mark is reset through
/proc/self/clear_refs first).
"""

from __future__ import annotations

import json
import sys

from tests.support.rss import reset_peak, status_kib


def main() -> None:
    url, root, step, hf = sys.argv[1:5]
    import torch  # noqa: F401 - imported before the baseline

    import registry.release.dcp_source  # noqa: F401
    from registry.checkpoint.layout import LOONGSAGE
    from registry.release.model_release import ModelRelease
    from tests.release_util import ledger_row, summary

    rel = ModelRelease(url)
    base = reset_peak()
    result = rel.create(None, int(step), "big", "1", ledger=[ledger_row()],
                        eval_summary=summary(), layout=LOONGSAGE, checkpoint_root=root,
                        subdir="dist_ckpt", hf_model_path=hf, max_shard_size="16MB")
    print(json.dumps({"base": base, "peak": status_kib("VmHWM"),
                      "files": len(result.manifest.files)}))


if __name__ == "__main__":
    main()
