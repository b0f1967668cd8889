"""Strict JSON: everything two languages could read differently is refused."""

from __future__ import annotations

import pytest

from manifests import MAX_SAFE_INTEGER, MalformedError
from manifests.strictjson import dumps, loads


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"a": 1, "a": 2}', "duplicate"),
        (b'{"a": {"b": 1, "b": 1}}', "duplicate"),
        (b'{"a": NaN}', "NaN"),
        (b'{"a": Infinity}', "Infinity"),
        (b'{"a": -Infinity}', "Infinity"),
        (b'{"a": 1.5}', "fraction or exponent"),
        (b'{"a": 1.0}', "fraction or exponent"),
        (b'{"a": 1e3}', "fraction or exponent"),
        (b'{"a": 9007199254740992}', r"2\^53"),
        (b'{"a": -9007199254740992}', r"2\^53"),
        (b'{"a": 123456789012345678901234567890}', r"2\^53"),
        (b'[1, 2]', "must be a JSON object"),
        (b'"x"', "must be a JSON object"),
        (b'{"a": "\\ud800"}', "surrogate"),
        (b'{"\\udfff": 1}', "surrogate"),
        (b'\xef\xbb\xbf{}', "byte order mark"),
        (b'{"a": "\xff"}', "UTF-8"),
        (b'{"a": 1', "not JSON"),
        (b'{"a": 1} x', "not JSON"),
        (b'[' * 100_000 + b']' * 100_000, "nested too deeply"),
        (b'{"a":' + b'[' * 64 + b']' * 64 + b'}', "deeper than 64"),
        (b'{"a":' * 65 + b'1' + b'}' * 65, "deeper than 64"),
    ],
)
def test_loads_refuses_ambiguous_json(data: bytes, reason: str) -> None:
    with pytest.raises(MalformedError, match=reason):
        loads(data)


def test_loads_accepts_safe_integer_edges() -> None:
    assert loads(b'{"a": 9007199254740991, "b": -9007199254740991, "c": -0}') == {
        "a": MAX_SAFE_INTEGER, "b": -MAX_SAFE_INTEGER, "c": 0,
    }


def test_dumps_is_sorted_compact_utf8() -> None:
    assert dumps({"b": "é", "a": [1, None, True]}) == '{"a":[1,null,true],"b":"é"}'.encode()


def test_loads_accepts_depth_64() -> None:
    assert loads(b'{"a":' * 63 + b"1" + b"}" * 63)
