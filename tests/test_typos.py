"""A typo says the right thing (issue 44 item 2): an unknown model is not an
unknown version, and close matches are offered."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.errors import NotCommittedError
from registry.load import open_weights
from registry.pull import pull
from registry.store import open_store
from tests.conftest import run_cli_batch
from tests.test_load import publish


@pytest.fixture
def store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", "4096")
    url = str(tmp_path / "store")
    publish(open_store(url), tmp_path, "1.0")
    publish(open_store(url), tmp_path, "1.1")
    return url


def test_api_messages(store_url: str, tmp_path: Path) -> None:
    store = open_store(store_url)
    with pytest.raises(NotCommittedError, match=r"no model named 'tinny' \(did you mean 'tiny'\?\)"):
        pull(store, "tinny", "1.0", to=tmp_path / "t", cache=tmp_path / "c")
    with pytest.raises(NotCommittedError, match=r"no version or alias named '1\.2' \(did you "
                                                r"mean '1\.0' or '1\.1'\?\)|no version or alias "
                                                r"named '1\.2' \(did you mean '1\.1' or '1\.0'"):
        open_weights("tiny@1.2", store=store)
    with pytest.raises(NotCommittedError, match=r"no model named 'zzz'$"):
        open_weights("zzz@1", store=store)  # nothing close: no suggestion


def test_cli_messages(store_url: str, tmp_path: Path) -> None:
    cmds = [["pull", "tinny@1.0", "--store", store_url, "--to", str(tmp_path / "t")],
            ["load", "tiny@1.3", "--store", store_url, "--check"],
            ["alias", "set", "tinny", "prod", "1.0", "--store", store_url],
            ["alias", "set", "tiny", "prod", "7", "--store", store_url]]
    out = run_cli_batch(cmds)
    codes = [r.returncode for r in out]
    assert codes == [3, 3, 3, 3], [(r.returncode, r.stderr) for r in out]
    assert "no model named 'tinny' (did you mean 'tiny'?)" in out[0].stderr
    assert "no version or alias named '1.3'" in out[1].stderr and "did you mean" in out[1].stderr
    assert "no model named 'tinny'" in out[2].stderr
    assert "no version or alias named '7'" in out[3].stderr
    for r in out:
        assert "MANIFEST" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
