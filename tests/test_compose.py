"""docker-compose.yml refers only to things that exist: every command and option of our
image parses with the real CLI, every MODELFLEET_* variable is a setting the server reads
(and the production values pass the settings' own checks), every health check path is a
route of the app, every depends_on target exists with the condition it can meet, every
named volume is declared. Renaming a command, an option, a setting or a route fails here."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import alembic.command
import pytest
import typer.main
import yaml

from modelfleet.cli import app as cli_app
from server.settings import Settings

REPO = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
URL = re.compile(r"https?://[^/'\"\s]+(/[^'\"\s?)]*)")
INTERPOLATION = re.compile(r"\$\{([A-Z0-9_]+)[^}]*\}")


def ours(service: dict[str, Any]) -> bool:
    return "build" in service  # the ModelFleet image (Dockerfile); the rest are upstream images


def setting_names() -> set[str]:
    return {f"MODELFLEET_{name.upper()}" for name in Settings.model_fields}


def command_problems(argv: list[str]) -> list[str]:
    """Why `argv` would not start in our image, or []."""
    if argv[0] == "modelfleet":
        # typer ships its own click: its Context and exceptions, reached through typer.
        click_exception = next(c for c in typer.BadParameter.__mro__
                               if c.__name__ == "ClickException")
        command: Any = typer.main.get_command(cli_app)
        parent = typer.Context(command, info_name="modelfleet")
        args = list(argv[1:])
        try:
            while hasattr(command, "get_command"):  # a group: walk down to the command
                name = args.pop(0) if args else ""
                found = command.get_command(parent, name)
                if found is None:
                    return [f"{' '.join(argv)}: No such command {name!r}"]
                command = found
                parent = typer.Context(command, info_name=name, parent=parent)
            command.make_context(parent.info_name, args, parent=parent.parent)  # runs nothing
        except click_exception as e:
            return [f"{' '.join(argv)}: {e.format_message()}"]
        return []
    if argv[0] == "alembic":
        problems = []
        config = argv[argv.index("-c") + 1] if "-c" in argv else "alembic.ini"
        if not (REPO / config).is_file():  # the Dockerfile copies the repo layout to /app
            problems.append(f"alembic config {config} does not exist")
        verbs = [a for a in argv[1:] if not a.startswith("-") and a != config]
        if not verbs or not callable(getattr(alembic.command, verbs[0], None)):
            problems.append(f"alembic has no command {verbs[:1]}")
        return problems
    return [f"unknown program {argv[0]!r} for the ModelFleet image"]


def route_paths() -> set[str]:
    """GET paths of the app, as its OpenAPI document lists them."""
    from server.app import create_app
    from server.jobs.interface import NullJobQueue

    app = create_app(Settings(data_dir=Path("/nonexistent-compose-check")),
                     job_queue=NullJobQueue())
    return {path for path, operations in app.openapi()["paths"].items() if "get" in operations}


def compose_problems(compose: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    services: dict[str, Any] = compose["services"]
    known = setting_names()
    routes = route_paths()
    declared_volumes = set(compose.get("volumes") or {})
    for name, svc in services.items():
        if ours(svc):
            command = svc.get("command")
            if not isinstance(command, list) or not command:
                problems.append(f"{name}: command must be an exec-form list")
            else:
                problems += [f"{name}: {p}" for p in command_problems(command)]
            for var in svc.get("environment") or {}:
                if var.startswith("MODELFLEET_") and var not in known:
                    problems.append(f"{name}: {var} is not a setting (server/settings.py)")
        test = (svc.get("healthcheck") or {}).get("test")
        if test and ours(svc):
            text = " ".join(test) if isinstance(test, list) else test
            paths = URL.findall(text)
            if not paths:
                problems.append(f"{name}: health check names no URL")
            for path in paths:
                if path not in routes:
                    problems.append(f"{name}: health check path {path} is not a route")
            port = re.search(r"--port (\d+)", " ".join(svc.get("command") or []))
            for url_port in re.findall(r"https?://[^:/]+:(\d+)", text):
                if port is not None and url_port != port.group(1):
                    problems.append(f"{name}: health check port {url_port} is not the "
                                    f"served --port {port.group(1)}")
        for target, rule in (svc.get("depends_on") or {}).items():
            if target not in services:
                problems.append(f"{name}: depends_on {target}, which is not a service")
                continue
            condition = (rule or {}).get("condition")
            if condition == "service_healthy" and "healthcheck" not in services[target]:
                problems.append(f"{name}: waits for {target} to be healthy; it has no "
                                "health check")
            if (condition == "service_completed_successfully"
                    and services[target].get("restart") not in (None, "no")):
                problems.append(f"{name}: waits for {target} to complete; it restarts")
        for volume in svc.get("volumes") or []:
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume["source"]
            if not source.startswith((".", "/", "~")) and source not in declared_volumes:
                problems.append(f"{name}: volume {source} is not declared")
    return problems


def test_every_service_refers_to_commands_settings_routes_and_volumes_that_exist() -> None:
    assert compose_problems(COMPOSE) == []


def test_the_deployment_has_its_production_roles() -> None:
    services = COMPOSE["services"]
    commands = {n: " ".join(s.get("command") or []) for n, s in services.items()}
    assert "serve" in commands["api"] and services["api"]["deploy"]["replicas"] >= 2
    assert "/readyz" in " ".join(services["api"]["healthcheck"]["test"])
    assert "--role compile" in commands["worker-compile"]
    assert "--role publish" in commands["worker-publish"]
    assert "upgrade head" in commands["migrate"]
    assert "mc mb" in services["minio-init"]["entrypoint"]
    for name in ("api", "worker-compile", "worker-publish"):
        assert services[name]["depends_on"]["migrate"]["condition"] == \
            "service_completed_successfully"
    # The compile role never sees the release key (docs/security.md).
    assert not any("/keys" in v for v in services["worker-compile"].get("volumes", []))


def test_the_production_environment_passes_the_settings_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared environment with its ${…} secrets filled in starts in production."""
    env = COMPOSE["services"]["api"]["environment"]
    for var, value in env.items():
        monkeypatch.setenv(var, INTERPOLATION.sub(
            lambda m: f"compose-check-{m.group(1).lower()}-0123456789", str(value)))
    settings = Settings()
    assert settings.env == "production" and settings.log_format == "json"
    assert settings.blob_store == "s3" and settings.job_backend == "procrastinate"


