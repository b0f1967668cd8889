"""The fleet guard: after each telemetry batch that brought a final verdict, a failure or a
rollback, the releases it touched are judged from every device's latest counted standing
(each device once; only devices the release was offered to, unrevoked, whose verdicts agree
with their figures: server/rollouts/health.py `standings`).

The evidence is asymmetric (docs/shadow.md "The guard"). A halt is quick: failed share >=
max_fail_share among >= min_devices reporting devices halts the release at once
(`halt_rollout(..., actor="system")`: a new signed manifest with a higher serial and an
audit event with the reason) and POSTs the halt to the webhook when one is configured. A
pass needs more: at least `min_passed` devices that passed, their first passes spread over
`promote_min_spread_s`, and no unexplained failure (a failure the device's own figures do
not show: a crash, a failed update, a rollback). Only then is a shadow release that asked
for `auto_promote` promoted to active (devices holding the candidate swap it in), and only
then does a ramp schedule take its next step."""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from server import crashpoints
from server.db import models as db
from server.publish.publisher import Publisher
from server.rollouts import service as ro
from server.rollouts.health import Standing, rule_of, standings, thresholds_of

log = logging.getLogger("modelfleet.fleet")
WEBHOOK_TIMEOUT_S = 5.0


# (max_kl_micro, max_latency_p99_us, min_samples) of a shadow release.
Thresholds = tuple[int, int, int]


@dataclass(frozen=True)
class Judgement:
    reporting: int
    failing: int
    decision: Literal["halt", "pass", "wait"]
    reason: str
    passed: int = 0
    unexplained: int = 0


def failure(rule: ro.GuardRule, d: Standing, thresholds: Thresholds | None
            ) -> Literal["explained", "unexplained"] | None:
    """Whether the device fails, and whether its own figures show why: a candidate p99 over
    the guard's budget, or a failed verdict whose figures break the shadow thresholds, is
    explained; a failed verdict the figures do not show (the candidate crashed), a failed
    update and a rollback are not."""
    if (rule.max_latency_p99_us is not None and d.candidate_p99_us is not None
            and d.candidate_p99_us > rule.max_latency_p99_us):
        return "explained"
    if d.verdict == "failed":
        if thresholds is not None and d.samples is not None and d.samples >= thresholds[2] and (
                (d.kl_mean_micro or 0) > thresholds[0]
                or (d.candidate_p99_us or 0) > thresholds[1]):
            return "explained"
        return "unexplained"
    if d.rolled_back or d.event in ("failed", "rolled_back"):
        return "unexplained"
    return None


def judge(rule: ro.GuardRule, devices: Sequence[Standing],
          thresholds: Thresholds | None = None) -> Judgement:
    """A device reports once it has a final shadow verdict, activated, failed or rolled back;
    it fails on a failed verdict, a failed update, a rollback, or a candidate p99 over the
    rule's latency budget (`failure`); it passes otherwise, with a passed verdict or once
    activated."""
    reporting = failing = unexplained = 0
    passed_at = []
    for d in devices:
        if not (d.verdict in ("passed", "failed") or d.rolled_back
                or d.event in ("activated", "failed", "rolled_back")):
            continue
        reporting += 1
        why = failure(rule, d, thresholds)
        if why is not None:
            failing += 1
            unexplained += why == "unexplained"
        elif d.passed_at is not None:
            passed_at.append(d.passed_at)
    share = f"{failing} of {reporting} reporting devices failed"
    limit = f"{rule.max_fail_share_ppm / 10_000:g}%"
    counts = {"passed": len(passed_at), "unexplained": unexplained}
    if reporting < rule.min_devices:
        return Judgement(reporting, failing, "wait",
                         f"{share}; waiting for {rule.min_devices} reporting devices", **counts)
    if failing * 1_000_000 >= rule.max_fail_share_ppm * reporting:
        return Judgement(reporting, failing, "halt",
                         f"guard: {share} ({failing * 100 / reporting:.1f}% >= {limit})",
                         **counts)
    verdict = f"guard: {share} ({failing * 100 / reporting:.1f}% < {limit})"
    missing = []
    if len(passed_at) < rule.min_passed:
        missing.append(f"{len(passed_at)} of {rule.min_passed} passed devices")
    spread = (max(passed_at) - min(passed_at)).total_seconds() if passed_at else 0.0
    if spread < rule.promote_min_spread_s:
        missing.append(f"passes spread over {spread:.0f} of {rule.promote_min_spread_s} s")
    if unexplained:
        missing.append(f"{unexplained} unexplained failure(s) to look into")
    if missing:
        return Judgement(reporting, failing, "wait",
                         f"{verdict}; not yet promotable: {', '.join(missing)}", **counts)
    return Judgement(reporting, failing, "pass",
                     f"{verdict}; {len(passed_at)} passed over {spread:.0f} s", **counts)


