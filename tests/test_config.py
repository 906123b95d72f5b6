"""The config file and its profiles (issue 44 item 5; registry.host.config,
docs/configuration.md#the-config-file): where it is, what it may hold, how it
is written, and the order a setting is taken in: flag > environment variable >
profile > built-in default. Commands run in real processes.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from registry.host import config
from registry.errors import UnsafeFileModeError, UsageError
from tests.conftest import REPO, run_cli
from tests.support.s3server import S3Server


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"REGISTRY_CONFIG": str(tmp_path / "cfg" / "config.toml"), **extra}


def _set(tmp_path: Path, *args: str, **env: str) -> None:
    r = run_cli("config", "set", *args, env=_env(tmp_path, **env), cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def _index_named(tmp_path: Path, *args: str, **env: str) -> str:
    """The index ``registry ARGS... ls`` used (an empty one names itself on
    stderr); an ARG after ``--`` goes after ``ls``."""
    if "--" in args:
        i = args.index("--")
        args = (*args[:i], "ls", *args[i + 1:])
    else:
        args = (*args, "ls")
    full = {k: v for k, v in os.environ.items() if k != "REGISTRY_DB"}
    full.update(_env(tmp_path, **env))
    r = subprocess.run([sys.executable, "-m", "registry", *args], capture_output=True,
                       text=True, env={**full, "PYTHONPATH": str(REPO)}, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("no model in the index "), r.stderr
    return r.stderr.strip().rsplit("/", 1)[-1]


def test_precedence_flag_env_profile_default(tmp_path: Path) -> None:
    assert _index_named(tmp_path) == "registry.db"  # no file: the built-in default
    _set(tmp_path, "db", f"sqlite:///{tmp_path}/profile.db")
    assert _index_named(tmp_path) == "profile.db"
    env = f"sqlite:///{tmp_path}/env.db"
    assert _index_named(tmp_path, REGISTRY_DB=env) == "env.db"
    flag = f"sqlite:///{tmp_path}/flag.db"
    assert _index_named(tmp_path, "--", "--db", flag, REGISTRY_DB=env) == "flag.db"


def test_profile_is_chosen_by_flag_env_default_profile(tmp_path: Path) -> None:
    _set(tmp_path, "db", f"sqlite:///{tmp_path}/dev.db", "--profile", "dev")
    _set(tmp_path, "db", f"sqlite:///{tmp_path}/prod.db", "--profile", "prod")
    assert _index_named(tmp_path) == "registry.db"  # no default profile: none applies
    assert _index_named(tmp_path, "--profile", "dev") == "dev.db"
    assert _index_named(tmp_path, REGISTRY_PROFILE="prod") == "prod.db"
    assert _index_named(tmp_path, "--profile", "dev", REGISTRY_PROFILE="prod") == "dev.db"
    _set(tmp_path, "db", f"sqlite:///{tmp_path}/default.db")  # the profile named default
    assert _index_named(tmp_path) == "default.db"
    cfg = config.load(str(tmp_path / "cfg" / "config.toml"))
    cfg.default_profile = "prod"
    config.save(cfg)
    assert _index_named(tmp_path) == "prod.db"


def test_unknown_profile_is_one_line(tmp_path: Path) -> None:
    _set(tmp_path, "db", f"sqlite:///{tmp_path}/dev.db", "--profile", "dev")
    r = run_cli("--profile", "nope", "ls", env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "no profile 'nope' (profiles: dev)" in r.stderr


def test_file_is_private_and_round_trips(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = tmp_path / "cfg" / "sub" / "config.toml"
        cfg = config.Config(str(path))
        odd = 'a "quoted" back\\slash, tab\t, newline\n, ünïcode'
        config.set_value(cfg, "p-1", "store", odd)
        config.set_value(cfg, "p_2", "token_file", "~/tok")
        config.save(cfg)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    back = config.load(str(path))
    assert back.profiles == {"p-1": {"store": odd}, "p_2": {"token_file": "~/tok"}}
    assert config.settings(back, "p_2")["token_file"] == os.path.expanduser("~/tok")
    config.set_value(back, "p-1", "store", "")  # '' removes the key
    assert back.profiles["p-1"] == {}


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_file_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    _set(tmp_path, "db", "sqlite:///x.db")
    path = tmp_path / "cfg" / "config.toml"
    path.chmod(mode)
    with pytest.raises(UnsafeFileModeError, match="lets other users write it"):
        config.load(str(path))
    r = run_cli("ls", env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert str(path) in r.stderr and f"{mode:04o}" in r.stderr and "chmod 600" in r.stderr
    r = run_cli("config", "set", "db", "sqlite:///y.db", env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "lets other users write it" in r.stderr


@pytest.mark.parametrize("key", ["token", "password", "aws_secret_access_key", "api_key"])
def test_inline_secrets_are_refused(tmp_path: Path, key: str) -> None:
    r = run_cli("config", "set", key, "s3cr3t", env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "token_file = PATH" in r.stderr and "s3cr3t" not in r.stderr
    assert not (tmp_path / "cfg" / "config.toml").exists()
    path = tmp_path / "hand.toml"
    path.write_text(f'[profile.x]\n{key} = "s3cr3t"\n')
    path.chmod(0o600)
    with pytest.raises(UsageError, match="secrets go by file reference"):
        config.load(str(path))


def test_malformed_files_are_one_line(tmp_path: Path) -> None:
    for text, words in [("[profile.x\n", "not a TOML config file"),
                        ('[profile.x]\ncolour = "red"\n', "'colour': unknown"),
                        ("[profile.x]\nstore = 3\n", "store: give a string"),
                        ('store = "top"\n', "unknown entry 'store'")]:
        path = tmp_path / "c.toml"
        path.write_text(text)
        path.chmod(0o600)
        with pytest.raises(UsageError, match=words):
            config.load(str(path))


def test_show_prints_the_token_reference_never_the_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t-token\n")
    _set(tmp_path, "token_file", str(token))
    _set(tmp_path, "store", str(tmp_path / "store"))
    for args in (["config", "show"], ["config", "show", "--json"]):
        r = run_cli(*args, env=_env(tmp_path, REGISTRY_STORE="/elsewhere"), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert str(token) in r.stdout and "s3cr3t" not in r.stdout + r.stderr
        assert "REGISTRY_STORE" in r.stdout  # the variable that wins over the profile


def test_path_follows_registry_config_then_xdg(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("REGISTRY_CONFIG", str(tmp_path / "explicit.toml"))
    assert config.config_path() == str(tmp_path / "explicit.toml")
    monkeypatch.delenv("REGISTRY_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config.config_path() == str(tmp_path / "xdg" / "registry" / "config.toml")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config.config_path() == str(tmp_path / "home" / ".config" / "registry"
                                       / "config.toml")


def test_profile_s3_endpoint_reaches_the_store(tmp_path: Path, s3_server: S3Server,
                                               s3_bucket: str) -> None:
    """A profile with store, S3 endpoint and region is all a shell needs
    (credentials here still from AWS_*: a profile names an AWS profile, never a key)."""
    _set(tmp_path, "store", f"s3://{s3_bucket}/artifacts")
    _set(tmp_path, "s3_endpoint", s3_server.endpoint)
    _set(tmp_path, "s3_region", "us-east-1")
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_ENDPOINT_URL", "REGISTRY_STORE", "AWS_DEFAULT_REGION")}
    env.update(_env(tmp_path), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "registry", "ledger", "ls"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "no data source is revoked" in r.stderr
    # without the profile's endpoint the same store is not reached on moto
    env["REGISTRY_CONFIG"] = str(tmp_path / "none.toml")
    r = subprocess.run([sys.executable, "-m", "registry", "ledger", "ls", "--store",
                        f"s3://{s3_bucket}/artifacts"], capture_output=True, text=True,
                       env={**env, "AWS_EC2_METADATA_DISABLED": "true",
                            "REGISTRY_S3_ATTEMPTS": "1"}, cwd=tmp_path, timeout=300)
    assert r.returncode != 0
