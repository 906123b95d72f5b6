"""``registry config show`` / ``registry config set``: the config file and
its profiles (registry.host.config; docs/configuration.md#the-config-file)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from registry.host import config
from registry.cli.app import JsonOpt, RegistryTyper, app, print_json
from registry.cli.errors import error_boundary
from registry.cli.output import echo

config_app = RegistryTyper(help="The config file and its profiles (store, index, trusted keys, "
                                "token file).", no_args_is_help=True)
app.add_typer(config_app, name="config")

ProfileOpt = Annotated[str | None, typer.Option(
    "--profile", metavar="NAME",
    help="Profile to show or change (default: the root --profile / REGISTRY_PROFILE, "
         "else the file's default profile, else 'default').")]


def _profile(ctx: Any, given: str | None) -> str | None:
    """The profile named here, else on the root (``registry --profile``)."""
    return given or ctx.find_root().meta.get("registry.profile_name")


@config_app.command("show")
def show(ctx: typer.Context, profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Print the config file's path, the profile in use and its settings.

    A token is shown as its file (token_file), never read. A setting an
    environment variable overrides is marked with the variable's name."""
    with error_boundary(as_json):
        cfg = config.load()
        selected = cfg.selected(_profile(ctx, profile))
        values = cfg.profiles.get(selected, {}) if selected else {}
    overridden = {k: config.KEYS[k][1] for k in values if os.environ.get(config.KEYS[k][1])}
    if as_json:
        print_json({"path": cfg.path, "exists": os.path.exists(cfg.path),
                    "profile": selected, "profiles": sorted(cfg.profiles),
                    "settings": dict(sorted(values.items())), "overridden": overridden})
        return
    echo(f"config file: {cfg.path}" + ("" if os.path.exists(cfg.path) else " (none yet)"))
    echo(f"profiles: {', '.join(sorted(cfg.profiles)) or 'none'}")
    echo(f"profile: {selected or 'none'}")
    for key, value in sorted(values.items()):
        note = f"  (overridden by ${overridden[key]})" if key in overridden else ""
        echo(f"{key} = {config.dumps_value(value)}{note}")


@config_app.command("set")
def set_cmd(ctx: typer.Context,
            key: Annotated[str, typer.Argument(help="Setting: " + ", ".join(config.KEYS) + ".")],
            value: Annotated[str, typer.Argument(help="Its value (a path for token_file); "
                                                      "'' removes the setting.")],
            profile: ProfileOpt = None, as_json: JsonOpt = False) -> None:
    """Set KEY of a profile (created if new) in the config file, written 0600.

    Secrets go by file reference: token_file = PATH, never the token itself."""
    with error_boundary(as_json):
        cfg = config.load()
        name = _profile(ctx, profile) or cfg.default_profile or "default"
        config.set_value(cfg, name, key, value)
        config.save(cfg)
    if as_json:
        print_json({"path": cfg.path, "profile": name, "key": key,
                    "value": value or None})
        return
    if value:
        echo(f"set {key} of profile {name} in {cfg.path}")
    else:
        echo(f"removed {key} from profile {name} in {cfg.path}")
