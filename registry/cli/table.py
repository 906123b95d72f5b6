"""The table of the root's commands and the root's plain ``--help``: no typer.

:data:`COMMANDS` names, for each top-level command or group, the command
modules that register it (registry.cli.commands imports them when the command
runs) and the first paragraph of its help. :func:`root_help` writes what
``registry --help`` (and ``registry`` alone) prints from this table and
:data:`ROOT_OPTIONS`, in plain text, so listing the commands loads neither
typer, click nor rich. tests/test_cli_startup.py checks both tables against
the Typer app (registry.cli.app); docs/cli.md is still written from that app.

May import: the standard library only.
"""

from __future__ import annotations

import inspect
import shutil
import textwrap

_I, _R, _L = "registry.cli.index", "registry.cli.release", "registry.cli.lifecycle"

#: name -> (command modules, whether a group, first paragraph of its help), in
#: the order ``registry --help`` lists them
COMMANDS: dict[str, tuple[tuple[str, ...], bool, str]] = {
    "query": ((_I,), False,
              "Ask the index: MODEL_ID --passing [--require M>=V] [--latest], --source ID, or a\n"
              "search: [MODEL_ID] with any of --tag, --since, --dtype, --source (all must match)."),
    "show": ((_I,), False,
             "Manifest summary, each gate with its reason, evals and sources of a release."),
    "ls": ((_I,), False,
           "List models (or those of ORG/), or the releases of MODEL_ID (newest first, passing "
           "or not)."),
    "diff": ((_I,), False,
             "Files added, removed and changed (sha256) between two releases; eval deltas."),
    "publish": ((_R,), False,
                "Release an existing model directory (e.g. a Hugging Face one) as "
                "MODEL_ID@VERSION."),
    "gc": (("registry.cli.gc",), False,
           "Remove abandoned claims, staging dirs, uncommitted leftovers and the\n"
           "temporary files of killed event appends (events/.tmp-*); never a commit."),
    "yank": ((_L,), False,
             "Take a release out of service, its files kept (`registry unyank` undoes it)."),
    "unyank": ((_L,), False,
               "Put a yanked release back in service (recorded, with who and when)."),
    "load": (("registry.cli.load",), False,
             "Stream every tensor of a release into memory, verified piece by piece; "
             "write nothing."),
    "push": (("registry.cli.oci",), False,
             "Push a release to an OCI registry as a ModelPack artifact (signature as a "
             "referrer)."),
    "import": (("registry.cli.oci",), False,
               "Release an OCI model artifact (ours or another tool's ModelPack) through "
               "the gates."),
    "pull": (("registry.cli.pull",), False,
             "Download, verify and place a release where the engine reads it (needs no "
             "index)."),
    "quickstart": (("registry.cli.quickstart",), False,
                   "Run the whole workflow on STORE and DB, printing each step (a few "
                   "minutes at most)."),
    "serve": (("registry.cli.serve",), False,
              "Serve web pages, a JSON API (/api/v1) and the Hugging Face Hub download API, "
              "read-only."),
    "verify": (("registry.cli.verify",), False,
               "Check that DIRECTORY is committed and every file matches its MANIFEST.json."),
    "cache": (("registry.cli.cache",), True, "The pull cache of this host: list, prune, verify."),
    "ckpt": (("registry.cli.ckpt", "registry.cli.loongsage"), True,
             "Checkpoints of training runs (seed 000 and LoongSage trees)."),
    "db": ((_I,), True, "The index database schema."),
    "index": ((_I,), True, "The SQL index derived from the store."),
    "ledger": ((_I,), True, "The live data ledger (revocations)."),
    "snapshot": (("registry.cli.snapshot",), True,
                 "Signed snapshots and timestamps of a model's trust records (yanks, "
                 "tombstones, aliases, revocations, policy)."),
    "keys": (("registry.cli.keys",), True,
             "Signing keys (elliptic curve, PEM) and a local CA for signed releases."),
    "release": ((_R, _L), True, "Releases from checkpoints."),
    "gate": ((_R,), True, "Release gates."),
    "alias": ((_R, "registry.cli.aliases"), True, "Mutable aliases (refs/<alias>) of releases."),
    "policy": ((_R,), True, "Per-model gate thresholds."),
    "tag": ((_L,), True, "Mutable tags of releases (KEY=VALUE)."),
    "events": (("registry.cli.events",), True,
               "The store's event log (events/) and webhook delivery."),
    "config": (("registry.cli.config",), True,
               "The config file and its profiles (store, index, trusted keys, token file)."),
}

