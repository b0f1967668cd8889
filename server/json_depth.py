"""How deeply JSON text nests, measured without parsing it.

Python's `json` parser recurses once per `[`/`{`: a small document nested 60 000 deep raises
`RecursionError` (a 500, and a thread's stack spent) instead of a clean 422. Every JSON body
and JSON form field is checked here first. The scan is C-speed string work (strip string
literals, keep only brackets, peel innermost pairs `limit` times), so a 1 MiB body costs
milliseconds.
"""

from __future__ import annotations

import re

MAX_JSON_DEPTH = 16  # the API's documents nest 4 deep; 16 leaves room and stops attacks

# A JSON string literal (escapes included); brackets inside strings do not nest anything.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]")
_OTHER_BYTES = bytes(b for b in range(256) if b not in b"[]{}")


def too_deep(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when arrays/objects in `raw` nest deeper than `limit`, or when its brackets do
    not balance (such text would recurse in the parser before it is found malformed)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    brackets = _STRING.sub(b"", data).translate(_BRACKETS_ONLY, _OTHER_BYTES)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


def depth_error(limit: int = MAX_JSON_DEPTH) -> str:
    return f"JSON nests deeper than {limit} levels (or its brackets do not balance)"