@pytest.mark.parametrize("break_it, expected", [
    (lambda c: c["services"]["api"]["command"].__setitem__(8, "--worker-count"),
     "No such option"),
    (lambda c: c["services"]["worker-compile"]["command"].__setitem__(1, "wrker"),
     "No such command"),
    (lambda c: c["services"]["worker-publish"]["command"].extend(["--metrics-port", "x"]),
     "valid integer"),
    (lambda c: c["services"]["migrate"]["command"].__setitem__(2, "migrations/nope.ini"),
     "does not exist"),
    (lambda c: c["services"]["api"]["environment"].__setitem__("MODELFLEET_LOG_FMT", "json"),
     "MODELFLEET_LOG_FMT is not a setting"),
    (lambda c: c["services"]["api"]["healthcheck"].__setitem__(
        "test", ["CMD", "curl", "-f", "http://127.0.0.1:8000/ready"]), "/ready is not a route"),
    (lambda c: c["services"]["api"]["healthcheck"].__setitem__(
        "test", ["CMD", "curl", "-f", "http://127.0.0.1:9999/readyz"]), "port 9999"),
    (lambda c: c["services"]["api"]["depends_on"].__setitem__("redis", None),
     "depends_on redis"),
    (lambda c: c["services"]["api"]["volumes"].append("cache:/cache"),
     "volume cache is not declared"),
])
def test_the_check_fails_when_something_is_renamed(break_it: Any, expected: str) -> None:
    broken = copy.deepcopy(COMPOSE)
    # The services share one environment mapping (a YAML anchor): copy it per service.
    for svc in broken["services"].values():
        if "environment" in svc:
            svc["environment"] = dict(svc["environment"])
    break_it(broken)
    problems = compose_problems(broken)
    assert any(expected in p for p in problems), problems


def test_the_device_cache_serves_the_bucket_the_api_writes_with_the_rendered_config() -> None:
    """Devices poll nginx in front of the bucket: its config is what server/publish/nginxconf.py
    renders for the bucket the API writes to, the bucket lets anyone read v1/ (and only v1/),
    and manifests send devices to the cache for artifacts and patches."""
    from server.publish.nginxconf import caching_proxy

    services = COMPOSE["services"]
    cache = services["device-cache"]
    env = services["api"]["environment"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in cache["volumes"]}
    conf = REPO / mounts["/etc/nginx/conf.d/default.conf"]
    rendered = caching_proxy(f"{env['MODELFLEET_S3_ENDPOINT_URL']}/{env['MODELFLEET_S3_BUCKET']}",
                             "8080", "/var/cache/nginx/devices")
    body = "".join(line + "\n" for line in conf.read_text().splitlines()
                   if not line.startswith("#"))
    assert body == rendered, "regenerate deploy/nginx/device-cache.conf (see its header)"
    assert mounts["/var/cache/nginx"] in COMPOSE["volumes"]
    assert cache["ports"] == ["8080:8080"]
    assert cache["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    bucket = env["MODELFLEET_S3_BUCKET"]
    assert f"mc anonymous set download local/{bucket}/v1" in services["minio-init"]["entrypoint"]
    assert env["MODELFLEET_PUBLIC_BASE_URL"].endswith(":-http://localhost:8080}")