@dataclass(frozen=True)
class GuardAction:
    rollout_id: int
    action: Literal["halted", "promoted"]
    reason: str
    serial: int | None
    channel: str


class FleetGuard:
    """See the module docstring. The manifests it publishes reach the manifest cache through
    the publisher's "published" event, like every other change."""

    def __init__(self, factory: sessionmaker[Session], publisher: Publisher, *,
                 webhook_url: str = "") -> None:
        self.factory = factory
        self.publisher = publisher
        self.webhook_url = webhook_url

    def evaluate(self, rollout_ids: Iterable[int]) -> list[GuardAction]:
        actions = []
        for rollout_id in sorted(set(rollout_ids)):
            action = self._evaluate_one(rollout_id)
            if action is not None:
                actions.append(action)
        return actions

    def evaluate_active(self) -> list[GuardAction]:
        """Judge every active rollout once, as a process starts: a halt or promotion that
        an earlier process decided but died before publishing is taken now, not at the
        next report (which a quiet fleet may never send)."""
        with self.factory() as session:
            ids = list(session.scalars(select(db.Release.id).where(
                db.Release.state == db.ReleaseState.active)))
        return self.evaluate(ids)

    def _evaluate_one(self, rollout_id: int) -> GuardAction | None:
        with self.factory() as session:
            release = session.get(db.Release, rollout_id)
            if release is None or release.state is db.ReleaseState.halted:
                return None
            verdict = judge(rule_of(release), standings(session, rollout_id),
                            thresholds_of(release))
            promote = (verdict.decision == "pass" and release.auto_promote
                       and release.mode is db.RolloutMode.shadow
                       and release.state is db.ReleaseState.active)
        if verdict.decision == "halt" or promote:
            crashpoints.reached("guard.decided")
        if verdict.decision == "halt":
            view = ro.halt_rollout(self.factory, self.publisher, rollout_id, actor="system",
                                   reason=verdict.reason)
            action = GuardAction(rollout_id, "halted", verdict.reason, view.serial, view.channel)
            crashpoints.reached("guard.published")
            if view.serial is not None:  # this request's halt (a concurrent one is a no-op)
                log.warning("rollout %d halted: %s", rollout_id, verdict.reason)
                self._notify(action, view)
            return action
        if promote:
            view = ro.promote_rollout(self.factory, self.publisher, rollout_id,
                                      actor="system", reason=verdict.reason)
            crashpoints.reached("guard.published")
            return GuardAction(rollout_id, "promoted", verdict.reason, view.serial,
                               view.channel)
        return None

    def _notify(self, action: GuardAction, view: ro.RolloutView) -> None:
        if not self.webhook_url:
            return
        body = json.dumps({
            "event": "rollout.halted", "rollout_id": action.rollout_id,
            "channel": action.channel, "model": view.record.model,
            "version": view.record.version, "reason": action.reason, "serial": action.serial,
            "actor": "system"}).encode()
        threading.Thread(target=post_webhook, args=(self.webhook_url, body),
                         name="halt-webhook", daemon=True).start()


def post_webhook(url: str, body: bytes) -> bool:
    """POSTs `body` (JSON); False (logged) when the receiver fails or cannot be reached."""
    if not url.startswith(("http://", "https://")):
        log.error("halt webhook %r is not an http(s) URL; not called", url)
        return False
    request = urllib.request.Request(url, data=body, method="POST",  # noqa: S310 - http(s) only
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "modelfleet-guard"})
    try:
        with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as response:  # noqa: S310
            status: int = response.status
            return 200 <= status < 300
    except (OSError, ValueError) as e:
        log.error("halt webhook %s failed: %s", url, e)
        return False
