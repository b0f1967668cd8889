"""The crash-safe bundle store: versioned bundle directories, an atomic pointer and a journal.

Layout under ``<data_dir>/models/<model>/``::

    bundles/<bundle_id>/bundle.json    what the bundle holds (members with sha256 and length)
    bundles/<bundle_id>/<member files> the verified artifacts; compiled/ holds on-device builds
    tmp/                               bundles being written (deleted on recovery)
    pointer.json                       {"active", "previous", "candidate"}; replaced atomically
    journal.json                       the activation in progress, if any

A bundle is written under ``tmp/``, fsynced, then renamed into ``bundles/`` (atomic). Activation
writes the journal, then the pointer (``os.replace``), then clears the journal and deletes
bundles that are neither active nor previous. ``recover`` runs on every open: it removes
``tmp/``, finishes an activation whose target verifies (else keeps the old pointer), and
hash-verifies the active bundle, falling back to the previous one. So a process killed at any
step restarts with exactly the old or exactly the new bundle. ``fault_hook(step)`` is called at
each step in ``STEPS`` (tests SIGKILL the process there).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client_sdk.errors import InstallError
from client_sdk.fsutil import (
    atomic_write_json,
    check_name,
    fsync_dir,
    fsync_file,
    remove_tree,
    sha256_file,
)

STEPS = (
    "stage_begin",
    "stage_files_written",
    "stage_compiled",
    "stage_fsynced",
    "stage_renamed",
    "journal_written",
    "pointer_written",
    "journal_cleared",
    "gc_done",
)

FaultHook = Callable[[str], None]


# Role prefix of the members holding the model at other input-shape variants.
SHAPE_ROLE_PREFIX = "shape:"


@dataclass(frozen=True)
class Member:
    """One artifact file in a bundle; ``role`` is "primary", "fallback" (CPU ONNX) or
    ``shape:<variant>`` (the same model compiled for another input-shape variant)."""

    role: str
    format: str
    platform: str
    variant: str
    file: str
    sha256: str
    length: int
    target: dict[str, str] = field(default_factory=dict)
    compile_settings: dict[str, Any] = field(default_factory=dict)
    # A protected release's member (client_sdk/protection.py): the file is sealed under its
    # content key, which is recorded here wrapped under the device-local key (hex).
    wrapped_key: str | None = None
    # When the sealed file is the device's own (a patch's result) rather than the served
    # bytes: its sha256 and length (``sha256``/``length`` stay the signed ones).
    local_sha256: str | None = None
    local_length: int | None = None

    @property
    def at_rest(self) -> bool:
        """Sealed on disk (protected): decrypted into memory to load, never compiled."""
        return self.wrapped_key is not None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "role": self.role, "format": self.format, "platform": self.platform,
            "variant": self.variant, "file": self.file, "sha256": self.sha256,
            "length": self.length, "target": self.target,
            "compile_settings": self.compile_settings,
        }
        if self.wrapped_key is not None:
            d["wrapped_key"] = self.wrapped_key
        if self.local_sha256 is not None:
            d["local_sha256"], d["local_length"] = self.local_sha256, self.local_length
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Member:
        file = str(d["file"])
        check_name("member file", file)
        return Member(
            role=str(d["role"]), format=str(d["format"]), platform=str(d["platform"]),
            variant=str(d["variant"]), file=file, sha256=str(d["sha256"]),
            length=int(d["length"]), target=dict(d.get("target", {})),
            compile_settings=dict(d.get("compile_settings", {})),
            wrapped_key=None if d.get("wrapped_key") is None else str(d["wrapped_key"]),
            local_sha256=None if d.get("local_sha256") is None else str(d["local_sha256"]),
            local_length=None if d.get("local_length") is None else int(d["local_length"]),
        )


@dataclass(frozen=True)
class Bundle:
    """A bundle on disk: one release of one model for this device."""

    model: str
    version: str
    bundle_id: str
    members: tuple[Member, ...]
    path: Path

    @property
    def sha256(self) -> str:
        """The primary artifact's sha256 (what the device reports as active)."""
        return self.members[0].sha256

    def member_path(self, member: Member) -> Path:
        return self.path / member.file


@dataclass(frozen=True)
class Pointer:
    """Which bundles of one model are active, kept for rollback, and staged as a candidate
    (a shadow-mode release running beside the active one)."""

    active: str | None = None
    previous: str | None = None
    candidate: str | None = None

    def kept(self) -> set[str]:
        return {b for b in (self.active, self.previous, self.candidate) if b}


