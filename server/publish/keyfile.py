"""One signing key file on disk: its format, reading it safely, writing it atomically.

Every key file is JSON {"role", "keytype", "keyid", "seed_hex"}, mode 0600, refused when group
or others can read it. Apart from the key ceremony (keys.py: `keys init` / `keys rotate`,
which build and sign roots) so the release signer (signer.py) reads the key without
importing the ceremony, which signs roots through the signer.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from manifests import SigningKey
from server.publish.errors import KeyStoreError

KEY_FILE_MAX_BYTES = 4096


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to `path` via a temp file + os.replace, created with `mode` from the start."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def key_file_bytes(role: str, key: SigningKey) -> bytes:
    """The bytes of a key file holding `key` for `role` ("root" or "release")."""
    doc = {"role": role, "keytype": "ed25519", "keyid": key.keyid, "seed_hex": key.seed.hex()}
    return json.dumps(doc, indent=1).encode() + b"\n"


def read_key_file(path: Path) -> tuple[str, SigningKey]:
    """(role, key) from a key file; KeyStoreError if missing, too open, or malformed."""
    try:
        st = path.stat()
    except FileNotFoundError as e:
        raise KeyStoreError(
            f"key file {path} does not exist; run `modelfleet keys init --data-dir DIR` or set "
            f"MODELFLEET_KEYS_DIR to the directory holding the keys"
        ) from e
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyStoreError(
            f"key file {path} is accessible by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}); run `chmod 600 {path}`"
        )
    if st.st_size > KEY_FILE_MAX_BYTES:
        raise KeyStoreError(f"key file {path} is {st.st_size} bytes, not a ModelFleet key file")
    try:
        doc = json.loads(path.read_bytes())
        role, keytype, seed_hex = doc["role"], doc["keytype"], doc["seed_hex"]
        if keytype != "ed25519" or role not in ("root", "release"):
            raise ValueError(f"unsupported role/keytype {role}/{keytype}")
        key = SigningKey.from_seed(bytes.fromhex(seed_hex))
    except (ValueError, KeyError, TypeError) as e:
        raise KeyStoreError(f"key file {path} is malformed ({e}); restore it from backup") from e
    if doc.get("keyid") not in (None, key.keyid):
        raise KeyStoreError(f"key file {path}: keyid does not match its seed; file is corrupt")
    return role, key


def load_release_key(path: Path) -> SigningKey:
    """The online release key; KeyStoreError if it is missing, too open, or not a release key."""
    role, key = read_key_file(path)
    if role != "release":
        raise KeyStoreError(f"{path} holds a {role} key, not the release key")
    return key


def load_root_keys(directory: Path) -> list[SigningKey]:
    """Every root key file (root-*.key) found in `directory`."""
    keys = []
    for path in sorted(directory.glob("root-*.key")):
        role, key = read_key_file(path)
        if role == "root":
            keys.append(key)
    return keys
