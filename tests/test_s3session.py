"""S3 stores share botocore's parsed models (registry.store.s3session) and keep
everything else their own."""

from __future__ import annotations

from aiobotocore.session import AioSession

from registry.store import open_store
from registry.store.s3session import shared_loader


def test_stores_share_the_parsed_models_not_the_session(s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/root"
    a, b = open_store(url), open_store(url)
    try:
        a.write_bytes("k", b"one")
        assert b.read_bytes("k") == b"one"  # both answer, each on its own client
        sa, sb = a.fs.session, b.fs.session
        assert sa is not sb and a.fs._session_is_owned
        loader = sa.get_component("data_loader")
        assert loader is sb.get_component("data_loader") is shared_loader(None)
        # the loader's cache holds the S3 model once parsed, for every session
        assert loader.load_service_model("s3", "service-2") is \
            loader.load_service_model("s3", "service-2")
    finally:
        a.close()
        b.close()


def test_a_session_given_in_the_storage_options_is_used_as_given(s3_bucket: str) -> None:
    mine = AioSession()
    store = open_store(f"s3://{s3_bucket}/root", session=mine)
    try:
        store.write_bytes("k", b"x")
        assert store.fs.session is mine
    finally:
        store.close()


def test_a_data_path_has_a_loader_of_its_own(tmp_path) -> None:
    assert shared_loader(str(tmp_path)) is shared_loader(str(tmp_path))
    assert shared_loader(str(tmp_path)) is not shared_loader(None)
    assert str(tmp_path) in shared_loader(str(tmp_path)).search_paths
