"""ASGI factory for the serving benchmark: the real app from MODELFLEET_* settings
(`uvicorn bench.serve.app:make_app --factory --workers N`)."""

from __future__ import annotations

from fastapi import FastAPI

from server.app import create_app
from server.settings import Settings


def make_app() -> FastAPI:
    return create_app(Settings())
