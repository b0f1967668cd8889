"""The ASGI app for an external server (`uvicorn server.asgi:app --workers N`), configured
from `MODELFLEET_*` environment variables. Migrations are not run here: run
`alembic -c migrations/alembic.ini upgrade head` once before starting replicas (the
docker-compose `migrate` service does)."""

from __future__ import annotations

from server.app import create_app
from server.settings import Settings

app = create_app(Settings())
