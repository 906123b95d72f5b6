"""``registry config show`` / ``set``: the config file and its profiles."""

from __future__ import annotations

from registry.cli.app import RegistryTyper, app

config_app = RegistryTyper(help="The config file and its profiles (store, index, trusted keys, "
                                "token file).", no_args_is_help=True)
app.add_typer(config_app, name="config")
