"""Make the patches a new artifact is published with: per base, the smallest verified one.

This module owns the policy: which bases (the last K published artifacts of the same model,
platform and variant, newest first — the caller passes them in that order), which algorithms
to try (bsdiff4 only up to a size cap: it needs ~18x the file in memory and minutes on large
files), verifying every candidate by applying it with the SDK's own ``apply_patch``, keeping
the smallest, and skipping a base when even that is not worth it (> ``max_ratio`` of the
full artifact). It runs in job workers, off the request path.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import bsdiff4

from client_sdk.patching import PatchError, apply_patch
from server.delta.errors import DeltaInputError
from server.delta.mfdelta1 import create_mfdelta1
from server.hashing import file_sha256

log = logging.getLogger(__name__)


def sha256_file(path: Path) -> str:
    return file_sha256(path)[0]

Creator = Callable[[Path, Path, Path, "DeltaPolicy"], None]


def _create_bsdiff4(base: Path, new: Path, out: Path, policy: DeltaPolicy) -> None:
    tmp = out.with_name(f".{out.name}.part")
    try:
        bsdiff4.file_diff(str(base), str(new), str(tmp))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _create_mfdelta1(base: Path, new: Path, out: Path, policy: DeltaPolicy) -> None:
    create_mfdelta1(base, new, out, level=policy.zstd_level)


CREATORS: Mapping[str, Creator] = {"mfdelta1": _create_mfdelta1, "bsdiff4": _create_bsdiff4}


@dataclass(frozen=True)
class DeltaPolicy:
    """Knobs of patch generation; the defaults are the publishing policy."""

    k: int = 3  # bases per new artifact: the last K published of the same model/platform/variant
    max_ratio: float = 0.6  # skip a base when its best patch is larger than this share of full
    algorithms: tuple[str, ...] = ("mfdelta1", "bsdiff4")
    # bsdiff4 holds ~18x the larger file in memory (3.5 GB at 200 MB) and takes minutes.
    bsdiff4_max_bytes: int = 64 * 1024 * 1024
    zstd_level: int = 3
    max_artifact_bytes: int = 16 * 1024**3  # refuse inputs above this outright
    creators: Mapping[str, Creator] = field(default_factory=lambda: dict(CREATORS))


@dataclass(frozen=True)
class PatchResult:
    """A verified patch file in the work directory, ready to upload and list in a manifest."""

    from_sha256: str
    algorithm: str
    path: Path
    length: int
    sha256: str


def _size(path: Path, what: str, policy: DeltaPolicy) -> int:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise DeltaInputError(f"{what} {path} cannot be read: {e}") from e
    if size > policy.max_artifact_bytes:
        raise DeltaInputError(
            f"{what} {path} is {size} bytes, above max_artifact_bytes="
            f"{policy.max_artifact_bytes}; raise the cap to diff it"
        )
    return size


def _verified(
    algorithm: str, base: Path, new: Path, new_sha256: str, patch: Path, new_size: int
) -> bool:
    check = patch.with_name(patch.name + ".verify")
    try:
        apply_patch(algorithm, base, patch, check, max_output=new_size)
        return sha256_file(check) == new_sha256
    except PatchError as e:
        log.warning("%s patch %s failed verification: %s", algorithm, patch, e)
        return False
    finally:
        check.unlink(missing_ok=True)


def choose_best(
    new: Path,
    base_sha256: str,
    base: Path,
    workdir: Path,
    policy: DeltaPolicy | None = None,
    *,
    new_sha256: str | None = None,
) -> PatchResult | None:
    """The smallest verified patch from ``base`` to ``new``, or None when none is worth it.

    Every algorithm in ``policy.algorithms`` that applies (bsdiff4 only when both files fit
    ``bsdiff4_max_bytes``) is created in ``workdir`` and verified by applying it with
    ``client_sdk.patching.apply_patch``; a candidate that fails verification is logged and
    dropped (that is a bug in the creator, and the artifact is still served in full).
    Losing candidates are deleted.

    Raises:
        DeltaInputError: a file is missing, too large, or ``base`` does not hash to
            ``base_sha256``.
    """
    policy = policy or DeltaPolicy()
    new_size = _size(new, "new artifact", policy)
    base_size = _size(base, "base artifact", policy)
    if sha256_file(base) != base_sha256:
        raise DeltaInputError(
            f"base artifact {base} does not hash to {base_sha256}; re-fetch it from the store"
        )
    new_sha256 = new_sha256 or sha256_file(new)
    workdir.mkdir(parents=True, exist_ok=True)
    best: PatchResult | None = None
    for algorithm in policy.algorithms:
        creator = policy.creators.get(algorithm)
        if creator is None:
            raise DeltaInputError(f"no patch creator for algorithm {algorithm!r}")
        if algorithm == "bsdiff4" and max(new_size, base_size) > policy.bsdiff4_max_bytes:
            log.info("bsdiff4 skipped for %s: larger than bsdiff4_max_bytes", new)
            continue
        path = workdir / f"{new_sha256[:16]}-from-{base_sha256[:16]}.{algorithm}"
        creator(base, new, path, policy)
        if not _verified(algorithm, base, new, new_sha256, path, new_size):
            path.unlink(missing_ok=True)
            continue
        candidate = PatchResult(base_sha256, algorithm, path, path.stat().st_size,
                                sha256_file(path))
        if best is None or candidate.length < best.length:
            if best is not None:
                best.path.unlink(missing_ok=True)
            best = candidate
        else:
            path.unlink(missing_ok=True)
    if best is not None and best.length > policy.max_ratio * new_size:
        log.info("no patch from %s: best is %d of %d bytes", base_sha256, best.length, new_size)
        best.path.unlink(missing_ok=True)
        return None
    return best


def make_patches(
    new: Path,
    bases: Sequence[tuple[str, Path]],
    workdir: Path,
    policy: DeltaPolicy | None = None,
) -> list[PatchResult]:
    """Patches to ``new`` from up to ``policy.k`` of ``bases`` ((sha256, path), newest first).

    Bases identical to ``new`` or repeated are skipped; a base without a worthwhile patch
    yields nothing. Raises ``DeltaInputError`` as :func:`choose_best` does.
    """
    policy = policy or DeltaPolicy()
    _size(new, "new artifact", policy)
    new_sha256 = sha256_file(new)
    results: list[PatchResult] = []
    seen = {new_sha256}
    for base_sha256, base_path in bases:
        if len(seen) > policy.k:
            break
        if base_sha256 in seen:
            continue
        seen.add(base_sha256)
        result = choose_best(new, base_sha256, base_path, workdir, policy, new_sha256=new_sha256)
        if result is not None:
            results.append(result)
    return results
