"""Database layer: SQLAlchemy 2 models (`server.db.models`), engine/session factory
(`server.db.session`) and programmatic Alembic upgrades (`server.db.migrate`)."""
