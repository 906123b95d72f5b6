"""``registry publish``, ``release create``, ``gate check``, ``alias``, ``policy``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated

import typer

from registry.facade import documents
from registry.host import interrupt
from registry.checkpoint import get_layout
from registry.cli.app import (
    DbOpt,
    JsonOpt,
    RegistryTyper,
    StoreOpt,
    app,
    nothing_stored,
    print_json,
)
from registry.cli.errors import (
    EXIT_FAILED,
    at_least,
    error_boundary,
    fail,
    index_writes,
    report_not_indexed,
)
from registry.errors import GateFailedError, ObjectNotFoundError, RegistryError, UsageError
from registry.gating.gates import GateResult
from registry.trust.certs import Certificate
from registry.cli.output import echo
from registry.cli.progress import ProgressOpt, reporter
from registry.cli.trustopts import TrustedKeysOpt, host_trust, trusted_key_option
from registry.trust.keys import PublicKey
from registry.protocol.layout import MODELS, model_ids, model_root
from registry.release.policy import signed_by, thresholds
from registry.store import Store, open_store
from registry.rules.words import count

ModelIdOpt = Annotated[str, typer.Option("--model-id", help="Model id.")]
VersionOpt = Annotated[str, typer.Option("--version", help="New, immutable version.")]
LedgerOpt = Annotated[str, typer.Option("--ledger", metavar="PATH",
                                        help="ledger.json: rows of every "
                                             "training data source.")]
EvalsOpt = Annotated[str, typer.Option("--evals", metavar="PATH",
                                       help="EvalSuite summary JSON file.")]
HeadOpt = Annotated[list[str] | None, typer.Option("--head", metavar="PATH",
                                                   help="Linear head JSON file "
                                                        "(repeatable).")]
SignKeyOpt = Annotated[str | None, typer.Option(
    "--sign-key", metavar="PATH",
    help="EC private key (PEM, `registry keys generate`): sign the release "
         "(model.sig, OpenSSF model signing).")]
SignCertOpt = Annotated[str | None, typer.Option(
    "--sign-cert", metavar="PATH",
    help="The --sign-key's X.509 certificate (PEM, issued by a CA, e.g. `registry keys "
         "issue`): sign with the certificate (verified on pull with --trusted-ca).")]
CertChainOpt = Annotated[list[str] | None, typer.Option(
    "--cert-chain", metavar="PATH",
    help="CA certificates (PEM) above --sign-cert, carried in model.sig (repeatable).")]
MoveKeyOpt = Annotated[str | None, typer.Option(
    "--sign-key", metavar="PATH",
    help="EC private key (PEM): sign the alias move (required for an alias the "
         "model's policy protects; hosts pulling with trusted keys require it), and the "
         "model's snapshot again when it has one (registry snapshot sign).")]
RequireOpt = Annotated[list[str] | None, typer.Option(
    "--require", metavar="METRIC>=VALUE",
    help="Extra gate threshold METRIC>=VALUE or METRIC<=VALUE (repeatable).")]


if TYPE_CHECKING:
    from registry.api import Registry
    from registry.release import ReleaseResult
    from registry.obs.progress import Progress


def _registry(store: str | None, db: str | None) -> Registry:
    """The Registry facade, imported on use: SQLAlchemy and Alembic load only
    for the commands that touch the index."""
    from registry.api import Registry

    return Registry(store, db)


def _require_model(store: Store, model_id: str) -> None:
    """Raise ObjectNotFoundError unless the store holds something of ``model_id``
    (so a typo is exit 3, not an empty answer)."""
    key = model_root(model_id)
    if nothing_stored(store, key):
        from registry.rules.suggest import unknown_model

        try:
            models = model_ids(store.subdirs(MODELS))
        except (RegistryError, OSError):
            models = []
        raise ObjectNotFoundError(unknown_model(store.url, model_id, models), key=key)


def _print_gates(results: Sequence[GateResult]) -> None:
    for r in results:
        echo(f"{'PASS' if r.passed else 'FAIL'} {r.name}: {r.reason}")


class _GatePrinter:
    """Prints gate results as they are decided (before the upload), then only
    the ones decided later (a carried signature's, at the commit)."""

    def __init__(self) -> None:
        self.printed = 0

    def __call__(self, results: Sequence[GateResult]) -> None:
        _print_gates(results[self.printed:])
        self.printed = len(results)


def _report(result: ReleaseResult, as_json: bool, printed: int = 0) -> None:
    if as_json:
        print_json(result.to_dict())
        interrupt.commits_reported()
        return
    _print_gates(result.gates[printed:])
    m = result.manifest
    echo(f"released {result.model_id}@{result.version} at {result.url}: "
               f"{count(len(m.files), 'file')}, {m.total_size} bytes, manifest sha256 {m.digest}")
    interrupt.commits_reported()  # printed: an interrupt from here on repeats nothing


@contextmanager
def _gate_failures(as_json: bool, printed: _GatePrinter | None = None) -> Iterator[None]:
    """Print every gate (failing ones with their reasons) not printed yet
    before exiting 1; with --json the gates are in the error document."""
    try:
        yield
    except GateFailedError as e:
        if not as_json:
            _print_gates(list(e.results)[printed.printed if printed else 0:])
        fail(f"{e.where}: not released: fails the release gates", EXIT_FAILED,
             as_json=as_json, cls="GateFailedError", path=e.where,
             gates=[r.to_dict() for r in e.results])


@contextmanager
def _releasing(as_json: bool, progress: bool | None,
               label: str) -> Iterator[tuple[_GatePrinter, Progress]]:
    """Where a command that releases runs: its errors and failed gates reported,
    the index written after the store, the bar, and each gate printed as it is
    decided (the printer says how many were)."""
    gates = _GatePrinter()
    with error_boundary(as_json), _gate_failures(as_json, gates), index_writes(), \
            reporter(progress, as_json, label, on_gates=gates) as shown:
        yield gates, shown

MaxShardOpt = Annotated[str | None, typer.Option(
    "--max-shard-size", metavar="SIZE",
    help=("Most bytes of tensor data per released shard, e.g. 5GB (10**9), 500MiB (2**20) "
          "or a byte count (transformers' convention; a larger tensor gets a shard of its "
          "own). Converted weights default to 5GB; without --dtype, giving it re-packs the "
          "weights with their dtypes kept. One shard is released as model.safetensors, "
          "several as model-0000i-of-0000N.safetensors plus model.safetensors.index.json."))]


@app.command()
def publish(
    model_dir: Annotated[str, typer.Argument(help=(
        "Model directory (folder or URL) holding config.json and its weights: "
        "model.safetensors, or model.safetensors.index.json and exactly the shards it "
        "names (see docs/sharded-weights.md)."))],
    model_id: ModelIdOpt, version: VersionOpt, ledger: LedgerOpt, evals: EvalsOpt,
    card: Annotated[str | None, typer.Option("--card", metavar="PATH",
                                             help="Free text (Markdown) of the model "
                                                  "card rendered from the template "
                                                  "(default: the directory's own "
                                                  "MODEL_CARD.md as it is, else a card "
                                                  "rendered without one).")] = None,
    head: HeadOpt = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help=(
        "Convert weights to a release dtype of the seed: f32, bf16 or int4 (default: F32 "
        "and BF16 tensors as they are, other floats (F16, F64, F8) converted to F32, "
        "integer tensors kept; "
        "the card and `registry show` list the stored dtype of every tensor group)."))] = None,
    keep_dtype: Annotated[bool, typer.Option("--keep-dtype", help=(
        "Without --dtype: keep every tensor's dtype as published (F16 included); the "
        "card then warns that the weights are not in a release dtype."))] = False,
    card_verbatim: Annotated[bool, typer.Option("--card-verbatim", help=(
        "Store the --card file as it is, instead of as the free text of the card "
        "rendered from the template."))] = False,
    group_size: Annotated[int, typer.Option("--group-size", help="int4 group size.")] = 128,
    max_shard_size: MaxShardOpt = None,
    require: RequireOpt = None, sign_key: SignKeyOpt = None, sign_cert: SignCertOpt = None,
    cert_chain: CertChainOpt = None,
    forbid_code: Annotated[bool, typer.Option(
        "--forbid-code", help="Refuse (exit 1, nothing written) a directory that carries "
                              "pickle files (*.bin, *.pt, *.pth, *.pkl, *.ckpt, ...) or remote "
                              "code (*.py, auto_map in config.json); the model policy's "
                              "forbid_code does the same.")] = False,
    follow_symlinks: Annotated[bool, typer.Option(
        "--follow-symlinks", help="Read symbolic links that lead out of the model directory "
                                  "too (each is named on stderr, and in --json as "
                                  "followed_symlinks); without it such a link is refused, exit "
                                  "6. Links inside it (a Hugging Face cache snapshot's links "
                                  "into its blobs/) are always read; see "
                                  "docs/confinement.md.")] = False,
    include: Annotated[list[str] | None, typer.Option(
        "--include", metavar="PATH|GLOB",
        help="Carry a set of weights in another format beside the safetensors "
             "(pytorch_model*.bin, tf_model.h5, flax_model.msgpack, *.gguf, *.onnx...): "
             "without it such a file is refused (exit 5), since an engine that prefers its "
             "format would serve it; the card and `registry show` then list every set. "
             "Repeatable.")] = None,
    trusted_key: Annotated[list[str] | None, trusted_key_option(
        "Public key (PEM) this host trusts (repeatable): a MODEL_DIR that is a release's "
        "folder in a store must be signed by one of them.")] = None,
    trusted_keys: TrustedKeysOpt = None,
    store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Release an existing model directory (e.g. a Hugging Face one) as MODEL_ID@VERSION.

    A MODEL_DIR that is a release's folder in a store (STORE/models/M/V: a
    release from a release) is admitted as `registry pull` admits it (deleted,
    yanked, failing its gates, rolled back or, with trusted keys, unsigned:
    refused, nothing written), and only its manifest's files are taken.

    On a terminal a bar shows the files and bytes written; the gate results
    print as they are decided, before the first byte is written."""
    with _releasing(as_json, progress, f"publish {model_id}@{version}") as (gates, shown):
        at_least("--group-size", group_size, 1)
        source_trust = host_trust(trusted_key, trusted_keys)
        reg = _registry(store, db)
        result = reg.publish(
            model_dir, model_id, version, ledger=ledger, eval_summary=evals,
            heads=head or [], card=card, dtype=dtype, group_size=group_size,
            require=require or [], sign_key=sign_key, sign_cert=sign_cert,
            cert_chain=cert_chain or [], max_shard_size=max_shard_size,
            forbid_code=forbid_code, follow_symlinks=follow_symlinks, include=include or [],
            keep_dtype=keep_dtype, card_verbatim=card_verbatim, progress=shown,
            source_trust=source_trust)
    for link, target in result.followed:
        echo(f"warning: followed {link} -> {target}, outside the model directory "
             "(--follow-symlinks)", err=True)
    _report(result, as_json, gates.printed)
    report_not_indexed(reg.index_errors, store=store, db=db, as_json=as_json)


release_app = RegistryTyper(help="Releases from checkpoints.", no_args_is_help=True)
app.add_typer(release_app, name="release")


@release_app.command("create")
def release_create(
    step: Annotated[int, typer.Option("--step", help="Checkpoint step.")],
    model_id: ModelIdOpt, version: VersionOpt, ledger: LedgerOpt, evals: EvalsOpt,
    dtype: Annotated[str, typer.Option("--dtype", help="f32, bf16 or int4.")] = "f32",
    group_size: Annotated[int, typer.Option("--group-size", help="int4 group size.")] = 128,
    max_shard_size: MaxShardOpt = None,
    head: HeadOpt = None,
    card_field: Annotated[list[str] | None, typer.Option(
        "--card-field", metavar="KEY=VALUE",
        help="KEY=VALUE for the model card (description, intended_use, "
             "limitations).")] = None,
    run: Annotated[str | None, typer.Option(
        "--run", help="Run id of the checkpoint (required for tinyllm; for loongsage, "
                      "default: the run_id the step's MANIFEST.json records).")] = None,
    layout: Annotated[str, typer.Option("--layout", help="tinyllm or loongsage.")] = "tinyllm",
    checkpoint_path: Annotated[str | None, typer.Option(
        "--checkpoint-path", metavar="PATH",
        help="LoongSage checkpoint_path, relative to the store.")] = None,
    part: Annotated[str, typer.Option(
        "--from", metavar="PART",
        help="LoongSage: hf_model (the step's HF export), dist_ckpt (its torch DCP shards, "
             "consolidated into HF safetensors shards, streaming; needs PyTorch) or auto "
             "(hf_model when the step holds it).")] = "auto",
    hf_model_path: Annotated[str | None, typer.Option(
        "--hf-model-path", metavar="PATH",
        help="With --from dist_ckpt: the HF model folder or URL whose config.json and "
             "tokenizer files go with the weights (default: the step's hf_model/ ones).")] = None,
    require: RequireOpt = None, sign_key: SignKeyOpt = None, sign_cert: SignCertOpt = None,
    cert_chain: CertChainOpt = None, store: StoreOpt = None, db: DbOpt = None,
    as_json: JsonOpt = False, progress: ProgressOpt = None,
) -> None:
    """Release checkpoint STEP of RUN as MODEL_ID@VERSION (weights converted to DTYPE).

    On a terminal a bar shows the files and bytes written; the gate results
    print as they are decided, before the first byte is written."""
    with _releasing(as_json, progress, f"release {model_id}@{version}") as (gates, shown):
        at_least("--step", step, 0)
        at_least("--group-size", group_size, 1)
        fields = {}
        for kv in card_field or []:
            key, sep, value = kv.partition("=")
            if not sep or not key:
                raise UsageError(f"--card-field {kv!r}: expected KEY=VALUE")
            fields[key] = value
        lay = get_layout(layout)
        loong = lay.name == "loongsage"
        if run is None and not loong:
            raise UsageError("--run is required with --layout tinyllm (runs/<run>/ckpt)")
        if not loong and (part != "auto" or hf_model_path is not None):
            raise UsageError("--from and --hf-model-path are for --layout loongsage")
        reg = _registry(store, db)
        result = reg.create_release(
            run, step, model_id, version, dtype=dtype, group_size=group_size,
            ledger=ledger, eval_summary=evals, heads=head or [], card_fields=fields,
            require=require or [], layout=lay,
            checkpoint_root=(checkpoint_path or "") if loong else None,
            subdir=part if loong else "", sign_key=sign_key, sign_cert=sign_cert,
            cert_chain=cert_chain or [], max_shard_size=max_shard_size,
            hf_model_path=hf_model_path, progress=shown)
    _report(result, as_json, gates.printed)
    report_not_indexed(reg.index_errors, store=store, db=db, as_json=as_json)


gate_app = RegistryTyper(help="Release gates.", no_args_is_help=True)
app.add_typer(gate_app, name="gate")


@gate_app.command("check")
def gate_check(ref: Annotated[str, typer.Argument(help="MODEL_ID@VERSION or MODEL_ID@ALIAS.")],
               require: RequireOpt = None, store: StoreOpt = None,
               as_json: JsonOpt = False) -> None:
    """Re-evaluate every gate of a committed release now (live ledger, policy).

    Exits 0 when all pass, 1 otherwise."""
    with error_boundary(as_json):
        doc = documents.gate_check(open_store(store), ref, require=require or [])
    results = [GateResult(g["gate"], g["passed"], g["reason"]) for g in doc["gates"]]
    model_id, version = doc["model_id"], doc["version"]
    if as_json:
        print_json(documents.gate_report(model_id, version, results))
    else:
        _print_gates(results)
    if not doc["passed"]:
        fail(f"{model_id}@{version}: fails the release gates now ("
             + "; ".join(f"{r.name}: {r.reason}" for r in results if not r.passed) + ")",
             EXIT_FAILED, as_json=as_json, cls="GateFailedError", path=f"{model_id}@{version}",
             gates=doc["gates"])


alias_app = RegistryTyper(help="Mutable aliases (refs/<alias>) of releases.",
                        no_args_is_help=True)
app.add_typer(alias_app, name="alias")


@alias_app.command("set")
def alias_set(model_id: Annotated[str, typer.Argument(help="Model id.")],
              alias: Annotated[str, typer.Argument(help="Alias, e.g. prod.")],
              version: Annotated[str, typer.Argument(help="Committed version.")],
              force: Annotated[bool, typer.Option("--force", help="Allow a version that "
                                                                  "fails the gates.")] = False,
              sign_key: MoveKeyOpt = None,
              store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Point ALIAS of MODEL_ID at VERSION (compare-and-swap, recorded); it must pass the gates."""
    with error_boundary(as_json), index_writes():
        reg = _registry(store, db)
        previous = reg.set_alias(model_id, alias, version, force=force, sign_key=sign_key)
    if as_json:
        from registry.cli.snapshot import signed

        print_json({"model_id": model_id, "alias": alias, "version": version,
                    "previous": previous, **signed(reg.snapshots)})
    else:
        from registry.cli.snapshot import report

        echo(f"{model_id}@{alias} -> {version}"
                   + (f" (was {previous})" if previous else ""))
        report(reg.snapshots)
    report_not_indexed(reg.index_errors, store=store, db=db, as_json=as_json)


