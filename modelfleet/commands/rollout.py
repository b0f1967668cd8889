"""`modelfleet rollout start|ramp|pause|resume|halt|status|list|preview` (scope rollout).

Every change answers with the rollout (its `id` first of all) and the serial of the signed
manifest it published (`serial` null when the change was a no-op, e.g. halting twice).
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from modelfleet.commands.options import Json, Server, Token
from modelfleet.output import CommandError, api

rollout_app = typer.Typer(no_args_is_help=True, help="Start, ramp, pause, resume and halt "
                          "rollouts; list and preview them.")

# --filter KEY=VALUE: the rollout rule's filter lists (docs/manifest.md), singular or plural.
FILTER_KEYS = {"platform": "platforms", "soc": "socs", "arch": "archs",
               "os_version": "os_versions", "app_version": "app_versions",
               "device": "device_allow", "allow": "device_allow", "deny": "device_deny"}
FILTER_KEYS |= {v: v for v in set(FILTER_KEYS.values())}

RolloutId = Annotated[int, typer.Argument(metavar="ID", min=1, help="rollout id")]
Percent = Annotated[str, typer.Option("--percent", metavar="N",
                                      help="share of matching devices, 0–100 (e.g. 5, 0.5)")]
Filters = Annotated[list[str] | None, typer.Option(
    "--filter", metavar="KEY=VALUE",
    help="platform, soc, arch, os_version, app_version, device (allow), deny; "
    "comma-separate or repeat")]
Reason = Annotated[str, typer.Option(metavar="TEXT", help="recorded in the audit log")]


def percentage(text: str) -> str:
    try:
        value = Decimal(text)
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or not 0 <= value <= 100:
        raise CommandError(f"--percent {text!r} is not a number from 0 to 100",
                           fix="e.g. --percent 5 or --percent 0.5")
    return str(value)


def ramp_schedule(text: str) -> list[str]:
    """--ramp 1,5,25,100 → ["1", "5", "25", "100"]; the server checks the order and range."""
    steps = [s.strip().removesuffix("%") for s in text.split(",") if s.strip()]
    for step in steps:
        try:
            Decimal(step)
        except InvalidOperation:
            raise CommandError(f"--ramp {text!r}: {step!r} is not a percentage",
                               fix="e.g. --ramp 1,5,25,100") from None
    return steps


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def duration_seconds(text: str) -> int:
    """--ramp-interval 1h / 30m / 90s / 2d / 3600 → seconds."""
    value = text.strip().lower()
    unit = DURATION_UNITS.get(value[-1:], None) if value else None
    number = value[:-1] if unit is not None else value
    if not number.isdigit():
        raise CommandError(f"--ramp-interval {text!r} is not a duration",
                           fix="e.g. --ramp-interval 1h, 30m, 90s, 2d or 3600 (seconds)")
    return int(number) * (unit or 1)


def parse_filters(items: list[str] | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        field = FILTER_KEYS.get(key.strip().lower())
        if not sep or field is None:
            raise CommandError(f"--filter {item!r} must be KEY=VALUE with KEY one of "
                               "platform, soc, arch, os_version, app_version, device, deny",
                               fix="e.g. --filter platform=qnn --filter soc=SM8650")
        out.setdefault(field, []).extend(v.strip() for v in value.split(",") if v.strip())
    return out


def describe(r: dict[str, Any]) -> str:
    serial = f", manifest serial {r['serial']}" if r.get("serial") is not None else \
        " (no change)"
    filters = "; ".join(f"{k}={','.join(v)}" for k, v in r["filters"].items() if v)
    reason = f" — {r['state_reason']}" if r.get("state_reason") else ""
    mode = " shadow" if r["mode"] == "shadow" else ""
    return (f"rollout {r['id']}: {r['model']} {r['version']} on {r['channel']} at "
            f"{r['percentage']:g}%{mode}, {r['state']}{reason}"
            + (f" [{filters}]" if filters else "") + serial + describe_ramp(r.get("ramp")))


def describe_ramp(ramp: dict[str, Any] | None) -> str:
    if not ramp:
        return ""
    steps = " → ".join(f"{s:g}%" for s in ramp["steps"])
    when = f", next step at {ramp['next_step_at']} if healthy" if ramp["next_step_at"] else ""
    return (f"; ramp {steps} every {ramp['interval_seconds']} s: step {ramp['step']}/"
            f"{len(ramp['steps'])}, {ramp['state']}{when}")


def rollout_table(rollouts: list[dict[str, Any]], title: str | None = None) -> Table:
    table = Table("id", "model", "version", "share", "mode", "state", box=None, title=title)
    for r in rollouts:
        table.add_row(str(r["id"]), r["model"], r["version"], f"{r['percentage']:g}%",
                      r["mode"], r["state"])
    return table


def _answer(doc: dict[str, Any], out: Any) -> None:
    out.result(doc, lambda c: c.print(describe(doc), highlight=False, soft_wrap=True))


@rollout_app.command("start")
def start(
    channel: Annotated[str, typer.Argument(metavar="CHANNEL", help="e.g. prod (created on "
                                           "first use)")],
    model: Annotated[str, typer.Argument(metavar="MODEL")],
    version: Annotated[str, typer.Argument(metavar="VERSION")],
    percent: Annotated[str | None, typer.Option(
        "--percent", metavar="N", help="share of matching devices, 0–100 (e.g. 5, 0.5); "
        "with --ramp it may be left out (the first step)")] = None,
    mode: Annotated[str, typer.Option(metavar="MODE", help="active or shadow")] = "active",
    filters: Filters = None,
    shadow_max_kl_micro: Annotated[int | None, typer.Option(
        metavar="N", min=0, help="shadow: max KL divergence × 10^6")] = None,
    shadow_max_latency_p99_us: Annotated[int | None, typer.Option(
        metavar="US", min=0, help="shadow: max p99 latency, µs")] = None,
    shadow_min_samples: Annotated[int | None, typer.Option(
        metavar="N", min=0, help="shadow: samples needed before judging")] = None,
    ramp_steps: Annotated[str | None, typer.Option(
        "--ramp", metavar="P1,P2,…", help="ramp schedule: percentages to step through while "
        "healthy, e.g. 1,5,25,100 (starts at the first)")] = None,
    ramp_interval: Annotated[str | None, typer.Option(
        "--ramp-interval", metavar="DURATION", help="wait between ramp steps: 90s, 30m, 1h, "
        "2d or seconds (at least 1m)")] = None,
    server: Server = None, token: Token = None, as_json: Json = False,
) -> None:
    """Offer a ready MODEL VERSION on CHANNEL to --percent of the matching devices, or step
    through --ramp every --ramp-interval while the rollout is healthy."""
    with api(server, token, as_json) as (client, out):
        if percent is None and ramp_steps is None:
            raise CommandError("give --percent or --ramp",
                               fix="e.g. --percent 5, or --ramp 1,5,25,100 --ramp-interval 1h")
        body: dict[str, Any] = {"model": model, "version": version, "mode": mode,
                                "filters": parse_filters(filters)}
        if percent is not None:
            body["percentage"] = percentage(percent)
        if (ramp_steps is None) != (ramp_interval is None):
            raise CommandError("--ramp and --ramp-interval go together",
                               fix="e.g. --ramp 1,5,25,100 --ramp-interval 1h")
        if ramp_steps is not None and ramp_interval is not None:
            body["ramp"] = {"steps": ramp_schedule(ramp_steps),
                            "interval_seconds": duration_seconds(ramp_interval)}
        shadow = (shadow_max_kl_micro, shadow_max_latency_p99_us, shadow_min_samples)
        if any(v is not None for v in shadow):
            if any(v is None for v in shadow):
                raise CommandError("shadow thresholds go together",
                                   fix="give --shadow-max-kl-micro, "
                                   "--shadow-max-latency-p99-us and --shadow-min-samples")
            body["shadow"] = dict(zip(("max_kl_micro", "max_latency_p99_us", "min_samples"),
                                      shadow, strict=True))
        _answer(client.post(f"/v1/channels/{channel}/rollouts", body), out)


@rollout_app.command("ramp")
def ramp(rollout_id: RolloutId, percent: Percent, server: Server = None, token: Token = None,
         as_json: Json = False) -> None:
    """Change a rollout's share (up or down)."""
    with api(server, token, as_json) as (client, out):
        _answer(client.patch(f"/v1/rollouts/{rollout_id}",
                             {"percentage": percentage(percent)}), out)


