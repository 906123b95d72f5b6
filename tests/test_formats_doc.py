"""docs/formats.md is checked against what the code writes (issue 47 item 3).

A store is filled through the API the way users fill one (releases, alias
moves, tags, a yank, a revocation, a policy, a deletion, checkpoints); then
every path in it must be covered by a line of the page's layout block, and
every record example of the page must have the shape of the real file at
that path: the same JSON keys (or, for a text record, the same form).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.api import Registry
from registry.checkpoint import CheckpointManager
from registry.protocol.claim import Claim
from registry.store import open_store
from tests.ckpt_util import save
from tests.release_util import ledger_row, summary
from tests.test_pull import release_files

PAGE = Path(__file__).resolve().parent.parent / "docs" / "formats.md"


def _layout() -> list[re.Pattern[str]]:
    text = PAGE.read_text()
    block = text.split("## Store layout", 1)[1].split("```", 2)[1]
    out = []
    for line in block.splitlines()[1:]:
        if not line.strip():
            continue
        pattern = line.split()[0]
        rx = re.escape(pattern).replace(r"\*", "[^/]*")
        rx = re.sub(r"<[^>]*>", "[^/]+", rx.replace(r"\<", "<").replace(r"\>", ">"))
        out.append(re.compile(rx + (".*" if pattern.endswith("/") else "")))
    return out


def _records() -> list[tuple[str, str, str]]:
    """(path pattern, fence info, example) of each record of the page."""
    text = PAGE.read_text().split("### Records", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"`([^`]+)` \([^)]*\)?[^`]*?:\s*\n\n```(\w+)\n(.*?)\n```", text, re.S)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("formats")
    src = root / "src"
    for rel, data in release_files().items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    url = str(root / "store")
    with Registry(url, f"sqlite:///{root / 'i.db'}") as reg:
        for v in ("1", "2", "3"):
            reg.publish(src, "tiny", v, ledger=[ledger_row()], eval_summary=summary())
        reg.set_alias("tiny", "prod", "1")
        reg.set_alias("tiny", "prod", "2")
        reg.set_tags("tiny", "2", {"team": "nlp"})
        reg.yank("tiny", "3", "bad eval")
        reg.set_policy("tiny", ["accuracy>=0.5"])
        reg.delete_release("tiny", "1", "gone")
        reg.revoke("wiki", "withdrawn")
    from registry.trust.keys import generate
    from registry.trust.snapshot import sign_snapshot

    key, _, _ = generate(root / "snapshot.pem", public_path=root / "snapshot.pub")
    sign_snapshot(open_store(url), "tiny", key)  # issue 50: the signed snapshot, timestamp
    mgr = CheckpointManager(url, "r1", keep_ckpts=2)
    save(mgr, 1)
    save(mgr, 2)
    claim = Claim(open_store(url), "models/tiny/4.claim")  # a writer at work
    claim.take()
    yield root / "store"
    claim.release()


def _paths(store: Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), store).replace(os.sep, "/")
                  for d, _, files in os.walk(store) for f in files)


def test_every_path_the_code_writes_is_in_the_layout(store: Path) -> None:
    patterns = _layout()
    uncovered = [p for p in _paths(store) if not any(rx.fullmatch(p) for rx in patterns)]
    assert uncovered == [], f"docs/formats.md's layout lacks {uncovered[:5]}"


def test_every_record_example_has_the_shape_of_the_real_file(store: Path) -> None:
    records = _records()
    assert len(records) >= 8, records
    paths = _paths(store)
    for pattern, info, example in records:
        rx = re.compile(re.sub(r"<[^>]*>", "[^/]+", re.escape(pattern)
                               .replace(r"\<", "<").replace(r"\>", ">").replace(r"\*", "[^/]*")))
        real = [p for p in paths if rx.fullmatch(p) or rx.fullmatch(p.rsplit("/", 1)[-1])]
        assert real, f"no file at {pattern} in the store the code wrote"
        data = (store / real[0]).read_text()
        if info == "json":
            doc, shown = json.loads(data), json.loads(example)
            assert isinstance(shown, dict) and isinstance(doc, dict), pattern
            assert set(shown) == set(doc), (pattern, sorted(set(shown) ^ set(doc)))
        else:
            form = re.sub(r"\d+", r"\\d+", re.escape(example.strip()))
            assert re.fullmatch(form, data.strip()), (pattern, data)
