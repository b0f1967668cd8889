"""Strict JSON for signed data: parse refuses anything two languages could read differently.

Refused (``MalformedError``): bytes that are not UTF-8 (or start with a BOM), duplicate object
keys, NaN/Infinity, any number with a fraction or exponent (floats), integers outside
±(2^53-1), strings holding lone surrogates, a top level that is not an object, nesting deeper
than ``MAX_DEPTH`` (64) arrays/objects. These are the I-JSON (RFC 7493) rules plus "integers
only".

``dumps`` writes the one serialization the library signs: sorted keys, no whitespace, UTF-8
(not ``\\u`` escapes). Verifiers never re-serialize; they verify the bytes they received.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn, TypeAlias

from .errors import MalformedError

JSONValue: TypeAlias = bool | int | str | list["JSONValue"] | dict[str, "JSONValue"] | None
JSONObject: TypeAlias = dict[str, JSONValue]

MAX_SAFE_INTEGER = 2**53 - 1
# Real documents nest fewer than 12 levels; a fixed cap makes "too deep" the same everywhere.
MAX_DEPTH = 64
# More digits than this cannot be a safe integer; refusing early keeps int() cheap.
_MAX_INT_DIGITS = 16


def _reject_constant(name: str) -> NoReturn:
    raise MalformedError(f"JSON constant {name} is not allowed in signed data")


def _reject_float(text: str) -> NoReturn:
    raise MalformedError(
        f"number {text[:40]} has a fraction or exponent; signed data holds integers only"
    )


def _parse_int(text: str) -> int:
    if len(text) < 16:  # at most 15 characters: |value| < 10^15 < 2^53, always safe
        return int(text)  # (the common case, once per integer of every signed body)
    digits = text.lstrip("-")
    if len(digits) > _MAX_INT_DIGITS or abs(int(text)) > MAX_SAFE_INTEGER:
        raise MalformedError(
            f"integer {text[:40]} is outside ±(2^53-1), the range every JSON reader holds exactly"
        )
    return int(text)


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)  # C speed; a duplicate key leaves fewer entries than pairs
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise MalformedError(f"duplicate JSON object key {key!r}")
            seen.add(key)
    return obj


def _check_string(value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MalformedError("JSON string holds a lone surrogate (invalid Unicode)") from e


def _check_tree(value: Any) -> None:
    """Walk the parsed value iteratively: strings (keys too) must be valid Unicode, depth <=
    MAX_DEPTH."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _check_string(node)
        elif isinstance(node, (list, dict)):
            if depth > MAX_DEPTH:
                raise MalformedError(f"JSON nests deeper than {MAX_DEPTH} levels")
            if isinstance(node, dict):
                for key in node:
                    _check_string(key)
                children: Any = node.values()
            else:
                children = node
            stack.extend((child, depth + 1) for child in children)


def _tree_needs_check(text: str) -> bool:
    """False when the text cannot break the tree rules: a lone surrogate needs a `\\u`
    escape (the text itself is valid UTF-8), and nesting deeper than MAX_DEPTH needs more
    than MAX_DEPTH brackets (brackets inside strings only make this answer "check")."""
    return "\\u" in text or text.count("{") + text.count("[") > MAX_DEPTH


def loads(data: bytes, *, what: str = "document") -> JSONObject:
    """Parse ``data`` as strict JSON whose top level is an object.

    Raises:
        MalformedError: for any of the refusals listed in the module docstring.
    """
    if data.startswith(b"\xef\xbb\xbf"):
        raise MalformedError(f"{what} starts with a UTF-8 byte order mark")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedError(f"{what} is not valid UTF-8: {e.reason} at byte {e.start}") from e
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object_without_duplicates,
            parse_constant=_reject_constant,
            parse_float=_reject_float,
            parse_int=_parse_int,
        )
    except MalformedError as e:
        raise MalformedError(f"{what}: {e}") from None
    except json.JSONDecodeError as e:
        raise MalformedError(
            f"{what} is not JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from e
    except RecursionError as e:
        raise MalformedError(f"{what} is nested too deeply") from e
    try:
        if _tree_needs_check(text):
            _check_tree(value)
    except MalformedError as e:
        raise MalformedError(f"{what}: {e}") from None
    if not isinstance(value, dict):
        raise MalformedError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def dumps(value: JSONValue) -> bytes:
    """Serialize deterministically: sorted keys, compact separators, UTF-8."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