@alias_app.command("ls")
def alias_ls(model_id: Annotated[str, typer.Argument(help="Model id.")],
             store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List the aliases of MODEL_ID. An alias whose pointer cannot be read is
    named in a warning line on stderr (the others are still listed)."""
    damaged: dict[str, str] = {}
    with error_boundary(as_json):
        s = open_store(store)
        _require_model(s, model_id)
        aliases = documents.alias_map(s, model_id, damaged)
    for alias in sorted(damaged):
        echo(f"warning: damaged alias {alias} skipped: {damaged[alias]}; point it at a "
             "release again (`registry alias set`)", err=True)
    if as_json:
        print_json(aliases)
    else:
        for alias, version in aliases.items():
            echo(f"{alias}\t{version}")
        if not aliases:
            echo(f"{model_id} has no aliases", err=True)


policy_app = RegistryTyper(help="Per-model gate thresholds.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")


@policy_app.command("set")
def policy_set(model_id: Annotated[str, typer.Argument(help="Model id.")],
               require: RequireOpt = None,
               require_signed_by: Annotated[list[str] | None, typer.Option(
                   "--require-signed-by", metavar="PATH",
                   help="Public key or CA certificate (PEM): every release must be signed "
                        "by one of the keys, or with a certificate of one of the CAs, given "
                        "(repeatable).")] = None,
               forbid_code: Annotated[bool, typer.Option(
                   "--forbid-code", help="Releases may carry no pickle and no remote-code "
                                         "file (the code gate: alias moves, pull "
                                         "--require-passing and queries refuse them).")
               ] = False,
               protect: Annotated[list[str] | None, typer.Option(
                   "--protect", metavar="ALIAS=PUBKEY",
                   help="Protect ALIAS: its moves must be signed by the key whose public "
                        "half (PEM) is PUBKEY (repeatable; several keys for one alias allowed); "
                        "hosts pulling with trusted keys refuse unsigned moves.")] = None,
               sign_key: Annotated[str | None, typer.Option(
                   "--sign-key", metavar="PATH",
                   help="EC private key (PEM) of a key the reading hosts trust: sign the "
                        "model's snapshot again when it has one, listing the new policy "
                        "(else hosts with keys refuse the model until registry snapshot "
                        "sign).")] = None,
               store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Replace MODEL_ID's policy: thresholds, signing keys, forbid_code, protected aliases."""
    from registry.cli.snapshot import report, signed
    with error_boundary(as_json), index_writes():
        reg = _registry(store, db)
        _require_model(reg.store, model_id)
        keys = []
        if require_signed_by:
            from registry.trust.certs import load_anchor

            keys = [k for p in require_signed_by for k in load_anchor(p)]
        protected = _protected(protect or [])
        parsed = reg.set_policy(model_id, require or [], signed_by=keys,
                                forbid_code=forbid_code, protected_aliases=protected,
                                sign_key=sign_key)
    if as_json:
        print_json({"model_id": model_id, "require": [str(t) for t in parsed],
                    "signed_by": [_anchor(k) for k in keys], "forbid_code": forbid_code,
                    **signed(reg.snapshots)})
    else:
        echo(f"{model_id}: " + (", ".join(map(str, parsed)) or "no thresholds")
             + "".join(f"; signed by {_anchor_text(k)}" for k in keys)
             + ("; no pickle or remote code" if forbid_code else ""))
        report(reg.snapshots)
    report_not_indexed(reg.index_errors, store=store, db=db, as_json=as_json)


def _protected(items: list[str]) -> dict[str, list[str]]:
    """``--protect ALIAS=PUBKEY`` values as alias -> fingerprints. Raises UsageError."""
    from registry.trust.keys import load_public_key
    from registry.rules.names import check_name

    out: dict[str, list[str]] = {}
    for item in items:
        alias, sep, path = item.partition("=")
        if not sep or not path:
            raise UsageError(f"--protect {item!r}: expected ALIAS=PUBKEY (a public key file)")
        out.setdefault(check_name(alias, "alias"), []).append(load_public_key(path).fingerprint)
    return out


@policy_app.command("show")
def policy_show(model_id: Annotated[str, typer.Argument(help="Model id.")],
                store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Show MODEL_ID's thresholds."""
    with error_boundary(as_json):
        s = open_store(store)
        _require_model(s, model_id)
        parsed = thresholds(s, model_id)
        keys = signed_by(s, model_id)
    if as_json:
        print_json([str(t) for t in parsed])
    else:
        echo("\n".join(map(str, parsed)) or "no thresholds", lines=True)
        for k in keys:
            echo(f"signed by {_anchor_text(k)}")


def _anchor(k: PublicKey | Certificate) -> dict[str, str]:
    doc = {"name": k.name, "fingerprint": k.fingerprint}
    if not isinstance(k, PublicKey):
        doc |= {"kind": "ca", "subject": k.subject}
    return doc


def _anchor_text(k: PublicKey | Certificate) -> str:
    if isinstance(k, PublicKey):
        return f"{k.name} ({k.fingerprint})"
    return f"a certificate of CA {k.subject!r} ({k.name}, {k.fingerprint})"


# ``registry gc`` lives in its own module; registered here, after policy, so
# that --help and docs/cli.md keep their order.
from registry.cli import gc as _gc  # noqa: E402,F401
