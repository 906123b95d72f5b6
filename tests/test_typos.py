"""A typo says the right thing (issue 44 item 2): an unknown model is not an
unknown version, nor an unknown alias, nor a version whose publish never
finished; close matches are offered and what exists is listed; no internal
word (MANIFEST, committed) reaches the user. Through the CLI, with exit codes,
on local disk and on S3 (moto)."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.refs.aliases import move_alias
from registry.errors import NotCommittedError
from registry.load import open_weights
from registry.pull import pull
from registry.store import join, open_store
from registry.rules.suggest import listed, looks_like_version
from tests.ckpt_util import save
from tests.conftest import run_cli_batch
from tests.test_load import publish


def _world(url: str, tmp_path: Path) -> str:
    """tiny@1.0, tiny@1.1, alias prod -> 1.0, an incomplete tiny@1.2 (a file,
    no manifest), run r1 with committed step 10 and an incomplete step 20."""
    from registry.checkpoint import CheckpointManager

    store = open_store(url)
    publish(store, tmp_path, "1.0")
    publish(store, tmp_path, "1.1")
    move_alias(store, "tiny", "prod", "1.0")
    store.write_bytes(join("models/tiny/1.2", "config.json"), b"{}")
    with CheckpointManager(store, "r1", keep_ckpts=0) as m:
        save(m, 10)
    store.write_bytes("runs/r1/ckpt/step-000020/model.safetensors", b"half")
    return url


@pytest.fixture
def store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", "4096")
    return _world(str(tmp_path / "store"), tmp_path)


def test_listing_and_version_like_names() -> None:
    assert listed(["10", "2", "1"], "versions") == "versions: 1, 2, 10"
    assert listed([], "aliases") == "no aliases"
    many = listed([str(i) for i in range(1, 41)], "versions", most=3)
    assert many == "versions: ..., 38, 39, 40 (40 in all)"
    assert all(map(looks_like_version, ["7", "1.2", "v3", "2025-01-01"]))
    assert not any(map(looks_like_version, ["prod", "staging", "vnext"]))


def test_api_messages(store_url: str, tmp_path: Path) -> None:
    store = open_store(store_url)
    with pytest.raises(NotCommittedError, match=r"no model named 'tinny' \(did you mean 'tiny'\?\)"):
        pull(store, "tinny", "1.0", to=tmp_path / "t", cache=tmp_path / "c")
    with pytest.raises(NotCommittedError, match=r"model 'tiny' has no version '1\.3' \(did you "
                                                r"mean '1\.[01]' or '1\.[01]'\?\) \(versions: "
                                                r"1\.0, 1\.1\)$"):
        open_weights("tiny@1.3", store=store)
    with pytest.raises(NotCommittedError, match=r"no model named 'zzz'$"):
        open_weights("zzz@1", store=store)  # nothing close: no suggestion
    with pytest.raises(NotCommittedError, match=r"version '1\.2' of model 'tiny' is incomplete"):
        pull(store, "tiny", "1.2", to=tmp_path / "t", cache=tmp_path / "c")


#: (argv, words stderr must hold); every one exits 3 with one line, no internal word
CASES: list[tuple[list[str], list[str]]] = [
    # unknown model, with a close match and without
    (["pull", "tinny@1.0", "--to", "{t}/a"], ["no model named 'tinny' (did you mean 'tiny'?)"]),
    (["alias", "set", "tinny", "prod", "1.0"], ["no model named 'tinny' (did you mean 'tiny'?)"]),
    (["alias", "ls", "tinny"], ["no model named 'tinny' (did you mean 'tiny'?)"]),
    (["show", "zzz@1"], ["no model named 'zzz'"]),
    # unknown version: the versions listed, the close ones offered
    (["alias", "set", "tiny", "prod", "7"], ["model 'tiny' has no version '7' (versions: 1.0, 1.1)"]),
    (["load", "tiny@1.3", "--check"], ["model 'tiny' has no version '1.3' (did you mean",
                                       "(versions: 1.0, 1.1)"]),
    (["yank", "tiny@9", "--reason", "x"], ["model 'tiny' has no version '9'"]),
    (["release", "create", "--run", "r1", "--step", "7", "--model-id", "tiny", "--version",
      "2.0", "--ledger", "{t}/ledger.json", "--evals", "{t}/summary.json"],
     ["run 'r1' has no checkpoint step 7 (steps: 10)"]),
    # unknown alias: the aliases listed, the close ones offered
    (["pull", "tiny@prdo", "--to", "{t}/b"], ["model 'tiny' has no version or alias named "
                                              "'prdo' (did you mean 'prod'?)", "aliases: prod"]),
    (["alias", "rm", "tiny", "prdo"], ["model 'tiny' has no alias 'prdo' (did you mean 'prod'?) "
                                       "(aliases: prod)"]),
    (["alias", "log", "tiny", "prdo"], ["model 'tiny' has no alias 'prdo' (did you mean"]),
    # a version (or step) whose write never finished: "incomplete", in the user's words
    (["pull", "tiny@1.2", "--to", "{t}/c"], ["version '1.2' of model 'tiny' is incomplete"]),
    (["show", "tiny@1.2"], ["version '1.2' of model 'tiny' is incomplete"]),
    (["alias", "set", "tiny", "prod", "1.2"], ["version '1.2' of model 'tiny' is incomplete"]),
    (["yank", "tiny@1.2", "--reason", "x"], ["version '1.2' of model 'tiny' is incomplete"]),
    (["release", "create", "--run", "r1", "--step", "20", "--model-id", "tiny", "--version",
      "2.0", "--ledger", "{t}/ledger.json", "--evals", "{t}/summary.json"],
     ["checkpoint step 20 of run 'r1' is incomplete"]),
]


def _check(url: str, tmp_path: Path) -> None:
    import json

    from tests.release_util import ledger_row, summary

    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "summary.json").write_text(json.dumps(summary()))
    cmds = [[a.replace("{t}", str(tmp_path)) for a in argv] + ["--store", url]
            for argv, _ in CASES]
    cmds += [[*c, "--json"] for c in cmds]
    out = run_cli_batch(cmds)
    for (argv, words), text, doc in zip(CASES, out[:len(CASES)], out[len(CASES):], strict=True):
        assert text.returncode == 3, (argv, text.stderr)
        assert text.stderr.count("\n") == 1 and text.stdout == "", (argv, text.stderr)
        for w in words:
            assert w in text.stderr, (argv, w, text.stderr)
        for internal in ("MANIFEST", "committed", "commit marker", "Traceback"):
            assert internal not in text.stderr, (argv, text.stderr)
        error = json.loads(doc.stderr)["error"]  # one document on stderr
        assert doc.returncode == 3 and error["exit_code"] == 3, (argv, doc.stderr)
        assert words[0] in error["message"]


def test_cli_messages_on_local_disk(store_url: str, tmp_path: Path) -> None:
    _check(store_url, tmp_path)


def test_cli_messages_on_s3(s3_bucket: str, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", "4096")
    _check(_world(f"s3://{s3_bucket}/root", tmp_path), tmp_path)
