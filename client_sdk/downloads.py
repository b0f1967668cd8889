"""Step 3 of the update cycle: a plan's member files, verified, in ``<data_dir>/downloads``.

Per member: a file the device already holds with that sha256 is copied (hard link) and
re-hashed; else a patch whose ``from_sha256`` the device holds is downloaded (capped at its
signed length), applied with ``max_output`` = the artifact's length and checked against the
signed sha256 — any failure but the deadline falls back to the full artifact; else the full
artifact is downloaded, resumably (``<sha256>.part``: the name *is* the expected hash, so a
resume is only valid while the manifest still promises it; ``gc`` drops stale partials).
"""

from __future__ import annotations

import enum
import hashlib
import io
import os
import shutil
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import manifests
from client_sdk import compression
from client_sdk.config import UpdaterConfig
from client_sdk.errors import (
    ClientSDKError,
    ContentKeyError,
    DeadlineExceededError,
    FetchError,
    IntegrityError,
    OversizeError,
    PatchFailedError,
)
from client_sdk.events import Event, EventKind, emit
from client_sdk.fetcher import Deadline, download_file
from client_sdk.fsutil import sha256_file
from client_sdk.install import Member
from client_sdk.protection import (
    KeyClient,
    keystore_for,
    open_with,
    read_plain,
    seal_chunks,
    seal_plain,
    wrap,
)
from client_sdk.selection import Plan
from client_sdk.transport import Transport
from manifests import Artifact, SealedError, sealed

# signed sha256 -> (member, file) of what the device holds (BundleStore.held_members)
Held = dict[str, tuple[Member, Path]]


class Via(enum.Enum):
    """How a model's bytes reached the device in one cycle."""

    PATCH = "patch"  # a delta patch from a held base, applied and verified
    FULL = "full"  # the whole artifact downloaded
    HELD = "held"  # already on the device: nothing downloaded


def resolve_url(base_url: str, ref: str) -> str:
    """An absolute or base-relative URL from a manifest, against the server's base URL."""
    return urllib.parse.urljoin(base_url.rstrip("/") + "/", ref)


