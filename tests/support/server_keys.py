"""A server data directory's signing keys for tests, made by the production key manager
(``server.publish.keys.init_keys``, what ``modelfleet keys init`` runs): root v1 signed by
``root_keys`` offline root keys (threshold 1) and one online release key.

Documents signed by hand-built keys (no server involved) come from tests.support.signing.
"""

from __future__ import annotations

import time
from pathlib import Path

from server.publish.keys import KeyPaths, init_keys


def init_test_keys(data_dir: Path, *, root_keys: int = 1, now: int | None = None,
                   keys_dir: Path | None = None) -> KeyPaths:
    """Create the keys and root v1 under ``data_dir`` (or ``keys_dir``); returns their paths."""
    paths = KeyPaths.for_data_dir(data_dir, keys_dir=keys_dir)
    init_keys(paths, now=int(time.time()) if now is None else now, root_keys=root_keys,
              threshold=1)
    return paths
