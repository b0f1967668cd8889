"""The soak's traffic, all at once on loopback (asyncio + httpx): device polls with
If-None-Match, signed telemetry batches, two uploads that compile on the worker, operator
ramps of one rollout and a halt of another. Every answer is recorded (`Sample`); the report
ids of every batch answered 200 are kept, to be looked up in the database afterwards.

The generator is one Python process on the same cores as the servers: telemetry bodies are
built and signed before the clock starts, and each kind keeps at most `IN_FLIGHT` requests
open — an arrival due while they are all busy is counted in `Outcome.behind` and not sent,
so a starved generator shows as such instead of as server latency (a request's time is
measured from its send, not from when it was due).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.common import report

KINDS = ("shadow", "health", "update")
IN_FLIGHT = 16  # open requests per kind


@dataclass(frozen=True)
class Sample:
    kind: str  # poll | telemetry | upload | ramp | halt | status
    status: int  # 0: no answer (connection failed or timed out)
    seconds: float
    code: str = ""  # the error body's `code` of a 5xx
    retry_after: bool = False


@dataclass
class Plan:
    bases: list[str]  # the API processes, used in turn
    token: str
    devices: list[tuple[str, Any]]
    duration_s: float
    poll_rate: float
    telemetry_rate: float
    reports_per_batch: int
    ramp_rollout: int
    halt_rollout: int
    uploads: list[tuple[str, bytes, str]]  # (model, ONNX bytes, metadata JSON)
    ramp_steps: tuple[int, ...] = (25, 50, 75, 100)


@dataclass
class Outcome:
    samples: list[Sample] = field(default_factory=list)
    accepted_ids: list[str] = field(default_factory=list)
    uploaded: list[tuple[str, str]] = field(default_factory=list)  # (model, version)
    behind: dict[str, int] = field(default_factory=dict)  # arrivals not sent, per kind
    lag: list[float] = field(default_factory=list)  # seconds each arrival was sent late


async def _timed(kind: str, out: Outcome, call: Awaitable[httpx.Response]) -> httpx.Response | None:
    start = time.perf_counter()
    try:
        r = await call
    except httpx.HTTPError:
        out.samples.append(Sample(kind, 0, time.perf_counter() - start))
        return None
    code = ""
    if r.status_code >= 500:
        try:
            code = str(r.json().get("code", ""))
        except ValueError:
            code = ""
    out.samples.append(Sample(kind, r.status_code, time.perf_counter() - start, code,
                              "retry-after" in r.headers))
    return r


async def _paced(kind: str, out: Outcome, rate: float, until: float,
                 step: Callable[[int], Awaitable[None]]) -> None:
    """Calls `step(i)` `rate` times a second (open loop: a slow answer does not slow the
    arrivals) until the monotonic time `until`, with at most IN_FLIGHT open at once."""
    tasks: set[asyncio.Task[None]] = set()
    start, i = time.monotonic(), 0
    while (now := time.monotonic()) < until:
        due = start + i / rate
        if due > now:
            await asyncio.sleep(due - now)
        # How late the generator's own event loop got to it: on a starved machine this,
        # not the server, is much of the latency measured.
        out.lag.append(time.monotonic() - due)
        i += 1
        if len(tasks) >= IN_FLIGHT:
            out.behind[kind] = out.behind.get(kind, 0) + 1
            continue
        task = asyncio.create_task(step(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


def signed_batches(plan: Plan) -> list[tuple[str, bytes, str, list[str]]]:
    """(device id, body, signature, report ids) for every batch the run can send."""
    now = int(time.time())
    batches = []
    for i in range(int(plan.telemetry_rate * plan.duration_s) + 1):
        device_id, key = plan.devices[i % len(plan.devices)]
        model = ("soak-ramp", "soak-halt")[i % 2]
        reports = [report(KINDS[(i + j) % 3], now, model, "1.0")
                   for j in range(plan.reports_per_batch)]
        body = json.dumps({"device_id": device_id, "sent_at": now, "reports": reports},
                          separators=(",", ":")).encode()
        batches.append((device_id, body, base64.b64encode(key.sign(body).signature).decode(),
                        [str(x["id"]) for x in reports]))
    return batches


async def run(plan: Plan) -> Outcome:
    out = Outcome()
    batches = signed_batches(plan)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    auth = {"Authorization": f"Bearer {plan.token}"}
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
        until = time.monotonic() + plan.duration_s
        etags: dict[str, str] = {}

        def base(i: int) -> str:
            return plan.bases[i % len(plan.bases)]

        async def poll(i: int) -> None:
            b = base(i)
            headers = {"If-None-Match": etags[b]} if b in etags else {}
            r = await _timed("poll", out, client.get(f"{b}/v1/channels/prod/manifest",
                                                     headers=headers))
            if r is not None and r.status_code == 200:
                etags[b] = r.headers["etag"]

        async def telemetry(i: int) -> None:
            device_id, body, signature, ids = batches[i % len(batches)]
            headers = {"Content-Type": "application/json", "X-Device-Id": device_id,
                       "X-Device-Signature": signature}
            r = await _timed("telemetry", out, client.post(f"{base(i)}/v1/telemetry",
                                                           content=body, headers=headers))
            if r is not None and r.status_code == 200:
                out.accepted_ids.extend(ids)

        async def upload(i: int, model: str, onnx: bytes, metadata: str) -> None:
            await asyncio.sleep(1.0)
            r = await _timed("upload", out, client.post(
                f"{base(i)}/v1/models/{model}/versions", headers=auth,
                files={"model": ("model.onnx", onnx, "application/octet-stream")},
                data={"metadata": metadata}))
            if r is not None and r.status_code in (200, 201):
                out.uploaded.append((model, r.json()["version"]))

        async def ramps() -> None:
            gap = plan.duration_s / (len(plan.ramp_steps) + 1)
            for n, pct in enumerate(plan.ramp_steps):
                await asyncio.sleep(gap)
                await _timed("ramp", out, client.patch(
                    f"{base(n)}/v1/rollouts/{plan.ramp_rollout}", headers=auth,
                    json={"percentage": pct}))

        async def halt() -> None:
            await asyncio.sleep(plan.duration_s / 2)
            await _timed("halt", out, client.post(
                f"{base(1)}/v1/rollouts/{plan.halt_rollout}/halt", headers=auth,
                json={"reason": "soak: the halt under load"}))

        await asyncio.gather(
            _paced("poll", out, plan.poll_rate, until, poll),
            _paced("telemetry", out, plan.telemetry_rate, until, telemetry),
            *(upload(i, m, onnx, meta) for i, (m, onnx, meta) in enumerate(plan.uploads)),
            ramps(), halt())
    return out
