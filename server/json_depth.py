"""How deeply JSON text nests, measured without parsing it.

Python's `json` parser recurses once per `[`/`{`: a small document nested 60 000 deep raises
`RecursionError` (a 500, and a thread's stack spent) instead of a clean 422. Every JSON body
and JSON form field is checked here first. The scan is C-speed string work (strip string
literals, keep only brackets, peel innermost pairs `limit` times), so a 1 MiB body costs
milliseconds; a body without backslashes (no escaped quotes) takes a shortcut to the same
answer at a fraction of that.
"""

from __future__ import annotations

import re

MAX_JSON_DEPTH = 16  # the API's documents nest 4 deep; 16 leaves room and stops attacks

# A JSON string literal (escapes included); brackets inside strings do not nest anything.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]")
_OTHER_BYTES = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_QUOTE_OR_BRACKET = bytes(b for b in range(256) if b not in b'"[]{}')


def too_deep(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when arrays/objects in `raw` nest deeper than `limit`, or when its brackets do
    not balance (such text would recurse in the parser before it is found malformed)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    brackets = _brackets_outside_strings(data)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


def _brackets_outside_strings(data: bytes) -> bytes:
    """The brackets of `data` that `_STRING` leaves outside string literals, as `[` / `]`."""
    skeleton = data.translate(None, _NOT_QUOTE_OR_BRACKET)
    if b"\\" in data or skeleton.count(b'"') % 2:
        return _STRING.sub(b"", data).translate(_BRACKETS_ONLY, _OTHER_BYTES)
    # No escapes and every quote closed: a literal runs from one quote to the next, as
    # `_STRING` pairs them, and dropping everything but quotes and brackets keeps that
    # pairing. Two adjacent quotes enclose nothing either way (an empty string, or the gap
    # between two strings), so they go first, cheaply.
    return b"".join(skeleton.replace(b'""', b"").split(b'"')[::2]).translate(_BRACKETS_ONLY)


def depth_error(limit: int = MAX_JSON_DEPTH) -> str:
    return f"JSON nests deeper than {limit} levels (or its brackets do not balance)"
