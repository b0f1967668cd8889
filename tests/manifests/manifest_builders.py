"""Builders for manifest tests: deterministic keys and sample documents (imported by tests;
the module name is unique so it cannot collide with other areas' helpers)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from manifests import (
    ROOT_PAYLOAD_TYPE,
    Artifact,
    Filters,
    Manifest,
    ModelEntry,
    Patch,
    PublicKey,
    Release,
    Role,
    Rollout,
    Root,
    ShadowThresholds,
    SigningKey,
    sign_envelope,
)

NOW = 1_800_000_000
DAY = 86_400


def key(n: int) -> SigningKey:
    """Key number n, the same in every run (seed = sha256 of a label)."""
    return SigningKey.from_seed(hashlib.sha256(f"test-key-{n}".encode()).digest())


def make_root(version: int, root_keys: Sequence[SigningKey], root_threshold: int,
              release_keys: Sequence[SigningKey], release_threshold: int = 1,
              expires: int = NOW + 365 * DAY) -> Root:
    keys = {k.keyid: PublicKey.ed25519(k.public_key) for k in [*root_keys, *release_keys]}
    return Root(
        version=version,
        expires=expires,
        keys=keys,
        roles={
            "root": Role([k.keyid for k in root_keys], root_threshold),
            "release": Role([k.keyid for k in release_keys], release_threshold),
        },
    )


def sign_root(root: Root, signers: Sequence[SigningKey]) -> bytes:
    return sign_envelope(root.to_bytes(), ROOT_PAYLOAD_TYPE, signers)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_release(version: str, share_ppm: int = 1_000_000, filters: Filters | None = None,
                 platforms: Sequence[str] = ("android", "ios")) -> Release:
    artifacts = [
        Artifact(
            platform=p, variant="fp16", format="onnx", url=f"https://cdn.example/{version}/{p}",
            length=1234, sha256=sha(f"{version}/{p}"),
            compile_settings={"opset": 18, "fp16": True, "quant": "none"},
            target={"runtime": "onnxruntime"},
            patches=[Patch(sha(f"old/{p}"), f"https://cdn.example/{version}/{p}.patch",
                           99, sha(f"patch/{version}/{p}"), "bsdiff4")],
        )
        for p in platforms
    ]
    rollout = Rollout(share_ppm=share_ppm, salt=f"salt-{version}", mode="shadow",
                      filters=filters or Filters(),
                      shadow=ShadowThresholds(max_kl_micro=50_000, max_latency_p99_us=20_000,
                                              min_samples=200))
    return Release(version=version, rollout=rollout, artifacts=artifacts)


def make_manifest(serial: int = 1, expires: int = NOW + DAY, channel: str = "prod",
                  releases: Sequence[Release] | None = None) -> Manifest:
    rels = list(releases) if releases is not None else [make_release("2.0", 100_000),
                                                         make_release("1.0")]
    return Manifest(channel=channel, serial=serial, expires=expires,
                    models={"detector": ModelEntry(rels)})


def manifest_json() -> dict[str, Any]:
    """A sample manifest as a mutable JSON object."""
    data: dict[str, Any] = json.loads(make_manifest().to_bytes())
    return data


def set_path(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation that sets (or, with value=KeyError, deletes) ``a/b/0/c`` in a JSON object."""
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node: Any = doc
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return mutate