#: every command module, in the order that registers the commands as
#: ``docs/cli.md`` lists them (release before aliases, oci and lifecycle's
#: additions to its groups)
MODULES: tuple[str, ...] = tuple(f"registry.cli.{m}" for m in (
    "cache", "ckpt", "index", "keys", "lifecycle", "load", "loongsage", "pull", "quickstart",
    "release", "gc", "serve", "snapshot", "verify", "aliases", "events", "oci", "config"))


def first_paragraph(text: str | None) -> str:
    """The first paragraph of a help text, as :data:`COMMANDS` records it."""
    return inspect.cleandoc(text or "").split("\n\n")[0]


#: the root's description (registry.cli.app's ``app`` help)
ROOT_HELP = ("Object-store-backed registry for model directories: checkpoints, releases, "
             "gates and pull.")

#: the root's options as ``--help`` lists them: (flag, metavar, help, env var)
ROOT_OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("--debug", "", "Show tracebacks of errors.", ""),
    ("--version", "", "Print the package version and exit.", ""),
    ("--log-format", "FORMAT", "text (default) or json: errors, and serve's request log, "
                               "as one JSON object per line.", "REGISTRY_LOG_FORMAT"),
    ("--metrics-file", "PATH", "Write the command's Prometheus metrics to this "
                               "node-exporter textfile (*.prom) when it ends.",
     "REGISTRY_METRICS_FILE"),
    ("--metrics-push", "URL", "Push the command's Prometheus metrics to this Pushgateway "
                              "when it ends.", "REGISTRY_METRICS_PUSH"),
    ("--profile", "NAME", "Profile of the config file to take settings from (flags and "
                          "environment variables still win; docs/configuration.md).",
     "REGISTRY_PROFILE"),
    ("--help", "", "Show this message and exit.", ""),
)


def _rows(rows: list[tuple[str, str]], width: int) -> list[str]:
    """Two columns: ``left`` padded, ``right`` wrapped to ``width`` columns."""
    left = max(len(a) for a, _ in rows) + 2
    text_width = max(width - left - 2, 30)
    out = []
    for name, text in rows:
        lines: list[str] = []
        for para in text.split("\n"):
            lines += textwrap.wrap(para, text_width, break_on_hyphens=False) or [""]
        out.append(f"  {name.ljust(left)}{lines[0]}")
        out += [f"  {' ' * left}{line}" for line in lines[1:]]
    return out


def root_help(width: int | None = None) -> str:
    """The root's help, plain text: usage, description, options (with their
    environment variables) and each command with its first help paragraph,
    wrapped to ``width`` columns (the terminal's, at most 100, by default).
    Ends with a newline."""
    if width is None:
        width = min(shutil.get_terminal_size((80, 24)).columns, 100)
    options = [(f"{flag} {metavar}".rstrip(),
                f"{text} [env var: {env}]" if env else text)
               for flag, metavar, text, env in ROOT_OPTIONS]
    lines = ["Usage: registry [OPTIONS] COMMAND [ARGS]...", "",
             *textwrap.wrap(ROOT_HELP, width, break_on_hyphens=False), "", "Options:", *_rows(options, width), "",
             "Commands:",
             *_rows([(name, " ".join(text.split())) for name, (_, _, text) in COMMANDS.items()],
                    width), "",
             "Run `registry COMMAND --help` for a command's arguments and options."]
    return "\n".join(lines) + "\n"
