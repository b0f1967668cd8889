"""The channel manifest as a pure function of the channel's rollout records.

Which releases a channel offers, per model, newest first:
  1. every release still in flight (not halted) newer than the latest fully rolled-out one;
  2. the latest fully rolled-out release (share 100%, not halted) — the fallback that devices
     outside a new release's cohort, and every device after a halt, land on; when the newest
     release is itself fully rolled out, the full release before it stays as its fallback.
Halted releases are never offered (the rollback); in-flight releases older than the latest
full one are superseded and dropped. A model with nothing to offer is left out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from manifests import Manifest, ModelEntry
from server.db.states import ReleaseState
from server.publish.records import RolloutRecord


def offered(rollouts: Iterable[RolloutRecord]) -> list[RolloutRecord]:
    """The releases one model's channel offers, in the order devices must try them."""
    live = sorted(
        (r for r in rollouts if r.state is not ReleaseState.halted),
        key=lambda r: r.seq, reverse=True,
    )
    full = [i for i, r in enumerate(live) if r.fully_rolled_out]
    if not full:
        return live
    head = live[: full[0] + 1]
    if len(head) == 1 and len(full) > 1:
        # The newest release is itself at 100%: keep its predecessor as the fallback, for
        # devices its filters leave out and for the moment it is halted.
        head.append(live[full[1]])
    return head


def build_manifest(
    *, channel: str, serial: int, expires: int, rollouts: Sequence[RolloutRecord]
) -> Manifest:
    """The unsigned manifest document for `channel` at `serial`, expiring at `expires`."""
    by_model: dict[str, list[RolloutRecord]] = defaultdict(list)
    for r in rollouts:
        by_model[r.model].append(r)
    models = {}
    for name in sorted(by_model):
        releases = [r.manifest_release() for r in offered(by_model[name])]
        if releases:
            models[name] = ModelEntry(releases=releases)
    return Manifest(channel=channel, serial=serial, expires=expires, models=models)


def join_url(base_url: str, path: str) -> str:
    """`path` (no leading slash, e.g. `v1/artifacts/<sha>`) under base_url, or left relative.

    With no public base URL the manifest carries the path relative to the server's base URL,
    which devices resolve against the URL they fetched the manifest's server from.
    """
    return f"{base_url.rstrip('/')}/{path}" if base_url else path
