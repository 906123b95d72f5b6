"""Every code block of README.md and docs/*.md that is meant to run, runs.

A ```python, ```bash or ```sh block is an example a reader will paste: the test
runs the blocks of each page in order, in one fresh folder of their own (so a
page's blocks share one store, ``./artifacts``, and one index, ``./registry.db``,
the defaults of every command), with ``registry`` and ``python`` this checkout's.
A block that shows S3 runs against the test suite's moto server, its buckets
created empty first. A block not meant to run (an install, a server that runs
until stopped, docker) says so in an HTML comment on the line before it,
``<!-- not-run: why -->``; those are listed as skipped tests with their reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

LANGS = ("python", "bash", "sh")
NOT_RUN = re.compile(r"<!-- not-run: (.+?) -->\s*$")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    code: str
    not_run: str | None  # the reason, for a block not meant to run


def blocks(doc: str) -> list[Block]:
    text = (REPO / doc).read_text()
    out = []
    for m in FENCE.finditer(text):
        if m.group(1) not in LANGS:
            continue
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = NOT_RUN.search(before)
        out.append(Block(doc, text[:m.start()].count("\n") + 1, m.group(1), m.group(2),
                         reason.group(1) if reason else None))
    return out


ALL = [b for doc in DOCS for b in blocks(doc)]
RUN_DOCS = sorted({b.doc for b in ALL if b.not_run is None})


def _buckets(code: str) -> set[str]:
    return set(re.findall(r"s3://([a-z0-9][a-z0-9.-]+[a-z0-9])", code))


def _fresh_buckets(names: set[str]) -> None:
    import boto3

    s3 = boto3.resource("s3")
    for name in names:
        bucket = s3.Bucket(name)
        if bucket.creation_date is not None:
            bucket.objects.all().delete()
        else:
            bucket.create()


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> None:
    if block.lang == "python":
        argv = [sys.executable, "-c", block.code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (f"{block.doc}, line {block.line}: the {block.lang} block "
                               f"exits {p.returncode}\n{p.stdout}\n{p.stderr}")


@pytest.mark.parametrize("doc", RUN_DOCS)
def test_the_examples_of_a_page_run(doc: str, tmp_path: Path,
                                    request: pytest.FixtureRequest) -> None:
    todo = [b for b in blocks(doc) if b.not_run is None]
    buckets = set().union(*(_buckets(b.code) for b in todo))
    if buckets:
        request.getfixturevalue("s3_server")  # AWS_* point at moto for the children
        _fresh_buckets(buckets)
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{bindir}:{os.environ['PATH']}",
           "REGISTRY_CACHE": str(tmp_path / "pull-cache")}
    for var in ("REGISTRY_STORE", "REGISTRY_DB", "REGISTRY_TRUSTED_KEYS",
                "REGISTRY_TRUSTED_CAS", "REGISTRY_PULL_BLOBS"):
        env.pop(var, None)
    work = tmp_path / "work"
    work.mkdir()
    for block in todo:
        run_block(block, work, env)


@pytest.mark.parametrize("block", [b for b in ALL if b.not_run is not None],
                         ids=lambda b: f"{b.doc}:{b.line}")
def test_blocks_not_meant_to_run_say_why(block: Block) -> None:
    assert len(block.not_run or "") > 10, f"{block.doc}:{block.line}: say why it does not run"
    pytest.skip(f"not run: {block.not_run}")


def test_the_readme_tour_is_run() -> None:
    """The front door's tour runs: at least its train, release, query and serve blocks."""
    readme = [b for b in ALL if b.doc == "README.md" and b.not_run is None]
    assert len(readme) >= 4
    text = "\n".join(b.code for b in readme)
    for command in ("tinytrainer", "registry release create", "registry query",
                    "registry pull"):
        assert command in text, command
