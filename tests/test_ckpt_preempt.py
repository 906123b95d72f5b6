"""Save on preemption (issue 46 item 4): a SIGTERM reaching one rank of a real
2-rank training job (tests/support/dcp_child.py, gloo) in the middle of a
step makes every rank finish the async save in flight, save that step,
move the tracker and exit 143; resuming from it ends bit for bit where the
uninterrupted job ends. On local disk and S3 (moto)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from registry.store import open_store
from tests.test_loongsage_dcp import committed, job, lines, tracker

torch = pytest.importorskip("torch") if os.environ.get("REGISTRY_REQUIRE_ENGINES") != "1" \
    else __import__("torch")


@pytest.mark.slow
@pytest.mark.parametrize("url_kind", ["local", "s3"])
def test_sigterm_mid_step_saves_that_step_on_every_rank_and_resumes_bitwise(
        url_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    from tests.conftest import make_store_url

    url = make_store_url(url_kind, request, tmp_path)
    hf = tmp_path / "hf"
    common = ["--steps", "8", "--save-freq", "3"]
    base = tmp_path / "base.pt"
    p = job(str(tmp_path / "uninterrupted"), hf, 2, *common, "--out", str(base))
    assert p.returncode == 0, p.stdout + p.stderr

    # rank 1 alone gets the notice, in step 5 (step 3's save may still be in flight)
    p = job(url, hf, 2, *common, "--preempt", "--sigterm", "1:5")
    assert p.returncode == 1, p.stdout + p.stderr
    assert lines(p, "EXIT") == ["RANK 0 EXIT 143", "RANK 1 EXIT 143"], p.stdout + p.stderr
    assert lines(p, "PREEMPTED") == ["RANK 0 PREEMPTED 5", "RANK 1 PREEMPTED 5"]
    assert lines(p, "COMMITTED") == sorted(f"RANK {r} COMMITTED {s}"
                                           for r in range(2) for s in (3, 5))
    store = open_store(url)
    assert tracker(store) == 5 and committed(store, 3) and committed(store, 5)
    assert not committed(store, 6)

    resumed = tmp_path / "resumed.pt"
    p = job(url, hf, 2, *common, "--out", str(resumed))
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "RESUMED") == [f"RANK {r} RESUMED checkpoint 5 True" for r in range(2)]
    want, got = torch.load(base), torch.load(resumed)
    assert set(want) == set(got)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert tracker(store) == 8


def test_past_the_grace_period_only_the_save_in_flight_lands(tmp_path: Path) -> None:
    """One process: a notice older than grace_seconds makes the next
    maybe_save finish the save in flight and raise Preempted (exit code 143)
    with no step, the tracker on the last scheduled save; the handlers the
    watch replaced are back after it."""
    import time

    import numpy as np

    from registry.checkpoint.loongsage_save import LoongSageCheckpointer
    from registry.checkpoint.preempt import Preempted

    before = signal.getsignal(signal.SIGTERM)
    store = open_store(str(tmp_path / "store"))
    c = LoongSageCheckpointer(store, "exp", save_freq=2, total_steps=10, save_checkpoint=False,
                              save_hf=True, hf_config={"hidden_size": 3},
                              save_on_preemption=True, grace_seconds=0.05)
    model = {"w": np.ones((2, 3), np.float32)}
    for step in (1, 2, 3):
        c.maybe_save(step, model=model)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    with pytest.raises(Preempted) as e:
        c.maybe_save(4, model=model)
    assert e.value.code == 143 and e.value.step is None and "SIGTERM" in str(e.value)
    assert [r.step for r in c.saved] == [2]
    assert not committed(store, 4) and committed(store, 2)
    assert signal.getsignal(signal.SIGTERM) == before


def test_save_every_seconds_saves_a_step_once_the_interval_passed(tmp_path: Path) -> None:
    """A save-decision policy beside save_freq: a step is saved once
    save_every_seconds passed since the last save landed, not before."""
    import time

    import numpy as np

    from registry.checkpoint.loongsage_save import LoongSageCheckpointer

    store = open_store(str(tmp_path / "store"))
    c = LoongSageCheckpointer(store, "exp", save_freq=1000, total_steps=10_000,
                              save_checkpoint=False, save_hf=True, hf_config={"hidden_size": 3},
                              async_save=False, save_every_seconds=0.5)
    model = {"w": np.ones((2, 3), np.float32)}
    assert not c.maybe_save(1, model=model)
    time.sleep(0.6)
    assert c.maybe_save(2, model=model)
    assert not c.maybe_save(3, model=model)  # the interval restarts at each save
    c.finish()
    assert [r.step for r in c.saved] == [2] and committed(store, 2)


@pytest.mark.slow
def test_save_every_seconds_on_two_ranks_saves_the_same_steps(tmp_path: Path) -> None:
    """The ranks' timers drift apart (rank 1's steps take twice as long before
    its save call), yet every step one rank's timer made due is saved by both
    (they agree at every maybe_save), and the final step too."""
    url = str(tmp_path / "store")
    p = job(url, tmp_path / "hf", 2, "--steps", "8", "--save-freq", "1000",
            "--save-every-seconds", "0.45", "--step-sleep", "0.1")
    assert p.returncode == 0, p.stdout + p.stderr
    saved = {r: sorted(int(line.split()[3]) for line in lines(p, "COMMITTED")
                       if line.startswith(f"RANK {r} ")) for r in range(2)}
    assert saved[0] == saved[1], saved
    assert 8 in saved[0] and 2 <= len(saved[0]) < 8, saved
    assert tracker(open_store(url)) == 8