class Downloader:
    """Gets plans' member files into ``<data_dir>/downloads`` (see the module docstring).

    ``stopped()`` is polled between chunks: when it turns true the download stops with a
    FetchError and its partial file stays for the next cycle to resume.
    """

    def __init__(self, config: UpdaterConfig, transport: Transport,
                 stopped: Callable[[], bool]) -> None:
        self.config = config
        self.transport = transport
        self.dir = config.data_dir / "downloads"
        self._stopped = stopped
        self._how: list[tuple[Via, int]] = []  # the last fetch: (via, bytes) per member
        self._keys: KeyClient | None = None  # content keys, made for the first sealed artifact

    def how(self) -> tuple[Via, int]:
        """How the last ``fetch`` got its bytes: PATCH if any member came via a patch, else
        FULL if any was downloaded whole, else HELD; and the bytes downloaded (so far, if it
        failed)."""
        ways = {w for w, _ in self._how}
        via = next((w for w in (Via.PATCH, Via.FULL) if w in ways), Via.HELD)
        return via, sum(n for _, n in self._how)

    def _event(self, event: Event) -> None:
        emit(self.config.on_event, event)

    def _step(self, name: str) -> None:  # a kill point for the crash tests (install.STEPS)
        if self.config.fault_hook is not None:
            self.config.fault_hook(name)

    def _url(self, ref: str) -> str:
        return resolve_url(self.config.base_url, ref)

    def fetch(self, plan: Plan, held: Held, deadline: Deadline) -> list[tuple[Member, Path]]:
        """Get every member's verified bytes into downloads/ (``held``: sha256 → (member,
        file) of what the device already has, reused or patched from); returns (member,
        file) pairs."""
        out: list[tuple[Member, Path]] = []
        self._how = []
        for member, artifact in plan.artifacts:
            target = self.dir / f"{artifact.sha256}.ready"
            if artifact.sha256 in held:
                self._how.append((Via.HELD, 0))
                have, path = held[artifact.sha256]
                _copy(path, target)
                if sha256_file(target) != (have.local_sha256 or artifact.sha256):
                    target.unlink(missing_ok=True)
                    raise IntegrityError(f"{plan.model}: the local copy of {member.file} "
                                         "no longer matches its sha256")
                if have.at_rest:  # keeps its wrapped key (and its own sha256, if patched)
                    member = replace(member, wrapped_key=have.wrapped_key,
                                     local_sha256=have.local_sha256,
                                     local_length=have.local_length)
            else:  # verified against the signed length and sha256 on the way in
                member = self._fetch_artifact(plan, member, artifact, held, target, deadline)
            out.append((member, target))
            self._event(Event(EventKind.VERIFIED, plan.model, plan.release.version,
                              f"{member.file} sha256 {artifact.sha256[:16]}…"))
        self._step("download_done")
        return out

    def _content_key(self, plan: Plan) -> bytes:
        if self._keys is None:
            c = self.config
            self._keys = KeyClient(c.data_dir, c.base_url, self.transport, c.device.device_id,
                                   c.channel, c.clock, c.request_timeout_seconds)
        return self._keys.content_key(plan.model, plan.release.version)

    def _fetch_artifact(self, plan: Plan, member: Member, artifact: Artifact, held: Held,
                        target: Path, deadline: Deadline) -> Member:
        """Gets the artifact into ``target``; the member as staged (a protected one with its
        content key wrapped under the device-local key)."""
        version = plan.release.version
        cap = self.config.limits.max_artifact_bytes
        if artifact.length > cap:
            raise OversizeError(
                f"{plan.model} {version}: artifact declares {artifact.length} bytes, over this "
                f"device's cap of {cap} (Limits.max_artifact_bytes)"
            )
        key = None
        if artifact.sealed is not None:
            key = self._content_key(plan)
            member = replace(member, wrapped_key=wrap(keystore_for(self.config.data_dir), key))
        patch = next((p for p in artifact.patches
                      if p.from_sha256 in held and p.length <= cap), None)
        if patch is not None:
            try:
                local = self._fetch_via_patch(plan, artifact, patch, held[patch.from_sha256],
                                              target, deadline, key)
                self._how.append((Via.PATCH, patch.length))
                if local is None:
                    return member
                return replace(member, local_sha256=local[0], local_length=local[1])
            except DeadlineExceededError:
                raise
            except ClientSDKError as e:
                self._event(Event(EventKind.FAILED, plan.model, version,
                                  f"patch unusable ({e}); downloading the full artifact"))
        elif artifact.patches:
            self._event(Event(EventKind.DOWNLOADING, plan.model, version,
                              "no patch from a base this device holds; downloading the full "
                              "artifact"))
        if artifact.compressed is not None and artifact.compressed.codec in compression.CODECS:
            try:
                local = self._fetch_compressed(plan, artifact, artifact.compressed, target,
                                               deadline, key)
                self._how.append((Via.FULL, artifact.compressed.length))
                if local is None:
                    return member
                return replace(member, local_sha256=local[0], local_length=local[1])
            except (IntegrityError, OversizeError) as e:  # a bad copy: the content still works
                self._event(Event(EventKind.FAILED, plan.model, version,
                                  f"compressed copy unusable ({e}); downloading the "
                                  "uncompressed artifact"))
        part = self.dir / f"{artifact.sha256}.part"
        download_file(
            self.transport, self._url(artifact.url), part, length=artifact.length,
            sha256=artifact.sha256, deadline=deadline,
            request_timeout=self.config.request_timeout_seconds,
            progress=lambda done, total: self._progress(plan.model, version, "artifact", done,
                                                        total),
        )
        # A sealed artifact stays as served: sealed under its content key (AEAD per chunk,
        # the sealed bytes' sha256 signed), opened into memory when it is loaded.
        os.replace(part, target)
        self._how.append((Via.FULL, artifact.length))
        return member

    def _fetch_compressed(self, plan: Plan, artifact: Artifact, copy: manifests.Compressed,
                          target: Path, deadline: Deadline,
                          key: bytes | None) -> tuple[str, int] | None:
        """The compressed copy downloaded (checked against its signed length and sha256),
        inflated into ``target`` with the output capped at the signed content length and
        checked against the content's sha256; a protected one is opened, inflated and sealed
        again under the content key piece by piece ((sha256, length) of that local file)."""
        cap = self.config.limits.max_artifact_bytes
        if copy.length > cap:
            raise OversizeError(f"compressed copy declares {copy.length} bytes, over this "
                                f"device's cap of {cap} (Limits.max_artifact_bytes)")
        part = self.dir / f"{copy.sha256}.part"
        download_file(
            self.transport, self._url(copy.url), part, length=copy.length, sha256=copy.sha256,
            deadline=deadline, request_timeout=self.config.request_timeout_seconds,
            progress=lambda done, total: self._progress(plan.model, plan.release.version,
                                                        "compressed artifact", done, total),
        )
        out = self.dir / f"{artifact.sha256}.inflating"
        try:
            if key is not None and artifact.sealed is not None:
                return self._inflate_sealed(artifact.sealed, copy.codec, part, out, target,
                                            key)
            with part.open("rb") as src, out.open("wb") as dst:
                digest = compression.decompress(src, dst, artifact.length, copy.codec)
            if digest != artifact.sha256:
                raise IntegrityError("the compressed copy inflated to bytes whose sha256 is "
                                     "not the signed one; discarded")
            os.replace(out, target)
            return None
        except compression.DecompressionError as e:
            raise IntegrityError(str(e)) from None
        finally:
            part.unlink(missing_ok=True)
            out.unlink(missing_ok=True)

    def _inflate_sealed(self, expect: manifests.Sealed, codec: str, part: Path, out: Path,
                        target: Path, key: bytes) -> tuple[str, int]:
        """compress-then-seal, undone as a stream: open, inflate (capped at the signed
        plaintext length), hash, seal again; nothing is held whole."""
        digest = hashlib.sha256()

        def plain() -> Iterator[bytes]:
            with part.open("rb") as f:
                try:
                    reader = compression.ChunkReader(sealed.unseal(key, f))
                    for piece in compression.decompress_chunks(reader, expect.plain_length,
                                                               codec):
                        digest.update(piece)
                        yield piece
                except SealedError as e:
                    raise ContentKeyError(f"compressed copy does not open with its content "
                                          f"key: {e}") from None

        local = seal_chunks(key, plain(), out)
        if digest.hexdigest() != expect.plain_sha256:
            raise IntegrityError("the compressed copy inflated to a model whose sha256 is "
                                 "not the signed plaintext's; discarded")
        os.replace(out, target)
        return local

    def _fetch_via_patch(self, plan: Plan, artifact: Artifact, patch: manifests.Patch,
                         base: tuple[Member, Path], target: Path, deadline: Deadline,
                         key: bytes | None) -> tuple[str, int] | None:
        from client_sdk.patching import PatchError, apply_patch

        version = plan.release.version
        part = self.dir / f"{patch.sha256}.part"
        download_file(
            self.transport, self._url(patch.url), part, length=patch.length, sha256=patch.sha256,
            deadline=deadline, request_timeout=self.config.request_timeout_seconds,
            progress=lambda done, total: self._progress(plan.model, version, "patch", done,
                                                        total),
        )
        if key is not None and artifact.sealed is not None:
            return self._patch_sealed(artifact.sealed, patch, base, part, target, key)
        out = self.dir / f"{artifact.sha256}.patched"
        try:
            apply_patch(patch.algorithm, base[1], part, out, max_output=artifact.length)
        except PatchError as e:
            out.unlink(missing_ok=True)
            raise PatchFailedError(f"{patch.algorithm} patch failed: {e}") from e
        finally:
            part.unlink(missing_ok=True)
        deadline.check("applying a patch")
        if out.stat().st_size != artifact.length or sha256_file(out) != artifact.sha256:
            out.unlink(missing_ok=True)
            raise PatchFailedError("patched file does not match the signed sha256")
        os.replace(out, target)
        self._step("patch_applied")
        return None

    def _patch_sealed(self, expect: manifests.Sealed, patch: manifests.Patch,
                      base: tuple[Member, Path], part: Path, target: Path,
                      key: bytes) -> tuple[str, int]:
        """A protected release's patch: decrypted, applied to the decrypted base and checked
        against the signed plaintext sha256 in memory, then sealed under the content key;
        (sha256, length) of the sealed file."""
        from client_sdk.patching import PatchError, apply_patch_streams

        try:
            delta = open_with(key, part)
        finally:
            part.unlink(missing_ok=True)
        plain_base = read_plain(base[1], base[0], keystore_for(self.config.data_dir))
        out = io.BytesIO()
        try:
            apply_patch_streams(patch.algorithm, io.BytesIO(plain_base), delta, out,
                                max_output=expect.plain_length)
        except PatchError as e:
            raise PatchFailedError(f"{patch.algorithm} patch failed: {e}") from e
        plain = out.getvalue()
        if (hashlib.sha256(plain).hexdigest(), len(plain)) != (expect.plain_sha256,
                                                               expect.plain_length):
            raise PatchFailedError("patched model does not match the signed plaintext sha256")
        local = seal_plain(key, plain, target)
        self._step("patch_applied")
        return local

    def _progress(self, model: str, version: str, what: str, done: int, total: int) -> None:
        if self._stopped():
            # Stop between chunks: the partial file stays and the next run resumes it.
            raise FetchError(f"stopped while downloading {model} {version}; will resume")
        self._event(Event(EventKind.DOWNLOADING, model, version, what, done, total))

    def gc(self, plans: tuple[Plan, ...]) -> None:
        """Drop partial downloads no plan wants any more: a resume is only valid while the
        expected sha256 is unchanged, and the file name *is* that sha256."""
        wanted = {a.sha256 for p in plans for _, a in p.artifacts}
        wanted |= {pt.sha256 for p in plans for _, a in p.artifacts for pt in a.patches}
        wanted |= {a.compressed.sha256 for p in plans for _, a in p.artifacts if a.compressed}
        if not self.dir.exists():
            return
        for f in self.dir.iterdir():
            if f.name.split(".", 1)[0] not in wanted or not f.name.endswith(".part"):
                f.unlink(missing_ok=True)


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".copy")
    try:
        os.link(src, tmp)  # bundles are immutable, so a hard link is a safe copy
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
