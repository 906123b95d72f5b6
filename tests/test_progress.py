"""Progress of long commands (issue 44 item 1): the rate window, the bar on a
terminal (a real child process on a pseudo-terminal), nothing off a terminal,
and the ``--json --progress`` records, whose byte counts add up."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import sys
from pathlib import Path

import pytest

from registry.api import Registry
from registry.cli.progress import _Counts
from registry.obs.progress import RateWindow
from tests.ckpt_util import save
from tests.conftest import REPO, run_cli
from tests.release_util import ledger_row, summary
from tests.support.fakeclock import FakeClock


def test_no_rate_and_no_eta_until_a_rate_is_measured() -> None:
    clock = FakeClock(100.0)
    w = RateWindow(5.0, min_span=0.5, clock=clock)
    assert w.rate() is None and w.eta(0, 1000) is None  # nothing yet
    w.add(400)  # a first chunk at once: says nothing about the speed
    assert w.rate() is None and w.eta(400, 1000) is None
    clock.now += 0.25
    assert w.rate() is None and w.eta(400, 1000) is None
    clock.now += 0.75  # one second since the start: 400 B/s
    assert w.rate() == pytest.approx(400.0)
    assert w.eta(400, 1000) == pytest.approx(1.5)
    assert w.eta(400, None) is None  # no total, no ETA


def test_the_rate_is_measured_over_the_window_only() -> None:
    clock = FakeClock(100.0)
    w = RateWindow(2.0, clock=clock)
    for _ in range(10):  # 10 s at 1000 B/s
        clock.now += 1
        w.add(1000)
    assert w.rate() == pytest.approx(1000.0)
    for _ in range(2):  # then 2 s at 100 B/s: the window forgets the fast part
        clock.now += 1
        w.add(100)
    assert w.rate() == pytest.approx(100.0)
    clock.now += 10  # stalled: nothing in the window, no rate (and no ETA)
    assert w.rate() is None and w.eta(0, 10) is None


def test_the_line_never_shows_an_unknown_total_or_an_unmeasured_eta() -> None:
    c = _Counts()
    assert c.line() == ""  # before the totals are known: nothing, not "0/?"
    c.start("pull", 3, 3_000_000, "files")
    c.advance(1_000_000)
    line = c.line()
    assert line == "3 files  1.0 MB/3.0 MB"  # no rate, no ETA yet
    assert "?" not in line and "ETA" not in line


def _world(w: Path) -> None:
    reg = Registry(str(w / "artifacts"), db=f"sqlite:///{w / 'registry.db'}")
    with reg.checkpoint_manager("r1", keep_ckpts=0) as m:
        save(m, 10)
    reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row("wiki")],
                       eval_summary=summary())
    reg.close()
    (w / "hf").mkdir()
    for name in ("model.safetensors", "config.json"):
        shutil.copy(w / "artifacts/models/tiny/1" / name, w / "hf" / name)
    (w / "ledger.json").write_text(json.dumps([ledger_row("wiki")]))
    (w / "summary.json").write_text(json.dumps(summary()))


def _publish_args(version: str) -> list[str]:
    return ["publish", "hf", "--model-id", "pub", "--version", version, "--ledger",
            "ledger.json", "--evals", "summary.json", "--store", "artifacts"]


def _on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """``registry ARGS`` in a real child process whose stdout and stderr are a
    pseudo-terminal; its exit code and everything it wrote."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "120", "TERM": "xterm"}
    env.pop("REGISTRY_STORE", None)
    pid, fd = pty.fork()
    if pid == 0:  # the child
        try:
            os.chdir(cwd)
            os.execve(sys.executable, [sys.executable, "-m", "registry", *args], env)
        finally:
            os._exit(127)
    out = b""
    while True:
        try:
            block = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not block:
            break
        out += block
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


BYTES = re.compile(r"(\d+(?:\.\d)? k?B)/(\d+(?:\.\d)? k?B)")


