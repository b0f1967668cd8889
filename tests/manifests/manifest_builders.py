"""Builders for manifest tests: numbered keys and sample documents (keys and roots come from
tests.support.signing, the one root builder)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from manifests import (
    Artifact,
    Filters,
    Manifest,
    ModelEntry,
    Patch,
    Release,
    Rollout,
    ShadowThresholds,
    SigningKey,
)
from tests.support.signing import DAY, NOW, seeded_key


def key(n: int) -> SigningKey:
    """Key number n, the same in every run."""
    return seeded_key(f"test-key-{n}")


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
