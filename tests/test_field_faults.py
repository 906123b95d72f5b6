"""Issue 13 item 5: throttling and broken connections, as a fault matrix.

A small publish -- a directory commit (a small file, a two-part multipart
file, the claim, the manifest) then a pointer move, then a full read back --
runs through the fault proxy once cleanly to count its requests; then once
per (fault, request) pair with that one request faulted: 503 SlowDown, 500
InternalError, a connection reset, an answer later than the read timeout,
and an error reported after the server did the work. Each run must either
succeed (retried, bounded) or fail with one RegistryError; never a committed
directory that does not verify, never a pointer naming an uncommitted
directory. The matrix is printed with the test output.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path


import pytest

import registry.store.s3 as s3mod
from registry.commit import commit_local_directory
from registry.errors import RegistryError
from registry.pointer import move_pointer, read_pointer
from registry.store import Store
from registry.verify import is_committed, verify_directory
from tests.conftest import proxied
from tests.support.faultproxy import Action, FaultProxy, Request

READ_TIMEOUT = 1.0
#: each fault is tried at every STRIDE-th request (a run costs 2-5 s on the
#: test machine; the full 30 x 5 matrix takes over 7 minutes).
STRIDE = 4
FAULTS = {
    "503": Action("error", status=503, code="SlowDown"),
    "500": Action("error", status=500, code="InternalError"),
    "reset": Action("reset"),
    "timeout": Action("delay", seconds=READ_TIMEOUT + 0.5),
    "done+500": Action("error_after", status=500, code="InternalError"),
}


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text('{"a": 1}')
    (src / "model.bin").write_bytes(b"w" * (s3mod.PART_SIZE + 1000))  # two parts
    return src


def _publish(store: Store, src: Path) -> None:
    commit_local_directory(store, src, "models/m/1", kind="checkpoint", run_id="r", step=1)
    move_pointer(store, "models/m/refs/prod", "1")
    assert verify_directory(store, "models/m/1", full=True).ok


def _invariants(store: Store) -> None:
    if is_committed(store, "models/m/1"):
        report = verify_directory(store, "models/m/1", full=True)
        assert report.ok and report.extras == (), report.to_dict()
    pointer = read_pointer(store, "models/m/refs/prod")
    if pointer is not None:
        assert is_committed(store, f"models/m/{pointer}")


@pytest.mark.slow
def test_fault_matrix(s3_bucket: str, proxy: FaultProxy, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    src = _source(tmp_path)
    config = {"config_kwargs": {"read_timeout": READ_TIMEOUT, "connect_timeout": 2}}

    def store_for(case: str) -> Store:
        return proxied(f"s3://{s3_bucket}/{case}", proxy, **config)

    _publish(store_for("clean"), src)  # also runs the conditional-write probe once
    proxy.log.clear()
    _publish(store_for("count"), src)
    ops = [r.op for r in proxy.log]
    rows, outcomes = [], Counter()
    started = time.monotonic()
    for fault_index, (fault, action) in enumerate(FAULTS.items()):
        line = [" "] * (fault_index % STRIDE)
        for target in range(fault_index % STRIDE, len(ops), STRIDE):
            case = f"{fault}-{target}"
            store = store_for(case)
            proxy.log.clear()
            base = len(proxy.log)
            hit: list[str] = []

            def rule(req: Request, target: int = target, base: int = base,
                     act: Action = action, hit: list[str] = hit) -> Action | None:
                if len(proxy.log) - 1 - base == target and not hit:
                    hit.append(req.op)
                    return act
                return None

            proxy.rules[:] = [rule]
            t0 = time.monotonic()
            try:
                _publish(store, src)
                outcome = "ok"
            except RegistryError as e:
                assert len(str(e).splitlines()) == 1
                outcome = type(e).__name__
            finally:
                proxy.rules.clear()
            if os.environ.get("FAULT_TRACE"):
                print(case, hit, outcome, f"{time.monotonic() - t0:.1f}s", flush=True)
            _invariants(store_for(case))
            outcomes[outcome] += 1
            line.append("." if outcome == "ok" else "E")
            line.extend(" " * (STRIDE - 1))
        rows.append(f"{fault:>9} {''.join(line)}")
    header = " " * 10 + "".join(op[0] for op in ops)
    legend = ", ".join(f"{op[0]}={op}" for op in dict.fromkeys(ops))
    with capsys.disabled():
        print(f"\nfault matrix: {len(ops)} requests x {len(FAULTS)} faults "
              f"({time.monotonic() - started:.0f} s); . = succeeded after retries, "
              f"E = failed with one clear error\n{header}\n" + "\n".join(rows)
              + f"\n({legend}); outcomes: {dict(outcomes)}")
    # Throttling, server errors and lost answers are retried to success.
    assert outcomes["ok"] >= sum(outcomes.values()) * 0.9, dict(outcomes)
