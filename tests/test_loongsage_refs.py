"""Issue 18 item 5: the reference model (``ref_dist_ckpt_path`` /
``ref_hf_model_path``, exactly one) and OPD teachers (``dist_ckpt_path`` with a
required ``hf_path``): each a concrete directory verified against its step's
manifest before use; API and ``registry ckpt refs``, on local disk and S3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.checkpoint.loongsage_refs import (
    check_dist_ckpt_path,
    check_hf_path,
    check_reference,
    check_teachers,
    check_weight_sources,
)
from registry.errors import (
    CheckpointError,
    DocumentError,
    IntegrityError,
    NotCommittedError,
    UsageError,
)
from registry.protocol.manifest import MANIFEST
from registry.store import Store, open_store
from registry.protocol.verify import read_manifest
from tests.conftest import run_cli
from tests.test_loongsage import HF_CONFIG, ROOT, TOKENIZER, ckpt, hf_dir, run

DIST = f"{ROOT}/train_step_4/dist_ckpt"
HF = f"{ROOT}/train_step_4/hf_model"


@pytest.fixture
def tree(durable_store_url: str) -> Store:
    store = open_store(durable_store_url)
    run(ckpt(store, save_hf=True, hf_config=HF_CONFIG, tokenizer=TOKENIZER), range(1, 5))
    return store


def flip(store: Store, key: str) -> None:
    data = store.read_bytes(key)
    store.write_bytes(key, data[:-1] + bytes([data[-1] ^ 1]))


def test_a_dist_ckpt_dir_is_verified_against_its_step(tree: Store) -> None:
    digest = read_manifest(tree, f"{ROOT}/train_step_4").digest
    by_url = check_dist_ckpt_path(tree.url_of(DIST))
    by_key = check_dist_ckpt_path(DIST, store=tree)
    assert (by_url.kind, by_url.step, by_url.manifest_sha256) == ("dist_ckpt", 4, digest)
    assert by_key == by_url and by_url.path == tree.url_of(DIST)


@pytest.mark.parametrize(("path", "needle"), [
    (ROOT, "it is a checkpoint_path: it holds the tracker file"),
    (f"{ROOT}/train_step_4", "must name one concrete train_step_<N>/dist_ckpt"),
    (f"{ROOT}/train_step_4/hf_model", "must name one concrete train_step_<N>/dist_ckpt"),
])
def test_not_a_concrete_dist_ckpt_dir(tree: Store, path: str, needle: str) -> None:
    with pytest.raises(UsageError) as e:
        check_dist_ckpt_path(path, store=tree)
    assert str(e.value).startswith("ref_dist_ckpt_path ") and needle in str(e.value)


@pytest.mark.parametrize("damage", ["flip", "unlisted", "uncommitted", "no-dist"])
def test_a_dist_ckpt_that_does_not_verify_is_not_used(tree: Store, damage: str) -> None:
    expected: type[Exception]
    if damage == "flip":
        flip(tree, f"{DIST}/__0_0.distcp")
        expected, needle = IntegrityError, "dist_ckpt/__0_0.distcp: sha256"
    elif damage == "unlisted":
        tree.write_bytes(f"{DIST}/extra.distcp", b"written after the commit")
        expected, needle = IntegrityError, "extra.distcp: not listed in the step's MANIFEST"
    elif damage == "uncommitted":
        tree.delete(f"{ROOT}/train_step_4/{MANIFEST}")
        expected, needle = NotCommittedError, "step is not committed"
    else:  # a step saved with save_checkpoint off has no dist_ckpt
        run(ckpt(tree, save_freq=6, total_steps=6, save_checkpoint=False, save_hf=True,
                 hf_config=HF_CONFIG, tokenizer=TOKENIZER), range(6, 7))
        with pytest.raises(CheckpointError, match="lists no dist_ckpt/ file"):
            check_dist_ckpt_path(f"{ROOT}/train_step_6/dist_ckpt", store=tree)
        return
    with pytest.raises(expected, match=needle):
        check_dist_ckpt_path(DIST, store=tree)


def test_hf_paths(tree: Store, tmp_path: Path) -> None:
    plain = check_hf_path(hf_dir(tmp_path))
    assert (plain.kind, plain.step, plain.manifest_sha256) == ("hf", None, None)
    assert plain.hf_config == {"hidden_size": 64}
    in_step = check_hf_path(HF, store=tree)
    assert in_step.step == 4
    assert in_step.manifest_sha256 == read_manifest(tree, f"{ROOT}/train_step_4").digest
    (tmp_path / "x").mkdir()
    with pytest.raises(DocumentError, match="config.json: missing"):
        check_hf_path(hf_dir(tmp_path / "x", config=False))
    flip(tree, f"{HF}/model.safetensors")
    with pytest.raises(IntegrityError, match="hf_model/model.safetensors: sha256"):
        check_hf_path(HF, store=tree)


def test_reference_is_exactly_one_of_the_two(tree: Store, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="pick exactly one .*given: ref_dist_ckpt_path, "
                                         "ref_hf_model_path"):
        check_reference(ref_dist_ckpt_path=DIST, ref_hf_model_path=hf_dir(tmp_path), store=tree)
    with pytest.raises(UsageError, match="given: neither"):
        check_reference()
    assert check_reference(ref_dist_ckpt_path=DIST, store=tree).kind == "dist_ckpt"
    assert check_reference(ref_hf_model_path=str(hf_dir(tmp_path))).kind == "hf"


def test_teachers_need_hf_path(tree: Store, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"opd.teachers\[1\].hf_path: required alongside "
                                         "dist_ckpt_path"):
        check_teachers([{"hf_path": str(hf_dir(tmp_path))}, {"dist_ckpt_path": DIST}],
                       store=tree)
    (t,) = check_teachers([{"hf_path": HF, "dist_ckpt_path": DIST, "weight": 0.5}], store=tree)
    assert t.dist_ckpt is not None and (t.hf.step, t.dist_ckpt.step) == (4, 4)
    flip(tree, f"{DIST}/.metadata")
    with pytest.raises(IntegrityError, match=r"dist_ckpt/\.metadata"):
        check_teachers([{"hf_path": HF, "dist_ckpt_path": DIST}], store=tree)


def test_weight_sources_of_a_config(tree: Store, tmp_path: Path) -> None:
    got = check_weight_sources({"ref_dist_ckpt_path": DIST, "ref_hf_model_path": None,
                                "opd": {"teachers": [{"hf_path": str(hf_dir(tmp_path))}]}},
                               store=tree)
    assert got.ref is not None and got.ref.step == 4
    assert len(got.teachers) == 1 and got.teachers[0].dist_ckpt is None
    assert check_weight_sources({}).to_dict() == {"ref": None, "teachers": []}
    with pytest.raises(UsageError, match="opd.teachers: must be a list"):
        check_weight_sources({"opd": {"teachers": "t1"}})


def test_cli_refs(tree: Store, tmp_path: Path, durable_store_url: str) -> None:
    hf = str(hf_dir(tmp_path))
    r = run_cli("ckpt", "refs", "--ref-dist-ckpt-path", DIST, "--store", durable_store_url,
                "--teacher", f"hf_path={HF},dist_ckpt_path={DIST}", "--teacher",
                f"hf_path={hf}", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    digest = read_manifest(tree, f"{ROOT}/train_step_4").digest
    assert doc["ref"] == {"kind": "dist_ckpt", "path": tree.url_of(DIST), "step": 4,
                          "manifest_sha256": digest}
    assert doc["teachers"][0]["dist_ckpt_path"]["manifest_sha256"] == digest
    assert doc["teachers"][1]["hf_path"]["step"] is None
    r = run_cli("ckpt", "refs", "--ref-hf-model-path", tree.url_of(HF))
    assert r.returncode == 0 and "step 4" in r.stdout, r.stderr
    cases = [
        (["--ref-dist-ckpt-path", DIST, "--ref-hf-model-path", hf], 2, "pick exactly one"),
        (["--teacher", f"dist_ckpt_path={DIST}"], 2, "hf_path is required"),
        (["--teacher", "nonsense"], 2, "expected hf_path=PATH"),
        (["--teacher", f"hf_path={HF},hf_path={hf}"], 2, "key 'hf_path' given twice"),
        (["--teacher", f"hf_path={hf},dist_ckpt_path={DIST},dist_ckpt_path={DIST}"], 2,
         "key 'dist_ckpt_path' given twice"),
        (["--teacher", f"hf_path={hf},weight=0.5"], 2, "unknown key 'weight'"),
        ([], 2, "name --ref-dist-ckpt-path"),
        (["--ref-dist-ckpt-path", ROOT], 2, "holds the tracker file"),
    ]
    for args, code, needle in cases:
        r = run_cli("ckpt", "refs", *args, "--store", durable_store_url)
        assert r.returncode == code and needle in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    flip(tree, f"{DIST}/__0_0.distcp")
    r = run_cli("ckpt", "refs", "--ref-dist-ckpt-path", DIST, "--store", durable_store_url,
                "--json")
    assert r.returncode == 1, r.stderr
    err = json.loads(r.stderr)["error"]
    assert err["class"] == "IntegrityError" and "__0_0.distcp: sha256" in err["message"]
