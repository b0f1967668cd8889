"""Signing key files and root versions on disk: `keys init` and `keys rotate`.

Layout under a keys directory (default DATA_DIR/keys, MODELFLEET_KEYS_DIR overrides):

    release.key              the online release key the server signs manifests with
    root-<keyid16>.key       offline root keys: move them off the server after `keys init`,
                             bring a threshold of them back only to rotate
    retired/                 release keys replaced by a rotation (kept, never used to sign)

and every signed root version as DATA_DIR/roots/<version>.json (the exact envelope bytes; the
server imports them into its database and serves them at /v1/root/<version>.json).

Every key file is JSON {"role", "keytype", "keyid", "seed_hex"}, created with mode 0600 and
refused when group or others can read it (server/publish/keyfile.py reads and writes them).
Files are written to a temporary name and renamed, so a crash leaves either the old state or
the new one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import manifests
from manifests import Root, SigningKey
from server import crashpoints
from server.publish.errors import KeyStoreError, RotationError
from server.publish.keyfile import key_file_bytes, load_release_key, load_root_keys, write_atomic
from server.publish.roots import (
    ROOT_LIFETIME_SECONDS,
    build_root,
    root_signers_for_rotation,
    sign_root,
)

ROOT_FILE_MAX_BYTES = 1 << 20
RELEASE_KEY_FILE = "release.key"


@dataclass(frozen=True)
class KeyPaths:
    """Where keys and signed roots live for one server data directory."""

    keys_dir: Path
    roots_dir: Path

    @classmethod
    def for_data_dir(cls, data_dir: Path, keys_dir: Path | None = None) -> KeyPaths:
        """`keys_dir` (Settings.keys_dir, i.e. MODELFLEET_KEYS_DIR) or DATA_DIR/keys."""
        return cls(keys_dir=keys_dir or data_dir / "keys", roots_dir=data_dir / "roots")

    @property
    def release_key_path(self) -> Path:
        return self.keys_dir / RELEASE_KEY_FILE

    def root_key_path(self, key: SigningKey) -> Path:
        return self.keys_dir / f"root-{key.keyid[:16]}.key"

    def root_path(self, version: int) -> Path:
        return self.roots_dir / f"{version}.json"


def root_versions(paths: KeyPaths) -> list[int]:
    """The root versions present on disk, ascending."""
    if not paths.roots_dir.is_dir():
        return []
    return sorted(int(p.stem) for p in paths.roots_dir.glob("*.json") if p.stem.isdigit())


def read_root_bytes(paths: KeyPaths, version: int) -> bytes:
    path = paths.root_path(version)
    data = path.read_bytes()
    if len(data) > ROOT_FILE_MAX_BYTES:
        raise KeyStoreError(f"{path} is larger than {ROOT_FILE_MAX_BYTES} bytes")
    return data


def load_root_chain(paths: KeyPaths) -> list[tuple[Root, bytes]]:
    """Every root on disk, each verified against the previous one (v1 against itself)."""
    versions = root_versions(paths)
    if not versions:
        raise KeyStoreError(
            f"no signed root in {paths.roots_dir}; run `modelfleet keys init --data-dir DIR`"
        )
    if versions != list(range(1, len(versions) + 1)):
        raise KeyStoreError(f"root versions in {paths.roots_dir} are not 1..N: {versions}")
    chain: list[tuple[Root, bytes]] = []
    for version in versions:
        data = read_root_bytes(paths, version)
        try:
            root = (
                manifests.load_trusted_root(data)
                if version == 1
                else manifests.verify_root_update(chain[-1][0], data)
            )
        except manifests.ManifestError as e:
            raise KeyStoreError(f"{paths.root_path(version)} does not verify: {e}") from e
        chain.append((root, data))
    return chain


@dataclass(frozen=True)
class KeysResult:
    """What `init_keys` / `rotate_root` produced, for the CLI to report."""

    root: Root
    root_bytes: bytes
    root_path: Path
    release_keyid: str
    new_root_key_paths: list[Path]


def init_keys(
    paths: KeyPaths, *, now: int, root_keys: int = 3, threshold: int = 2,
    root_lifetime: int = ROOT_LIFETIME_SECONDS,
) -> KeysResult:
    """Create the root keys, the release key and root v1; refuse to overwrite existing ones."""
    if paths.release_key_path.exists() or root_versions(paths):
        raise KeyStoreError(
            f"keys already exist ({paths.release_key_path} or {paths.roots_dir}/1.json); "
            f"use `modelfleet keys rotate` to change them"
        )
    roots = [SigningKey.generate() for _ in range(root_keys)]
    release = SigningKey.generate()
    paths.keys_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    root = build_root(
        version=1, expires=now + root_lifetime, root_keys=roots, root_threshold=threshold,
        release_keys=[release],
    )
    data = sign_root(root, roots)
    manifests.load_trusted_root(data, now)  # prove it verifies before anything is written
    written = []
    for key in roots:
        write_atomic(paths.root_key_path(key), key_file_bytes("root", key), 0o600)
        written.append(paths.root_key_path(key))
    write_atomic(paths.release_key_path, key_file_bytes("release", release), 0o600)
    # The root file goes last: its presence is what marks the init as complete.
    write_atomic(paths.root_path(1), data, 0o644)
    return KeysResult(root, data, paths.root_path(1), release.keyid, written)


NEXT_RELEASE_KEY_FILE = "release-next.key"


def finish_interrupted_rotation(paths: KeyPaths) -> str | None:
    """Repair a `keys rotate --rotate-release` that died between writing root N+1 and moving
    the new release key into place (docs/architecture.md, "Crashes, step by step"): root N+1
    trusts only the new key, so the server must sign with it — the move is completed. A
    `release-next.key` that the newest root does not name is from a rotation that died
    before its root was written: it is removed (the rotation never happened). Returns what
    it did, or None when there was nothing to repair."""
    pending = paths.keys_dir / NEXT_RELEASE_KEY_FILE
    if not pending.exists():
        return None
    versions = root_versions(paths)
    newest = manifests.load_trusted_root(read_root_bytes(paths, versions[-1])) \
        if versions else None
    key = load_release_key(pending)
    try:
        if newest is not None and key.keyid in newest.roles["release"].keyids:
            os.replace(pending, paths.release_key_path)
            return f"completed the rotation to root v{newest.version}'s release key"
        pending.unlink()
    except FileNotFoundError:  # another process starting at once repaired it first
        return None
    return "removed the release key of a rotation that never wrote its root"


def rotate_root(
    paths: KeyPaths, *, now: int, root_keys_dir: Path | None = None,
    new_root_keys: int | None = None, threshold: int | None = None,
    rotate_release: bool = False, root_lifetime: int = ROOT_LIFETIME_SECONDS,
) -> KeysResult:
    """Make root N+1 with fresh root keys (and optionally a fresh release key).

    Signed by a threshold of root N's keys (found in `root_keys_dir`, default the keys
    directory) and by all the new root keys, and checked with manifests.verify_root_update
    before anything is written. The previous release key is moved to retired/ when replaced.
    """
    finish_interrupted_rotation(paths)
    chain = load_root_chain(paths)
    old, _ = chain[-1]
    old_signers = root_signers_for_rotation(
        old, load_root_keys(root_keys_dir or paths.keys_dir)
    )
    count = new_root_keys or len(old.roles["root"].keyids)
    new_roots = [SigningKey.generate() for _ in range(count)]
    current_release = load_release_key(paths.release_key_path)
    release = SigningKey.generate() if rotate_release else current_release
    root = build_root(
        version=old.version + 1, expires=now + root_lifetime, root_keys=new_roots,
        root_threshold=threshold or min(old.roles["root"].threshold, count),
        release_keys=[release],
    )
    data = sign_root(root, [*old_signers, *new_roots])
    try:
        manifests.verify_root_update(old, data)
    except manifests.ManifestError as e:  # a bug here must never reach devices
        raise RotationError(
            f"root v{root.version} would not verify against v{old.version}: {e}"
        ) from e
    written = []
    for key in new_roots:
        write_atomic(paths.root_key_path(key), key_file_bytes("root", key), 0o600)
        written.append(paths.root_key_path(key))
    next_release = paths.keys_dir / NEXT_RELEASE_KEY_FILE
    if rotate_release:
        write_atomic(next_release, key_file_bytes("release", release), 0o600)
        retired = paths.keys_dir / "retired" / f"release-{current_release.keyid[:16]}.key"
        retired.parent.mkdir(mode=0o700, exist_ok=True)
        write_atomic(retired, key_file_bytes("release", current_release), 0o600)
    write_atomic(paths.root_path(root.version), data, 0o644)
    crashpoints.reached("rotate.root_written")
    if rotate_release:
        os.replace(next_release, paths.release_key_path)
        crashpoints.reached("rotate.release_replaced")
    return KeysResult(root, data, paths.root_path(root.version), release.keyid, written)
