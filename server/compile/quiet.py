"""`quiet()`: silences the exporters' and converters' progress chatter during a compile.

A module of its own because both the source loader (source.py) and the shape specializer
(shapes.py) use it, and source.py calls the specializer: neither may import the other back.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silences the exporters' progress chatter; the job log records our own summary."""
    sink = io.StringIO()
    level = logging.getLogger("torch").level
    logging.getLogger("torch").setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        logging.getLogger("torch").setLevel(level)
