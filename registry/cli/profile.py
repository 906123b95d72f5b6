"""The config file's profile applied to a command line (registry.host.config).

:func:`apply_profile` runs in the root callback, before the command's own
options are parsed: it puts the profile's settings where
:class:`registry.cli.app.RegistryContext` finds them as defaults, and sets the
environment variables a profile stands for (S3 endpoint, region, AWS profile;
the token ``pull``/``load --from`` send) for the command, unless they are set.

May import: registry.host.config (not registry.cli.app, which imports this).
"""

from __future__ import annotations

import os
from typing import Any

from registry.host import config

#: ``ctx.meta`` key of the root context: {parameter name: the profile's value},
#: what registry.cli.app.RegistryContext gives as defaults
PROFILE_DEFAULTS = "registry.profile_defaults"

#: commands that read the mirror token ($HF_TOKEN) a profile's token_file gives
_MIRROR_CLIENTS = ("pull", "load")


def apply_profile(ctx: Any, name: str | None) -> None:
    """Apply profile ``name`` (``--profile`` / ``REGISTRY_PROFILE``; None: the
    file's default one) of the config file to the command ``ctx`` runs.

    ``registry config ...`` may name a profile the file does not hold yet
    (``config set`` creates it).

    Raises:
        UsageError: the config file is unsafe or malformed; ``name`` is not one
            of its profiles; the token file cannot be read (pull/load only).
    """
    cfg = config.load()
    command = ctx.invoked_subcommand
    if command == "config":
        ctx.meta["registry.profile_name"] = name
        return
    selected = cfg.selected(name)
    values = config.settings(cfg, selected)
    ctx.meta[PROFILE_DEFAULTS] = {config.PARAMS[k]: v for k, v in values.items()
                                  if k in config.PARAMS}
    env = {var: values[key] for key, var in config.ENV_KEYS.items() if key in values}
    if "token_file" in values and command in _MIRROR_CLIENTS:
        if not os.environ.get("HF_TOKEN"):
            env["HF_TOKEN"] = config.read_token(values["token_file"])
    _set_env(ctx, env)


def _set_env(ctx: Any, env: dict[str, str]) -> None:
    """Set each unset variable of ``env`` until the command ends."""
    added = [var for var in env if not os.environ.get(var)]
    for var in added:
        os.environ[var] = env[var]

    def restore() -> None:
        for var in added:
            os.environ.pop(var, None)

    if added:
        ctx.call_on_close(restore)
