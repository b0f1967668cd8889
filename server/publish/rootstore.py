"""Signed root versions in the database, where every API replica serves them from.

`sync_roots` imports the roots written by `modelfleet keys init/rotate` (DATA_DIR/roots/) after
checking the chain verifies; a stored version whose bytes differ from the file is refused, since
devices may already trust the stored one.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.db import models as db
from server.publish.errors import KeyStoreError
from server.publish.keys import KeyPaths, load_root_chain, root_versions


def sync_roots(session: Session, paths: KeyPaths) -> list[int]:
    """Store every root version on disk that the database lacks; returns the versions added."""
    if not root_versions(paths):
        return []
    stored = {r.version: r for r in session.scalars(select(db.RootDocument))}
    added = []
    for root, data in load_root_chain(paths):
        sha = hashlib.sha256(data).hexdigest()
        row = stored.get(root.version)
        if row is None:
            session.add(db.RootDocument(version=root.version, data=data, sha256=sha))
            added.append(root.version)
        elif row.sha256 != sha:
            raise KeyStoreError(
                f"root v{root.version} in {paths.roots_dir} differs from the one already served; "
                f"devices may trust the served one — restore the matching keys directory"
            )
    session.flush()
    return added


def root_bytes(session: Session, version: int) -> bytes | None:
    return session.scalar(select(db.RootDocument.data).where(db.RootDocument.version == version))


def latest_root_version(session: Session) -> int | None:
    return session.scalar(select(func.max(db.RootDocument.version)))
