"""A serving host's real Hugging Face client, run as its own process by tests/hub_util.py.

``python -m tests.support.hub_child KIND REPO REVISION [FILENAME]`` with
``HF_ENDPOINT`` set (never the internet: the tests point it at 127.0.0.1).
Prints one JSON line: ``{"ok": true, "path", "files": {relpath: sha256}}`` or
``{"ok": false, "error": <exception class>, "message"}``.

KIND: ``snapshot`` (snapshot_download), ``file`` (hf_hub_download),
``automodel`` (transformers.AutoModel.from_pretrained: the state dict's
sha256 per tensor), ``st`` (sentence_transformers: an embedding).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any


def _files(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[p.relative_to(root).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run(kind: str, repo: str, revision: str, filename: str | None) -> dict[str, Any]:
    if kind == "snapshot":
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(repo, revision=revision,
                                      endpoint=os.environ["HF_ENDPOINT"]))
        return {"path": str(path), "files": _files(path)}
    if kind == "file":
        from huggingface_hub import hf_hub_download

        p = Path(hf_hub_download(repo, filename or "config.json", revision=revision))
        return {"path": str(p), "files": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()}}
    if kind == "automodel":
        import transformers

        model = transformers.AutoModel.from_pretrained(repo, revision=revision)
        return {"path": "", "files": {k: hashlib.sha256(v.detach().contiguous().numpy()
                                                         .tobytes()).hexdigest()
                                      for k, v in model.state_dict().items()}}
    if kind == "st":
        import sentence_transformers

        model = sentence_transformers.SentenceTransformer(repo, revision=revision,
                                                          device="cpu")
        emb = model.encode(["A serving host loads exactly what was released."])
        return {"path": "", "files": {}, "embedding": [float(x) for x in emb[0]]}
    raise SystemExit(f"unknown kind {kind!r}")


def main() -> None:
    kind, repo, revision = sys.argv[1:4]
    filename = sys.argv[4] if len(sys.argv) > 4 else None
    try:
        out = {"ok": True, **run(kind, repo, revision, filename)}
    except Exception as e:  # noqa: BLE001 - reported to the test
        out = {"ok": False, "error": type(e).__name__, "message": str(e)[:2000]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
