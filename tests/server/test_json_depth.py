"""The nesting check every JSON body passes first (server/json_depth.py): its shortcut for
text without escapes answers what the full scan answers, for any bytes."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from server.json_depth import MAX_JSON_DEPTH, too_deep

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def reference_too_deep(data: bytes, limit: int) -> bool:
    """The full scan: string literals out, brackets kept, innermost pairs peeled."""
    brackets = _STRING.sub(b"", data).translate(bytes.maketrans(b"{}", b"[]"),
                                                bytes(b for b in range(256) if b not in b"[]{}"))
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=40) | st.lists(st.sampled_from(
    [b'"', b"[", b"]", b"{", b"}", b"a", b"\\", b'\\"', b'""', b":"]), max_size=40).map(
        b"".join), st.integers(0, 6))
def test_the_depth_answer_is_the_full_scans_for_any_bytes(data: bytes, limit: int) -> None:
    assert too_deep(data, limit) == reference_too_deep(data, limit)


def test_brackets_inside_strings_do_not_nest() -> None:
    body = b'{"a":"' + b"[" * 100 + b'","b":[{"c":"}}}"}]}'
    assert not too_deep(body) and not too_deep(body.decode())
    assert too_deep(b'{"a":' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}")
    assert too_deep(b'{"a":"x", "b":[')  # unbalanced
    assert too_deep(b'{"a":"\\"[[[[[[[[[[[[[[[[[[["}') is False  # an escaped quote
    assert too_deep(b'{"a":"[[[[[[[[[[[[[[[[[[[[')  # unclosed: its brackets count
