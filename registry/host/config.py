"""The config file: named profiles of settings (store, index, trusted keys,
token file, S3 endpoint...), TOML, read with :mod:`tomllib`.

Where: ``$REGISTRY_CONFIG`` if set, else ``$XDG_CONFIG_HOME/registry/config.toml``,
else ``~/.config/registry/config.toml``. What::

    default_profile = "dev"          # optional: the profile used when none is named

    [profile.dev]
    store = "s3://registry/artifacts"
    db = "postgresql+psycopg://registry@127.0.0.1:5432/registry"
    trusted_keys = "~/.config/registry/keys"
    token_file = "~/.config/registry/token"   # a path: the token itself is never here
    s3_endpoint = "http://127.0.0.1:9000"
    s3_region = "us-east-1"

Which profile: the one named by ``--profile`` / ``REGISTRY_PROFILE``, else
``default_profile``, else one named ``default``, else none. A setting's value
is, in order: the command's flag, its environment variable, the profile, the
built-in default (docs/configuration.md#the-config-file).

Secrets are referenced, never held: ``token_file`` names a file, and a key
such as ``token`` or ``password`` is refused. The file is written ``0600``
(its folder ``0700``), atomically (a temporary file renamed over it); a file
writable by another user, or owned by one, is refused in one line.

May import: the standard library, registry.errors.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field

from registry.errors import UnsafeFileModeError, UsageError

ENV_FILE = "REGISTRY_CONFIG"
ENV_PROFILE = "REGISTRY_PROFILE"

#: key -> (what it sets, the environment variable that overrides it)
KEYS: dict[str, tuple[str, str]] = {
    "store": ("--store", "REGISTRY_STORE"),
    "db": ("--db", "REGISTRY_DB"),
    "trusted_keys": ("--trusted-keys", "REGISTRY_TRUSTED_KEYS"),
    "trusted_cas": ("--trusted-cas", "REGISTRY_TRUSTED_CAS"),
    "cache": ("--cache", "REGISTRY_CACHE"),
    "mirror": ("pull/load --from", "REGISTRY_MIRROR"),
    "token_file": ("serve --token-file; the token pull --from sends", "HF_TOKEN"),
    "s3_endpoint": ("the S3 endpoint", "AWS_ENDPOINT_URL"),
    "s3_region": ("the S3 region", "AWS_DEFAULT_REGION"),
    "aws_profile": ("the AWS credentials profile", "AWS_PROFILE"),
}
#: keys whose value is a local path (``~`` expanded)
PATH_KEYS = frozenset({"trusted_keys", "trusted_cas", "cache", "token_file"})
#: keys that set an environment variable for the command, unless it is set
ENV_KEYS = {"s3_endpoint": "AWS_ENDPOINT_URL", "s3_region": "AWS_DEFAULT_REGION",
            "aws_profile": "AWS_PROFILE"}
#: key -> the name of the command-line parameter a profile gives a default
PARAMS = {"store": "store", "db": "db", "trusted_keys": "trusted_keys",
          "trusted_cas": "trusted_cas", "cache": "cache", "mirror": "mirror",
          "token_file": "token_file"}
_SECRET = re.compile(r"(token|password|passwd|secret|credential|access_key|api_key)$")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass
class Config:
    """The parsed file: ``profiles[name][key] = value`` (all strings)."""

    path: str
    default_profile: str | None = None
    profiles: dict[str, dict[str, str]] = field(default_factory=dict)

    def selected(self, name: str | None) -> str | None:
        """The profile a command uses: ``name`` (from ``--profile`` /
        ``REGISTRY_PROFILE``), else ``default_profile``, else ``default`` if
        there is one, else None.

        Raises:
            UsageError: ``name`` (or ``default_profile``) names no profile of the file.
        """
        chosen = name or self.default_profile
        if chosen is None:
            return "default" if "default" in self.profiles else None
        if chosen not in self.profiles:
            known = ", ".join(sorted(self.profiles)) or "none"
            raise UsageError(f"{self.path}: no profile {chosen!r} (profiles: {known})")
        return chosen


def config_path() -> str:
    """The config file's path (it may not exist): see the module doc."""
    explicit = os.environ.get(ENV_FILE)
    if explicit:
        return os.path.expanduser(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "registry", "config.toml")


def check_key(key: str) -> None:
    """Raises UsageError unless ``key`` is a setting a profile may hold."""
    if key in KEYS:
        return
    if _SECRET.search(key):
        raise UsageError(f"config key {key!r}: secrets go by file reference "
                         "(token_file = PATH), never inline in the config file")
    raise UsageError(f"config key {key!r}: unknown (known: {', '.join(KEYS)})")


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise UsageError(f"profile {name!r}: use 1-64 letters, digits, '-' or '_'")