@rollout_app.command("pause")
def pause(rollout_id: RolloutId, reason: Reason = "", server: Server = None,
          token: Token = None, as_json: Json = False) -> None:
    """Freeze a rollout's share (still offered); resume before ramping again."""
    with api(server, token, as_json) as (client, out):
        _answer(client.post(f"/v1/rollouts/{rollout_id}/pause", {"reason": reason}), out)


@rollout_app.command("resume")
def resume(rollout_id: RolloutId, reason: Reason = "", server: Server = None,
           token: Token = None, as_json: Json = False) -> None:
    """Resume a paused rollout, or a halted one (--reason required: it is offered again at
    its share before the halt, and the guard counts only reports from now on)."""
    with api(server, token, as_json) as (client, out):
        _answer(client.post(f"/v1/rollouts/{rollout_id}/resume",
                            {"reason": reason} if reason else None), out)


@rollout_app.command("halt")
def halt(rollout_id: RolloutId, reason: Reason = "", server: Server = None,
         token: Token = None, as_json: Json = False) -> None:
    """The rollback: share 0, no longer offered; devices go back to the previous release."""
    with api(server, token, as_json) as (client, out):
        _answer(client.post(f"/v1/rollouts/{rollout_id}/halt", {"reason": reason}), out)


@rollout_app.command("status")
def status(rollout_id: RolloutId, server: Server = None, token: Token = None,
           as_json: Json = False) -> None:
    """One rollout: share, mode, state, filters."""
    with api(server, token, as_json) as (client, out):
        _answer(client.get(f"/v1/rollouts/{rollout_id}"), out)