def test_publish_and_pull_show_a_bar_with_files_and_bytes_on_a_terminal(
        tmp_path: Path) -> None:
    _world(tmp_path)
    code, out = _on_a_terminal(_publish_args("1"), tmp_path)
    assert code == 0, out
    manifest = json.loads((tmp_path / "artifacts/models/pub/1/MANIFEST.json").read_text())
    total = sum(f["size"] for f in manifest["files"])
    assert "publish pub@1" in out and "files" in out
    done = BYTES.findall(out)
    assert done and done[-1][0] == done[-1][1]  # the last bar: every byte of the total
    all_done = f"{len(manifest['files'])}/{len(manifest['files'])} files"
    # the gates print as they are decided, before the bar's last state and the summary
    assert out.index("PASS model_card") < out.rindex(all_done) < out.index("released pub@1")
    assert f"{total} bytes" in out.splitlines()[-1]

    code, out = _on_a_terminal(["pull", "pub@1", "--to", str(tmp_path / "out"), "--cache",
                                str(tmp_path / "cache"), "--store", "artifacts"], tmp_path)
    assert code == 0, out
    assert "pull pub@1" in out and BYTES.search(out)
    assert "/?" not in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)  # never "0/? bytes"
    assert f"pulled pub@1 to {tmp_path / 'out'}" in out
    assert (tmp_path / "out/model.safetensors").read_bytes() == (
        tmp_path / "hf/model.safetensors").read_bytes()

    code, out = _on_a_terminal(["publish", *_publish_args("2")[1:], "--no-progress"], tmp_path)
    assert code == 0 and "released pub@2" in out
    assert not BYTES.search(out) and "\u2501" not in out  # --no-progress: no bar


def test_no_bar_off_a_terminal(tmp_path: Path) -> None:
    _world(tmp_path)
    r = run_cli(*_publish_args("1"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # nothing on stderr: no bar, no records
    assert r.stdout.splitlines()[0].startswith("PASS model_card")
    assert r.stdout.splitlines()[-1].startswith("released pub@1")
    r = run_cli("pull", "pub@1", "--to", str(tmp_path / "out"), "--cache",
                str(tmp_path / "cache"), "--store", "artifacts", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == ""


def _records(stderr: str) -> list[dict[str, object]]:
    docs = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert all(d["record"] == "progress" for d in docs)
    return docs


def test_json_progress_records_add_up_and_stdout_is_unchanged(tmp_path: Path) -> None:
    _world(tmp_path)
    r = run_cli(*_publish_args("1"), "--json", "--progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # stdout: the one JSON document, as without --progress
    plain = run_cli(*_publish_args("2"), "--json", cwd=tmp_path)
    assert plain.stderr == "" and set(json.loads(plain.stdout)) == set(doc)
    records = _records(r.stderr)
    events = [d["event"] for d in records]
    assert events[0] == "gate" and events[-1] == "finish" and "start" in events
    files = {d["name"]: d["bytes"] for d in records if d["event"] == "file"}
    manifest = json.loads((tmp_path / "artifacts/models/pub/1/MANIFEST.json").read_text())
    assert files == {f["path"]: f["size"] for f in manifest["files"]}
    assert sum(files.values()) == doc["bytes"] == records[-1]["bytes_done"]
    start = next(d for d in records if d["event"] == "start")
    assert start["files"] == doc["files"]
    assert {d["gate"] for d in records if d["event"] == "gate"} == {
        g["gate"] for g in doc["gates"]}

    r = run_cli("pull", "pub@1", "--to", str(tmp_path / "out"), "--cache",
                str(tmp_path / "cache"), "--store", "artifacts", "--json", "--progress",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    records = _records(r.stderr)
    assert records[0]["event"] == "start" and records[0]["bytes"] == doc["bytes"]
    assert records[0]["files"] == doc["files"]
    assert records[-1]["event"] == "finish" and records[-1]["bytes_done"] == doc["transferred"]

    for argv in (["gc", "--store", "artifacts"], ["index", "rebuild", "--store", "artifacts"],
                 ["load", "pub@1", "--check", "--store", "artifacts"]):
        r = run_cli(*argv, "--json", "--progress", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        json.loads(r.stdout)
        records = _records(r.stderr)
        assert records[0]["event"] == "start" and records[-1]["event"] == "finish", argv


def test_failing_gates_are_told_once_as_decided(tmp_path: Path) -> None:
    _world(tmp_path)
    failing = [*_publish_args("1"), "--require", "accuracy>=0.99"]
    r = run_cli(*failing, cwd=tmp_path)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert len(lines) == len(set(lines)) and lines[-1].startswith("FAIL policy:accuracy>=0.99")
    r = run_cli(*failing, "--json", "--progress", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    docs = [json.loads(line) for line in r.stderr.splitlines()]
    gates = [d for d in docs[:-1] if d["event"] == "gate"]
    assert [g["passed"] for g in gates][-1] is False and len(gates) == len(docs) - 1
    assert docs[-1]["error"]["gates"] == [
        {"gate": g["gate"], "passed": g["passed"], "reason": g["reason"]} for g in gates]
    assert not (tmp_path / "artifacts/models/pub/1").exists()
