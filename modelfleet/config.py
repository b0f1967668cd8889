"""Where the CLI finds its server and token: flag, then environment (`MODELFLEET_SERVER`,
`MODELFLEET_TOKEN`), then the config file `modelfleet login` writes, then the local default.

The file is JSON at $MODELFLEET_CONFIG, else $XDG_CONFIG_HOME/modelfleet/config.json, else
~/.config/modelfleet/config.json; it holds a secret, so it is written with mode 0600.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SERVER = "http://127.0.0.1:8000"
SERVER_ENV = "MODELFLEET_SERVER"
TOKEN_ENV = "MODELFLEET_TOKEN"  # noqa: S105 - the variable's name, not a secret
CONFIG_ENV = "MODELFLEET_CONFIG"


class ConfigError(Exception):
    """The config file exists but cannot be read; the message says which and how to fix."""


@dataclass(frozen=True)
class Target:
    server: str
    token: str | None


def config_path() -> Path:
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "modelfleet" / "config.json"


def load() -> dict[str, str]:
    path = config_path()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}; run `modelfleet login` again "
                          f"or delete it") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} is not a JSON object; run `modelfleet login` again")
    return {k: v for k, v in doc.items() if isinstance(k, str) and isinstance(v, str)}


def save(server: str, token: str) -> Path:
    """Write the config file (0600, replacing any earlier one atomically)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"server": server, "token": token}, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o600)  # a umask cannot widen it, but an existing tmp file kept its mode
    os.replace(tmp, path)
    return path


def resolve(server: str | None, token: str | None) -> Target:
    """Flags win over the environment, which wins over the config file. The stored token is
    only sent to the server it was stored for (never to another --server)."""
    server = server or os.environ.get(SERVER_ENV) or None
    token = token or os.environ.get(TOKEN_ENV) or None
    if server is None or token is None:
        stored = load()
        stored_server = stored.get("server", "").rstrip("/")
        server = server or stored_server or DEFAULT_SERVER
        if token is None and stored_server == server.rstrip("/"):
            token = stored.get("token")
    server = (server or DEFAULT_SERVER).rstrip("/")
    if not server.startswith(("http://", "https://")):
        raise ConfigError(f"server {server!r} is not an http:// or https:// URL; pass e.g. "
                          "--server http://127.0.0.1:8000")
    return Target(server=server, token=token)


def mask(token: str) -> str:
    """Enough of a token to recognise it (its public prefix), never the secret part."""
    return token[:8] + "…" if len(token) > 12 else "…"
