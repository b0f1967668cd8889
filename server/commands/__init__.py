"""CLI command modules of the server, one per area (see server/cli.py)."""
