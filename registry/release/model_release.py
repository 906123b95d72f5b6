"""ModelRelease: immutable releases from a checkpoint or an existing model directory.

Implements seed 000 "Released model" and DESIGN sections 4-5::

    models/<model_id>/<version>/{model.safetensors, config.json, generation_config.json?,
        tokenizer.json?, tokenizer_config.json?, MODEL_CARD.md, ledger.json,
        evals/summary.json, heads/<name>.json*, MANIFEST.json}

Every gate is evaluated on the inputs *before* a byte is written; a release
that fails any gate is refused with every failing check. The directory is
then written with the commit protocol (claim + manifest on object stores,
staging + rename locally), so a version is published exactly once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
import dataclasses
from typing import TYPE_CHECKING, Any

from registry.host.actor import actor_metadata, current_actor
from registry.rules import limits
from registry.rules import schemas
from registry.checkpoint.layout import TINYLLM, Layout
from registry.checkpoint.tree import CheckpointTree
from registry.protocol import sequence
from registry.protocol.commit import DirectoryWriter
from registry.errors import (
    DocumentError,
    NotCommittedError,
    ObjectNotFoundError,
    UsageError,
    VersionExistsError,
)
from registry.gating.gates import ReleaseFacts, Threshold
from registry.protocol.layout import release_prefix, run_root
from registry.protocol.manifest import MANIFEST, list_local_files, utc_now
from registry.formats.modeldir import check_files, check_other_weights
from registry.rules.names import check_name
from registry.obs.tracing import traced
from registry.release import code as release_code
from registry.release import signature_gate
from registry.release.card import render_card
from registry.release.checks import ReleaseChecks
from registry.release.copying import copy_file
from registry.release.inputs import (  # noqa: F401 - stored_code_gate: re-exported
    check_carried_generation_config,
    check_source_bytes,
    config_dtype,
    dump_doc,
    load_doc,
    release_inputs,
    source_run_id,
    stored_code_gate,
)
from registry.release.result import ReleaseResult
from registry.release.convert import (
    AUTO,
    dtype_label,
    engines_accept,
    needs_auto,
    off_seed,
    weights_groups,
)
from registry.release.dist_release import choose_part, dist_source
from registry.release.step_source import check_step_source, missing_step
from registry.checkpoint.loongsage_format import DIST
from registry.release.hfconfig import released_config
from registry.release.shards import ShardPlan, weight_files
from registry.release.source_check import read_checked
from registry.formats.weights import DEFAULT_MAX_SHARD_SIZE, load_weights, parse_size
from registry.trust.model_sig import SIGNATURE
from registry.host.sourcedir import SourceRule
from registry.obs.progress import NULL, Progress
from registry.store import LocalStore, Store, join, open_store
from registry.store.source import SourceDirStore
from registry.protocol.verify import require_verified

if TYPE_CHECKING:
    from registry.trust import Trust

CARRIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
RESERVED = {MANIFEST, "ledger.json", "MODEL_CARD.md"}


class ModelRelease(ReleaseChecks):
    """Creates and checks releases in one store.

    Args:
        store: a store URL or an open Store.

    Attributes:
        on_commit: callables run with each ReleaseResult after its commit (the
            index registers itself here); their failures never undo a commit.
    """

    def __init__(self, store: str | Store | None = None) -> None:
        self.store = store if isinstance(store, Store) else open_store(store)
        self.on_commit: list[Callable[[ReleaseResult], None]] = []
        #: told the gates as decided, then the files and bytes as written
        self.progress: Progress = NULL

    # -- creating ----------------------------------------------------------------

    def create(self, run_id: str | None, step: int, model_id: str, version: str, *,
               dtype: str = "f32", group_size: int = 128, ledger: Any, eval_summary: Any,
               heads: Sequence[Any] = (), card_fields: Mapping[str, Any] | None = None,
               generation_config: Any = None, tokenizer_config: Any = None,
               require: Iterable[Threshold | str] = (), layout: Layout = TINYLLM,
               checkpoint_root: str | None = None, subdir: str = "",
               sign_key: str | os.PathLike[str] | None = None,
               sign_cert: str | os.PathLike[str] | None = None,
               cert_chain: Iterable[str | os.PathLike[str]] = (),
               max_shard_size: int | str | None = None,
               hf_model_path: Any = None) -> ReleaseResult:
        """Release ``step`` of run ``run_id`` as ``model_id`` ``version``.

        Args:
            run_id, step: the source checkpoint (verified by sha256 first). In a
                tree given by ``checkpoint_root`` (LoongSage) ``run_id`` may be
                None: ``source.run_id`` is always the step manifest's ``run_id``.
            dtype: ``"f32"``, ``"bf16"`` (round to nearest even) or ``"int4"``
                (``<name>.qweight`` + ``<name>.scales``, ``group_size`` columns
                per scale); converted streaming, tensor by tensor, shard by
                shard (the weights may be one file or an index and its
                shards, :mod:`registry.formats.weights`).
            max_shard_size: bytes of tensor data per released shard (an int,
                or ``"5GB"`` as transformers writes it); converted weights
                default to 5 GB. Given with no ``dtype``, the weights are
                re-packed with their dtypes kept. One shard is released as
                ``model.safetensors``, several as shards plus the index.
            ledger: ledger rows (list or path to ledger JSON).
            eval_summary: the EvalSuite summary (dict or path).
            heads: linear heads (dicts or paths), checked against the hidden size.
            card_fields: extra card facts (``description``, ``intended_use``...).
            generation_config, tokenizer_config: dicts or paths; the
                checkpoint's generation_config.json is carried when not given.
            require: extra thresholds (``"acc>=0.8"``) on top of the model's policy.
            layout, checkpoint_root, subdir: where the checkpoint lives
                (LoongSage trees: ``subdir="hf_model"``, ``"dist_ckpt"`` or
                ``"auto"``: hf_model/ when the step lists it, else dist_ckpt/).
                ``"dist_ckpt"`` consolidates the step's torch DCP shards
                (``model.<name>`` -> ``<name>``, as ``save_hf`` exports them)
                into the release's shards, streaming, tensor by tensor
                (:mod:`registry.release.dcp_source`; needs PyTorch).
            hf_model_path: with ``dist_ckpt``: the HF model folder or URL whose
                config.json and tokenizer files go with the weights (default:
                the step's own hf_model/ ones, else UsageError).
            sign_key: PEM EC private key: the release gets ``model.sig``
                (OpenSSF model signing, see :mod:`registry.trust.model_sig`), listed in
                MANIFEST.json, made from the digests computed while writing.
            sign_cert: the PEM certificate of ``sign_key`` (issued by a CA,
                e.g. ``registry keys issue``): the bundle carries it and
                ``cert_chain`` (PEM files of the CAs above it), and verifies
                against a host's trusted CA (:mod:`registry.trust.certs`).

        Returns:
            The ReleaseResult (``manifest.meta["source"]`` names the checkpoint's
            run, step and manifest sha256).

        Raises:
            InvalidNameError: a bad model_id or version (``../x``, ``refs``...).
            UsageError: ``run_id`` differs from the run_id of the step's manifest
                (LoongSage trees), or is None for a tinyllm run.
            NameTakenError: an alias of the model has the version's name.
            VersionExistsError: the version exists (or another publisher won).
            NoValidCheckpointError, IntegrityError: the checkpoint does not verify.
            GateFailedError: a gate fails; nothing is written.
            SchemaValidationError, DocumentError: the ledger, eval summary, a head
                or config is missing, unreadable or invalid (checked before any gate),
                or ``sign_key`` is not a readable EC private key, or ``sign_cert``
                is not its certificate, is expired or not yet valid, or lacks the
                signing usage (all checked first).
            UsageError: ``sign_cert``/``cert_chain`` without ``sign_key``.
            SigningUnavailableError: ``sign_key`` without the ``[signing]`` extra.
            CheckpointError: a ``dist_ckpt`` entry that cannot be mapped to a
                Hugging Face tensor (one line naming it and the rule).
            TorchUnavailableError: ``dist_ckpt`` without PyTorch.
        """
        prefix = release_prefix(model_id, version)
        ledger, eval_summary = release_inputs(ledger, eval_summary)
        self._refuse_existing(prefix)
        if checkpoint_root is None and run_id is None:
            raise UsageError("run_id is required for a run's checkpoints (runs/<run>/ckpt)")
        tree = CheckpointTree(self.store, checkpoint_root if checkpoint_root is not None
                              else run_root(check_name(run_id, "run_id")), layout)
        try:
            src_manifest = require_verified(self.store, tree.prefix(step), full=True)
        except NotCommittedError:
            raise missing_step(tree, run_id, step) from None
        run_id = source_run_id(run_id, src_manifest, self.store.url_of(tree.prefix(step)))
        source = {"run_id": run_id, "step": step, "manifest_sha256": src_manifest.digest}
        if layout.name == "loongsage":
            subdir = choose_part(subdir or "auto", src_manifest,
                                 self.store.url_of(tree.prefix(step)))
        if subdir == DIST:
            src_store, src, names, digests, dcp = dist_source(
                self.store, tree.prefix(step), src_manifest, hf_model_path)
            return self._release(src_store, src, names, prefix, model_id, version,
                                 source=source, digests=digests,
                                 dtype=dtype, group_size=group_size, ledger=ledger,
                                 evals=eval_summary, heads=heads, card=None,
                                 card_fields=card_fields, generation_config=generation_config,
                                 tokenizer_config=tokenizer_config, require=require,
                                 copy_all=False, sign_key=sign_key, sign_cert=sign_cert,
                                 cert_chain=cert_chain, max_shard_size=max_shard_size, dcp=dcp)
        src = join(tree.prefix(step), subdir)
        names = {e.path[len(subdir) + 1:] if subdir else e.path: e.size
                 for e in src_manifest.files if not subdir or e.path.startswith(subdir + "/")}
        digests = {e.path[len(subdir) + 1:] if subdir else e.path: e.sha256
                   for e in src_manifest.files}
        return self._release(self.store, src, names, prefix, model_id, version, source=source,
                             digests=digests,
                             dtype=dtype, group_size=group_size, ledger=ledger,
                             evals=eval_summary, heads=heads, card=None,
                             card_fields=card_fields, generation_config=generation_config,
                             tokenizer_config=tokenizer_config, require=require, copy_all=False,
                             sign_key=sign_key, sign_cert=sign_cert, cert_chain=cert_chain,
                             max_shard_size=max_shard_size)

    @traced("registry.publish")
    def publish(self, model_dir: str | os.PathLike[str], model_id: str, version: str, *,
                ledger: Any, eval_summary: Any, heads: Sequence[Any] = (),
                card: str | os.PathLike[str] | None = None,
                card_fields: Mapping[str, Any] | None = None, dtype: str | None = None,
                group_size: int = 128, require: Iterable[Threshold | str] = (),
                sign_key: str | os.PathLike[str] | None = None,
                sign_cert: str | os.PathLike[str] | None = None,
                cert_chain: Iterable[str | os.PathLike[str]] = (),
                max_shard_size: int | str | None = None,
                forbid_code: bool = False, follow_symlinks: bool = False,
                source_uri: str | None = None, include: Iterable[str] = (),
                keep_dtype: bool = False, card_verbatim: bool = False,
                source_trust: Trust | None = None) -> ReleaseResult:
        """Release an existing model directory (a Hugging Face export, say) as is.

        A ``model_dir`` that is a release's folder in a store (a release from a
        release) is admitted first by the trust function with
        ``source_trust`` (:mod:`registry.release.release_source`): a deleted,
        yanked, failing, rolled-back or (with trust) unsigned source is
        refused, nothing written.

        A second set of weights beside the safetensors (``pytorch_model.bin``,
        its index and shards, ``tf_model.h5``, ``flax_model.msgpack``,
        ``*.gguf``, ``*.onnx``...: registry.formats.modeldir.OTHER_WEIGHTS) is
        DocumentError naming the file, nothing written, unless ``include``
        names it (a path or fnmatch pattern); then it is carried and the card,
        ``show`` and the result (``other_weights``) list every set.

        Weights dtypes (seed 000's release table: "F32 or BF16, or int4"):
        without ``dtype``, tensors already F32 or BF16 (or an int4 release's
        ``.qweight``/``.scales``) are copied byte for byte; when a
        floating-point tensor is in another dtype (F16, F64, F8) the weights
        are converted, such tensors to F32 (``"auto"``); integer and boolean
        tensors (position ids, masks: not weights) are never converted.
        ``keep_dtype`` keeps every dtype as published instead (the earlier
        behaviour): the rendered card then carries a warning naming the
        dtypes that are not the seed's.

        Model card (seed 000: "MODEL_CARD.md from templates/MODEL_CARD.md"):
        the ``card`` file is the free text of the card rendered from the
        template (its description), the registry's facts (source, weights,
        evaluation, training data) around it; ``card_verbatim`` stores the
        file as it is instead. Without ``card``, the directory's own
        MODEL_CARD.md is carried as it is (a file of the directory, like
        every other), else the card is rendered.

        Every file of ``model_dir`` is carried (the weights, one
        ``model.safetensors`` or an index and its shards, byte for byte unless
        ``dtype`` or ``max_shard_size`` asks for a conversion, see
        :meth:`create`); the release adds
        MODEL_CARD.md (``card`` file verbatim, else the directory's own, else
        rendered), ledger.json, evals/summary.json and heads. ``source`` is
        ``{"uri": <model_dir>}``, or ``source_uri`` when given (an import names
        where the directory came from: ``oci://host/repo@sha256:...``).
        Raises as :meth:`create`, plus DocumentError
        when the directory lacks its weights or config.json, or its weights
        break a rule of :mod:`registry.formats.weights` (both forms, a stale or
        missing shard, a tensor in two shards...). A directory
        inside a checkpoint step (seed 003's ``train_step_<N>/hf_model``) is
        first verified in full against the step's MANIFEST.json:
        NotCommittedError when the step is not committed, IntegrityError when
        a file is unlisted or differs (see ``release.step_source``).

        ``forbid_code`` (or the model policy's ``forbid_code``) refuses, with
        GateFailedError and nothing written, a directory that carries pickle
        or remote-code files (:mod:`registry.release.code`).

        ``sign_key`` (and ``sign_cert``) signs the release as in :meth:`create`. Without it, a
        ``model.sig`` the directory already holds (signed with the library's
        own CLI, say) is carried only if it names ``model_id@version`` and
        covers exactly the release's files and digests (SignatureError
        otherwise, nothing committed); its key is checked on pull.

        Symbolic links in a local ``model_dir`` are read as the files they name
        when they stay inside it (a Hugging Face cache snapshot's links into
        its repository's ``blobs/`` included); one leading out of it is
        UnsafeEntryError naming the link and its target, nothing written,
        unless ``follow_symlinks``: then it is read, and listed in the result's
        ``followed`` (registry.host.sourcedir, docs/confinement.md).
        """
        prefix = release_prefix(model_id, version)
        ledger, eval_summary = release_inputs(ledger, eval_summary)
        self._refuse_existing(prefix)
        url = os.fspath(model_dir)
        check_step_source(url)  # inside a checkpoint step: only from a committed one
        from registry.release.release_source import check_release_source

        # a release: only as the trust function admits it; its model.sig vouches for the
        # source release, not for the new one (sign that with sign_key)
        from_release = check_release_source(url, source_trust) is not None
        src_store = open_store(url)
        local_root = src_store.root if isinstance(src_store, LocalStore) else None
        if local_root is not None and not os.path.isdir(local_root):
            raise ObjectNotFoundError(f"{url}: no such model directory", key=url)
        followed: list[tuple[str, str]] = []
        if local_root is not None:
            rule = SourceRule(local_root, follow_symlinks,
                              lambda link, target: followed.append((link, target)))
            src_store = SourceDirStore(src_store.url, local_root, rule)
            list_local_files(local_root, rule=rule)  # refuses FIFOs, sockets, links out
        names = src_store.walk_files("")
        if from_release:
            names.pop(SIGNATURE, None)
        if not names and local_root is None:
            raise ObjectNotFoundError(f"{url}: no such model directory (nothing stored there)",
                                      key=url)
        if not names:
            raise DocumentError(url, "not a model directory (no files)")
        card_text = None
        checks: dict[str, str] = {}  # how each file of an S3 source was checked
        if card is not None:
            try:
                with open(card, encoding="utf-8") as f:
                    card_text = f.read()
            except (OSError, UnicodeDecodeError) as e:
                raise DocumentError(os.fspath(card), f"cannot read the model card: {e}") from None
            if not card_verbatim:
                card_fields = {"description": card_text.strip(), **dict(card_fields or {})}
                card_text = None
        elif "MODEL_CARD.md" in names:
            card_text = read_checked(src_store, "MODEL_CARD.md", limit=limits.MAX_READ_BYTES,
                                     checks=checks).decode("utf-8", "replace")
        uri = source_uri or (url if "://" in url else os.path.abspath(url))
        result = self._release(src_store, "", names, prefix, model_id, version,
                             source={"uri": uri},
                             dtype=dtype if dtype is not None or keep_dtype else AUTO,
                             group_size=group_size,
                             ledger=ledger, evals=eval_summary, heads=heads, card=card_text,
                             card_fields=card_fields, generation_config=None,
                             tokenizer_config=None, require=require, copy_all=True,
                             sign_key=sign_key, sign_cert=sign_cert, cert_chain=cert_chain,
                             max_shard_size=max_shard_size, forbid_code=forbid_code,
                             checks=checks, include=include)
        if not followed:
            return result
        return dataclasses.replace(result, followed=tuple(dict.fromkeys(followed)))

    def _release(self, src_store: Store, src: str, names: dict[str, int], prefix: str,
                 model_id: str, version: str, *, source: dict[str, Any], dtype: str | None,
                 group_size: int, ledger: Any, evals: Any, heads: Sequence[Any],
                 card: str | None, card_fields: Mapping[str, Any] | None,
                 generation_config: Any, tokenizer_config: Any,
                 require: Iterable[Threshold | str], copy_all: bool,
                 sign_key: str | os.PathLike[str] | None = None,
                 sign_cert: str | os.PathLike[str] | None = None,
                 cert_chain: Iterable[str | os.PathLike[str]] = (),
                 digests: Mapping[str, str] | None = None,
                 max_shard_size: int | str | None = None,
                 forbid_code: bool = False, dcp: Any = None,
                 checks: dict[str, str] | None = None,
                 include: Iterable[str] = ()) -> ReleaseResult:
        where = src_store.url_of(src)
        if "://" not in where:  # a local folder: name it whatever the working directory
            where = os.path.abspath(where)
        shard_limit = parse_size(max_shard_size) if max_shard_size is not None else None
        signer = signature_gate.signer(sign_key, sign_cert=sign_cert, cert_chain=cert_chain)
        checks = {} if checks is None else checks
        config_raw = (read_checked(src_store, join(src, "config.json"), checks=checks,
                                   relpath="config.json", limit=limits.MAX_JSON_BYTES)
                      if "config.json" in names else b"{}")
        config = schemas.load_json(config_raw, path=f"{where}/config.json")
        if not isinstance(config, dict):
            raise DocumentError(f"{where}/config.json", "must be a JSON object")
        # dcp: a dist_ckpt's tensors (registry.release.dcp_source), always written anew
        weights = dcp if dcp is not None else load_weights(src_store, src, files=names,
                                                            where=where)
        check_files(names, config, where=where, release=f"{model_id}@{version}")
        # publish carries every file: one set of weights unless told (issue 47)
        others = check_other_weights(names, include, where=where) if copy_all else {}
        if dtype == AUTO and not needs_auto(
                d for n, (d, _) in weights.described.items()
                if not (weights.metadata.get("quant") == "int4" and n.endswith(".qweight"))):
            dtype = None  # every tensor is in a seed dtype already: copied as it is
        as_is = dcp is None and dtype is None and shard_limit is None and all(
            engines_accept(s.header.metadata) for s in weights.shards)
        extra: dict[str, bytes] = {}
        if generation_config is None and "generation_config.json" in names:  # carried as it is
            check_carried_generation_config(read_checked(
                src_store, join(src, "generation_config.json"), checks=checks,
                relpath="generation_config.json", limit=limits.MAX_JSON_BYTES),
                f"{where}/generation_config.json")
        elif generation_config is not None:
            doc, gwhere = load_doc(generation_config, what="generation_config.json")
            schemas.validate(doc, "generation-config", path=gwhere)
            extra["generation_config.json"] = dump_doc(doc)
        if tokenizer_config is not None:
            extra["tokenizer_config.json"] = dump_doc(load_doc(tokenizer_config,
                                                            what="tokenizer_config.json")[0])
        head_docs = self._heads(heads, config)
        # What will be stored, per tensor group and file (int4 refuses a plan
        # with no quantized tensor here, before a byte is written).
        limit = shard_limit or DEFAULT_MAX_SHARD_SIZE
        shard_plan = None if as_is else dcp.plan(
            dtype=dtype, group_size=group_size, max_shard_size=limit) if dcp is not None \
            else ShardPlan(src_store, src, weights, dtype=dtype, group_size=group_size,
                           max_shard_size=limit, where=where)
        groups = (weights_groups(weights.described, weights.metadata) if shard_plan is None
                  else shard_plan.groups)
        new_config = released_config(config, dtype=dtype, groups=groups, group_size=group_size)
        if new_config is not None:
            check_source_bytes(config_raw, digests, "config.json", f"{where}/config.json")
            extra["config.json"] = new_config
        facts = self._facts(card=card, ledger=ledger, evals=evals)
        if card is None and facts.evals is not None and facts.ledger is not None:
            card = render_card({
                "model_id": model_id, "version": version, "created_at": utc_now(),
                "source": source, "dtype": dtype_label(groups), "weights": groups,
                "converted": dtype, "group_size": group_size,
                "parameter_count": weights.parameter_count,
                "weight_files": (weight_files(weights) if shard_plan is None
                                 else shard_plan.files),
                "config_dtype": config_dtype(json.loads(new_config) if new_config else config),
                "off_seed_dtypes": sorted({g["stored"] for g in groups
                                           if off_seed(g["stored"])}),
                "evals": facts.evals, "ledger": facts.ledger, "heads": head_docs,
                "other_weights": others,
                **dict(card_fields or {})})
            facts = ReleaseFacts(card, facts.ledger, None, facts.evals, None)
        kept = [n for n in names if n not in extra]
        code_found = release_code.code_files([*kept, *extra], lambda n: extra.get(n) or (
            src_store.read_bytes(join(src, n), limit=limits.MAX_JSON_BYTES) if n in names
            else None))
        results = self._gate(model_id, self.store.url_of(prefix), facts, require,
                             signer=signer, carries_signature=copy_all and SIGNATURE in names,
                             code_found=code_found, forbid_code=forbid_code)
        assert facts.ledger is not None and facts.evals is not None and card is not None

        carried = sorted(n for n in names if n not in RESERVED and n not in weights.files
                         and not n.startswith("evals/") and not n.startswith("heads/")
                         and (copy_all or n in CARRIED) and n not in extra
                         and not (n == SIGNATURE and signer is not None))
        docs = {"MODEL_CARD.md": card.encode(), "ledger.json": dump_doc(facts.ledger),
                "evals/summary.json": dump_doc(facts.evals),
                **{f"heads/{h['name']}.json": dump_doc(h) for h in head_docs}}
        planned = ({n: names[n] for n in weights.files} if shard_plan is None
                   else {f["path"]: f["bytes"] or 0 for f in shard_plan.files})
        planned |= {n: names[n] for n in carried} | {n: len(b) for n, b in extra.items()}
        planned |= {n: len(b) for n, b in docs.items()}
        self.progress.start("release", files=len(planned) + (signer is not None),
                            total=sum(planned.values()))
        with DirectoryWriter(self.store, prefix, kind="release",
                             meta={"model_id": model_id, "version": version, "source": source},
                             conflict_error=VersionExistsError, progress=self.progress) as w:
            # Every byte taken from the source is checked against the source's
            # manifest (release create) before the commit; a converted file
            # against a streamed read when the source has none (publish).
            if shard_plan is None:
                for name in weights.files:
                    copy_file(src_store, join(src, name), w, name, digests, checks)
            else:  # converted, re-packed, or a format engines refuse: metadata fixed
                shard_plan.write(w, digests, checks)
            for name in carried:
                copy_file(src_store, join(src, name), w, name, digests, checks)
            for name, data in extra.items():
                w.write_bytes(name, data)
            for name, data in docs.items():
                w.write_bytes(name, data)
            results = signature_gate.seal(w, signer, self.store, model_id, version, results)
            # The store's order, not this host's clock (registry.protocol.sequence):
            # taken last, under the claim, right before the commit marker, and
            # only for a manifest that validates (else a new model's .sequence stays).
            w.check()
            w.meta["metadata"] = {**w.meta.get("metadata", {}),
                                  **actor_metadata(current_actor(
                                      signer.public.fingerprint if signer else None)),
                                  sequence.FIELD: str(sequence.next_sequence(
                                      self.store, model_id, publishing=version))}
            manifest = w.commit()
        self.progress.finish()
        result = ReleaseResult(model_id, version, self.store.url_of(prefix), manifest, results,
                               source_checks=tuple(sorted(checks.items())),
                               other_weights=tuple((k, tuple(v)) for k, v in others.items()))
        for hook in self.on_commit:
            hook(result)
        return result


