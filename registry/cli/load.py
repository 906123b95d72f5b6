"""``registry load``: stream a release's tensors into memory, every byte verified, nothing written."""

from __future__ import annotations

import importlib.util
from typing import Annotated, Any

import typer

from registry.cli.app import JsonOpt, StoreOpt, app, print_json
from registry.cli.errors import at_least, error_boundary
from registry.cli.output import echo
from registry.cli.progress import ProgressOpt, reporter
from registry.cli.trustopts import TrustedCaOpt, TrustedCasOpt, TrustedKeysOpt, host_trust
from registry.cli.trustopts import trusted_key_option
from registry.errors import GateFailedError
from registry.rules.words import count


@app.command()
def load(
    ref: Annotated[str, typer.Argument(help="MODEL_ID@VERSION or MODEL_ID@ALIAS "
                                            "(RUN_ID@STEP with --checkpoint).")],
    device: Annotated[str, typer.Option("--device", help="cpu or cuda:N (torch).")] = "cpu",
    check: Annotated[bool, typer.Option(
        "--check", help="Verify only: read and check every piece into numpy buffers that "
                        "are dropped as they verify (no torch needed).")] = False,
    checkpoint: Annotated[bool, typer.Option(
        "--checkpoint", help="The ref names a checkpoint step (RUN_ID@STEP, RUN_ID@latest).")
    ] = False,
    list_tensors: Annotated[bool, typer.Option(
        "--list", help="Print each tensor (name, dtype, shape) as it verifies.")] = False,
    workers: Annotated[int | None, typer.Option(
        "--workers", help="Pieces read at once [default: 8 local, 16 object store].")] = None,
    window_mib: Annotated[int, typer.Option(
        "--window-mib", metavar="MIB", help="MiB of pieces in flight at once.")] = 1024,
    cache: Annotated[str | None, typer.Option(
        "--cache", envvar="REGISTRY_CACHE", metavar="PATH",
        help="Pull cache to read verified blobs from when it holds them.")] = None,
    offline: Annotated[bool, typer.Option(
        "--offline", help="Resolve and read from the pull cache only (no store).")] = False,
    require_passing: Annotated[bool, typer.Option(
        "--require-passing", help="Refuse (exit 1, nothing read) a release that fails its "
                                  "gates now.")] = False,
    allow_yanked: Annotated[bool, typer.Option(
        "--allow-yanked", help="Load a yanked release anyway.")] = False,
    trusted_key: Annotated[list[str] | None, trusted_key_option(
        "Public key (PEM) this host trusts (repeatable): the release must be signed by one "
        "of them; checked before the first byte of weights is read.")] = None,
    trusted_keys: TrustedKeysOpt = None, trusted_ca: TrustedCaOpt = None,
    trusted_cas: TrustedCasOpt = None,
    mirror: Annotated[str | None, typer.Option(
        "--from", envvar="REGISTRY_MIRROR", metavar="URL",
        help="Read through a `registry serve` mirror (http://HOST:PORT), same checks.")
    ] = None,
    hub_namespace: Annotated[str, typer.Option(
        "--hub-namespace", metavar="NAME", help="With --from: the mirror's namespace.")
    ] = "registry",
    config_to: Annotated[str | None, typer.Option(
        "--config-to", metavar="DIR",
        help="Also write the release's files other than the weights (config, tokenizer, "
             "card), each verified, into DIR: the folder an engine such as vLLM reads its "
             "config from while the weights stream (--load-format registry).")] = None,
    store: StoreOpt = None, as_json: JsonOpt = False, progress: ProgressOpt = None,
) -> None:
    """Stream every tensor of a release into memory, verified piece by piece; write nothing.

    Prints the tensors, bytes, GB/s and the time to the last tensor. Refusals
    (yanked, unsigned under trusted keys, failing gates with
    --require-passing, a bad piece) exit as `registry pull` does."""
    with error_boundary(as_json), reporter(progress, as_json, f"load {ref}") as shown:
        from registry.load import open_weights

        if workers is not None:
            at_least("--workers", workers, 1)
        at_least("--window-mib", window_mib, 1)
        trust = host_trust(trusted_key, trusted_keys, trusted_ca, trusted_cas)
        source: Any = store
        target = ref
        failed: list[Any] = []
        if mirror and not checkpoint and not offline:
            from registry.refs.aliases import parse_ref
            from registry.cli.pull import _source

            model_id, name = parse_ref(ref)
            if name is not None:
                source, version, failed = _source(mirror, hub_namespace, store, model_id,
                                                  name, trust)
                target = f"{model_id}@{version}" if version else model_id
                if failed and require_passing:
                    raise GateFailedError(f"{ref}: not loaded (--require-passing)", failed)
        framework = "np" if check or importlib.util.find_spec("torch") is None else "pt"
        with open_weights(target, store=source, trust=trust, device=device,
                          framework=framework, checkpoint=checkpoint,
                          allow_yanked=allow_yanked, offline=offline,
                          require_passing=require_passing and not mirror, cache=cache,
                          workers=workers, window_bytes=window_mib * 1024 * 1024) as w:
            if config_to is not None:
                from pathlib import Path

                from registry.load.layout import write_small_files

                Path(config_to).mkdir(parents=True, exist_ok=True)
                write_small_files(w, Path(config_to))
            shown.start("load", files=len(w), unit="tensors",
                        total=sum(w.nbytes(n) for n in w.keys()))
            for name, tensor in w:
                if list_tensors and not as_json:
                    echo(f"{name}\t{w.get_slice(name).get_dtype()}\t{list(tensor.shape)}")
                del tensor
                shown.advance(w.nbytes(name))
                shown.file_done(name, w.nbytes(name))
            shown.finish()
            stats = w.stats.to_dict()
            version = getattr(w, "version", None)
    doc = {"ref": ref, "version": version, "checkpoint": checkpoint, "framework": framework,
           "device": device, **stats}
    if as_json:
        print_json(doc)
        return
    echo(f"loaded {ref}" + (f" ({version})" if version and version not in ref else "")
         + f": {count(stats['tensors'], 'tensor')}, {stats['bytes']} bytes verified, "
           f"{stats['gbps']:.2f} GB/s, {stats['seconds']:.2f} s to the last tensor")