@rollout_app.command("list")
def list_(channel: Annotated[str, typer.Argument(metavar="CHANNEL")], server: Server = None,
          token: Token = None, as_json: Json = False) -> None:
    """Every rollout on CHANNEL, newest first."""
    with api(server, token, as_json) as (client, out):
        rollouts = client.get(f"/v1/channels/{channel}/rollouts")
        out.result({"channel": channel, "rollouts": rollouts},
                   lambda c: c.print(rollout_table(rollouts)))


@rollout_app.command("preview")
def preview(
    channel: Annotated[str, typer.Argument(metavar="CHANNEL")],
    rollout: Annotated[int | None, typer.Option("--rollout", metavar="ID", min=1,
                                                help="an existing rollout…")] = None,
    model: Annotated[str | None, typer.Option(metavar="MODEL", help="…or a proposed one")]
    = None,
    version: Annotated[str | None, typer.Option(metavar="VERSION")] = None,
    percent: Annotated[str | None, typer.Option("--percent", metavar="N")] = None,
    filters: Filters = None,
    devices: Annotated[Path | None, typer.Option(
        metavar="FILE.json", help="device profiles [{device_id, platform, soc, …}]; "
        "default: the devices the server has seen")] = None,
    server: Server = None, token: Token = None, as_json: Json = False,
) -> None:
    """Dry run: which devices a rollout would reach."""
    with api(server, token, as_json) as (client, out):
        body: dict[str, Any] = {"filters": parse_filters(filters)}
        if rollout is not None:
            body["rollout_id"] = rollout
        else:
            body |= {"model": model, "version": version,
                     "percentage": None if percent is None else percentage(percent)}
        if devices is not None:
            try:
                body["devices"] = json.loads(devices.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise CommandError(f"--devices {devices}: {e}",
                                   fix="a JSON list of device profiles") from None
        doc = client.post(f"/v1/channels/{channel}/preview", body)

        def render(c: Console) -> None:
            c.print(f"{doc['included']} of {doc['total']} device(s) included "
                    f"({doc['included_share']:.1%})", highlight=False)
            if doc["included_device_ids"]:
                c.print("included: " + ", ".join(doc["included_device_ids"][:20]),
                        highlight=False)

        out.result(doc, render)