def data_dir_of(bundle: Bundle) -> Path:
    """The device data directory a bundle lives in (``<data_dir>/models/<m>/bundles/<id>``)."""
    return bundle.path.parents[3]


def bundle_id_for(model: str, version: str, members: Sequence[Member]) -> str:
    ident = json.dumps([model, version, [(m.role, m.sha256) for m in members]])
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


class BundleStore:
    """Bundles of every model under ``<data_dir>/models``."""

    def __init__(self, data_dir: Path, fault_hook: FaultHook | None = None) -> None:
        self.root = data_dir / "models"
        self._hook = fault_hook

    def _step(self, name: str) -> None:
        if self._hook is not None:
            self._hook(name)

    def model_dir(self, model: str) -> Path:
        return self.root / check_name("model", model)

    def models(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "pointer.json").exists())

    # -- reading -------------------------------------------------------------------------

    def pointer(self, model: str) -> Pointer:
        path = self.model_dir(model) / "pointer.json"
        if not path.exists():
            return Pointer()
        try:
            obj = json.loads(path.read_bytes())
            return Pointer(active=obj.get("active"), previous=obj.get("previous"),
                           candidate=obj.get("candidate"))
        except (ValueError, AttributeError) as e:
            raise InstallError(f"{path} is unreadable ({e}); delete the model dir to reset") from e

    def bundle(self, model: str, bundle_id: str) -> Bundle:
        path = self.model_dir(model) / "bundles" / check_name("bundle", bundle_id)
        try:
            obj = json.loads((path / "bundle.json").read_bytes())
            members = tuple(Member.from_dict(m) for m in obj["members"])
            return Bundle(str(obj["model"]), str(obj["version"]), bundle_id, members, path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InstallError(f"bundle {path} is unreadable: {e}") from e

    def active(self, model: str, pointer: Pointer | None = None) -> Bundle | None:
        """The active bundle (``pointer``: the model's pointer if the caller already read it)."""
        p = pointer if pointer is not None else self.pointer(model)
        return self.bundle(model, p.active) if p.active else None

    def verify(self, bundle: Bundle) -> bool:
        """True when every member file exists with its recorded length and sha256."""
        for m in bundle.members:
            f = bundle.member_path(m)
            sha, length = ((m.local_sha256, m.local_length) if m.local_sha256 is not None
                           else (m.sha256, m.length))
            if not f.is_file() or f.stat().st_size != length or sha256_file(f) != sha:
                return False
        return True

    def held_members(self, model: str, pointer: Pointer | None = None
                     ) -> dict[str, tuple[Member, Path]]:
        """Signed sha256 → (member, path) of the artifact files this device holds for
        ``model`` (reused, or patch bases)."""
        held: dict[str, tuple[Member, Path]] = {}
        p = pointer if pointer is not None else self.pointer(model)
        for bid in (p.candidate, p.previous, p.active):
            if bid is None:
                continue
            try:
                b = self.bundle(model, bid)
            except InstallError:
                continue
            for m in b.members:
                held[m.sha256] = (m, b.member_path(m))
        return held

    def find(self, model: str, bundle_id: str) -> Bundle | None:
        """The bundle if it exists on disk and verifies."""
        if not (self.model_dir(model) / "bundles" / bundle_id / "bundle.json").exists():
            return None
        b = self.bundle(model, bundle_id)
        return b if self.verify(b) else None

    # -- writing -------------------------------------------------------------------------

    def stage(
        self,
        model: str,
        version: str,
        members: Sequence[tuple[Member, Path]],
        compile_fn: Callable[[Bundle], None] | None = None,
    ) -> Bundle:
        """Move verified files into a new bundle (tmp → fsync → rename) and return it.

        The source files are moved, not copied. An existing bundle with the same id that
        verifies is reused.
        """
        specs = [m for m, _ in members]
        bid = bundle_id_for(model, version, specs)
        final = self.model_dir(model) / "bundles" / bid
        existing = self.find(model, bid)
        if existing is not None:
            return existing
        if final.exists():
            remove_tree(final)
        tmp = self.model_dir(model) / "tmp" / uuid.uuid4().hex
        tmp.mkdir(parents=True)
        self._step("stage_begin")
        try:
            for spec, src in members:
                os.replace(src, tmp / spec.file)
            doc = {"model": model, "version": version, "members": [m.to_dict() for m in specs]}
            (tmp / "bundle.json").write_bytes(json.dumps(doc, indent=1).encode())
            self._step("stage_files_written")
            bundle = Bundle(model, version, bid, tuple(specs), tmp)
            if not self.verify(bundle):
                raise InstallError(f"staged files of {model} {version} changed on disk")
            if compile_fn is not None:
                compile_fn(bundle)
            self._step("stage_compiled")
            for dirpath, _dirs, files in os.walk(tmp):
                for name in files:
                    fsync_file(Path(dirpath) / name)
                fsync_dir(Path(dirpath))
            self._step("stage_fsynced")
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
            fsync_dir(final.parent)
            self._step("stage_renamed")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Bundle(model, version, bid, tuple(specs), final)

    def _write_pointer(self, model: str, pointer: Pointer) -> None:
        atomic_write_json(
            self.model_dir(model) / "pointer.json",
            {"active": pointer.active, "previous": pointer.previous,
             "candidate": pointer.candidate},
        )

    def activate(self, model: str, bundle_id: str, current: Pointer | None = None) -> Pointer:
        """Make ``bundle_id`` active; the old active one becomes previous (instant rollback).

        ``current`` is the model's pointer when the caller already holds it (the updater reads
        it once per cycle); returns the new pointer.
        """
        old = current if current is not None else self.pointer(model)
        if old.active == bundle_id:
            return old
        new = Pointer(active=bundle_id, previous=old.active or old.previous,
                      candidate=None if old.candidate == bundle_id else old.candidate)
        journal = self.model_dir(model) / "journal.json"
        atomic_write_json(journal, {"op": "activate", "target": bundle_id})
        self._step("journal_written")
        self._write_pointer(model, new)
        self._step("pointer_written")
        journal.unlink()
        fsync_dir(journal.parent)
        self._step("journal_cleared")
        self.gc(model, new)
        self._step("gc_done")
        return new

    def set_candidate(self, model: str, bundle_id: str | None,
                      current: Pointer | None = None) -> Pointer:
        """Record (or clear) the candidate bundle; one atomic pointer write, then GC.
        ``current`` as in ``activate``; returns the new pointer."""
        old = current if current is not None else self.pointer(model)
        if old.candidate == bundle_id:
            return old
        new = Pointer(active=old.active, previous=old.previous, candidate=bundle_id)
        self._write_pointer(model, new)
        self.gc(model, new)
        return new

    def gc(self, model: str, pointer: Pointer | None = None) -> None:
        """Delete bundles that are not active, previous or candidate, and leftovers in tmp/
        (``pointer``: the pointer just written, if the caller has it)."""
        keep = (pointer if pointer is not None else self.pointer(model)).kept()
        bundles = self.model_dir(model) / "bundles"
        if bundles.exists():
            for d in bundles.iterdir():
                if d.name not in keep:
                    if d.name.startswith(".trash-"):
                        shutil.rmtree(d, ignore_errors=True)
                    else:
                        remove_tree(d)
        shutil.rmtree(self.model_dir(model) / "tmp", ignore_errors=True)

    def recover(self, model: str) -> list[str]:
        """Bring one model's store to a consistent state after a crash; returns what it did."""
        notes: list[str] = []
        mdir = self.model_dir(model)
        shutil.rmtree(mdir / "tmp", ignore_errors=True)
        journal = mdir / "journal.json"
        if journal.exists():
            try:
                target = str(json.loads(journal.read_bytes())["target"])
            except (ValueError, KeyError, TypeError):
                target = ""
            p = self.pointer(model)
            if target and p.active != target and check_name("bundle", target) and self.find(
                model, target
            ):
                self._write_pointer(model, Pointer(
                    active=target, previous=p.active or p.previous,
                    candidate=None if p.candidate == target else p.candidate))
                notes.append(f"finished interrupted activation of {target}")
            journal.unlink()
            fsync_dir(mdir)
        p = self.pointer(model)
        if p.candidate and self.find(model, p.candidate) is None:
            p = Pointer(active=p.active, previous=p.previous)
            self._write_pointer(model, p)
            notes.append("candidate bundle failed verification; dropped")
        if p.active and self.find(model, p.active) is None:
            if p.previous and self.find(model, p.previous) is not None:
                self._write_pointer(model, Pointer(active=p.previous, candidate=p.candidate))
                notes.append(f"active bundle {p.active} failed verification; rolled back")
            else:
                self._write_pointer(model, Pointer(candidate=p.candidate))
                notes.append(f"active bundle {p.active} failed verification; none active")
        if (mdir / "pointer.json").exists():
            self.gc(model)
        return notes

    def recover_all(self) -> list[str]:
        if not self.root.exists():
            return []
        notes: list[str] = []
        for d in sorted(self.root.iterdir()):
            if d.is_dir():
                notes += self.recover(d.name)
        return notes