def _check_file(path: str, st: os.stat_result) -> None:
    if st.st_uid not in (os.getuid(), 0):
        raise UnsafeFileModeError(f"{path}: owned by uid {st.st_uid}, not by this user: refused "
                         "(another user could choose the store and keys you trust)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeFileModeError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets other users "
                         f"write it: refused (chmod 600 {path})")


def load(path: str | None = None) -> Config:
    """The config at ``path`` (default :func:`config_path`); an empty Config
    when there is no file.

    Raises:
        UsageError: the file is writable by another user or owned by one, is
            not TOML, or holds an unknown key, an inline secret, a value that
            is not a string, or a bad profile name (one line naming the file).
    """
    path = path or config_path()
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return Config(path)
    except OSError as e:
        raise UsageError(f"{path}: cannot read the config file ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        _check_file(path, os.fstat(f.fileno()))
        raw = f.read(1 << 20)
    import tomllib  # only when there is a file to read

    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not a TOML config file ({e})") from None
    return _parse(path, doc)


def _parse(path: str, doc: Mapping[str, object]) -> Config:
    cfg = Config(path)
    for top, value in doc.items():
        if top == "default_profile" and isinstance(value, str):
            cfg.default_profile = value
        elif top == "profile" and isinstance(value, dict):
            for name, table in value.items():
                if not isinstance(table, dict):
                    raise UsageError(f"{path}: profile.{name} is not a table")
                _check_name(name)
                cfg.profiles[name] = {}
                for key, v in table.items():
                    try:
                        check_key(key)
                    except UsageError as e:
                        raise UsageError(f"{path}: [profile.{name}] {e}") from None
                    if not isinstance(v, str):
                        raise UsageError(f"{path}: [profile.{name}] {key}: give a string")
                    cfg.profiles[name][key] = v
        else:
            raise UsageError(f"{path}: unknown entry {top!r} (the file holds "
                             "default_profile and [profile.NAME] tables)")
    return cfg


def dumps(cfg: Config) -> str:
    """The TOML text of ``cfg`` (flat string tables; :func:`load` reads it back
    to an equal Config)."""
    lines = ["# registry config: see docs/configuration.md#the-config-file", ""]
    if cfg.default_profile is not None:
        lines += [f"default_profile = {_string(cfg.default_profile)}", ""]
    for name in sorted(cfg.profiles):
        _check_name(name)
        lines.append(f"[profile.{name}]")
        lines += [f"{key} = {_string(v)}" for key, v in sorted(cfg.profiles[name].items())]
        lines.append("")
    return "\n".join(lines)


def dumps_value(value: str) -> str:
    """``value`` as a TOML string (how ``config show`` prints it)."""
    return _string(value)


def _string(value: str) -> str:
    # JSON's escapes (\" \\ \n \t \uXXXX...) are all TOML basic-string escapes
    return json.dumps(value, ensure_ascii=False)


def save(cfg: Config) -> None:
    """Write ``cfg`` to ``cfg.path``: mode 0600, atomically (a temporary file
    in the same folder, renamed over it); the folder is created 0700.

    Raises:
        UsageError: the existing file is writable by another user or owned by
            one; the folder cannot be written.
    """
    folder = os.path.dirname(os.path.abspath(cfg.path))
    try:
        _check_file(cfg.path, os.stat(cfg.path))
    except FileNotFoundError:
        pass
    tmp = os.path.join(folder, f".{os.path.basename(cfg.path)}.tmp-{os.getpid()}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)  # whatever the umask
            f.write(dumps(cfg))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, cfg.path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise UsageError(f"{cfg.path}: cannot write the config file ({e.strerror})") from None


def set_value(cfg: Config, profile: str, key: str, value: str) -> None:
    """Set ``key`` of ``profile`` (created if new) to ``value``; an empty
    ``value`` removes the key. In memory: :func:`save` writes it.

    Raises:
        UsageError: unknown key, inline secret, bad profile name.
    """
    check_key(key)
    _check_name(profile)
    table = cfg.profiles.setdefault(profile, {})
    if value == "":
        table.pop(key, None)
    else:
        table[key] = value


def settings(cfg: Config, profile: str | None) -> dict[str, str]:
    """The settings of ``profile`` (none when None), paths ``~``-expanded."""
    table = cfg.profiles.get(profile, {}) if profile else {}
    return {k: os.path.expanduser(v) if k in PATH_KEYS else v for k, v in table.items()}


def read_token(path: str) -> str:
    """The token in the file ``path`` (its first line, stripped).

    Raises:
        UsageError: the file cannot be read, or its first line is empty.
    """
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline(64 * 1024).strip()
    except OSError as e:
        raise UsageError(f"token_file {path}: cannot read it ({e.strerror})") from None
    if not line:
        raise UsageError(f"token_file {path}: holds no token (the first line is empty)")
    return line
