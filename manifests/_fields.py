"""Typed field extraction for document parsing: every check names the JSON path that failed.

``Fields`` wraps one JSON object; each accessor returns a typed value or raises
``MalformedError``; ``extra()`` returns the keys no accessor asked for, which documents keep
so that an older client can carry fields a newer publisher added.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from .errors import MalformedError
from .strictjson import MAX_SAFE_INTEGER, JSONObject, JSONValue

T = TypeVar("T")

# Names end up in URLs and on-device file paths: no separators, no "..", no leading dot.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}"
SHA256_PATTERN = r"[0-9a-f]{64}"
_NAME = re.compile(NAME_PATTERN)
_SHA256 = re.compile(SHA256_PATTERN)
_URL = re.compile(r"[!-~]{1,4096}")  # printable ASCII, no spaces or control characters


class Fields:
    """Accessors over one JSON object found at ``path``."""

    def __init__(self, value: JSONValue, path: str) -> None:
        if not isinstance(value, dict):
            raise MalformedError(f"{path} must be a JSON object")
        self.obj: JSONObject = value
        self.path = path
        self._seen: set[str] = set()

    def _get(self, key: str, required: bool) -> JSONValue:
        self._seen.add(key)
        if key not in self.obj:
            if required:
                raise MalformedError(f"{self.path}.{key} is required")
            return None
        return self.obj[key]

    def fail(self, key: str, why: str) -> MalformedError:
        return MalformedError(f"{self.path}.{key} {why}")

    def string(self, key: str, *, max_len: int = 1024, allow_empty: bool = False) -> str:
        value = self._get(key, True)
        if not isinstance(value, str):
            raise self.fail(key, "must be a string")
        if not value and not allow_empty:
            raise self.fail(key, "must not be empty")
        if len(value) > max_len:
            raise self.fail(key, f"is longer than {max_len} characters")
        return value

    def name(self, key: str, *, allow_empty: bool = False) -> str:
        value = self.string(key, allow_empty=allow_empty)
        if value and not _NAME.fullmatch(value):
            raise self.fail(key, f"{value[:60]!r} is not a name (letters, digits, . _ + -; "
                                 "starts with a letter or digit; at most 128)")
        return value

    def sha256(self, key: str) -> str:
        value = self.string(key)
        if not _SHA256.fullmatch(value):
            raise self.fail(key, "must be 64 lowercase hex digits (a sha256)")
        return value

    def url(self, key: str) -> str:
        value = self.string(key, max_len=4096)
        if not _URL.fullmatch(value):
            raise self.fail(key, "must be printable ASCII without spaces (percent-encode the rest)")
        return value

    def integer(self, key: str, *, minimum: int = 0, maximum: int = MAX_SAFE_INTEGER) -> int:
        value = self._get(key, True)
        # bool is an int in Python but not in JSON.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(key, "must be an integer")
        if not minimum <= value <= maximum:
            raise self.fail(key, f"must be between {minimum} and {maximum}, got {value}")
        return value

    def literal(self, key: str, allowed: tuple[str, ...]) -> str:
        value = self.string(key)
        if value not in allowed:
            raise self.fail(key, f"must be one of {', '.join(allowed)}, got {value[:60]!r}")
        return value

    def array(self, key: str, item: Callable[[JSONValue, str], T], *, required: bool = True,
              max_items: int = 100_000) -> list[T]:
        value = self._get(key, required)
        if value is None and not required:
            return []
        if not isinstance(value, list):
            raise self.fail(key, "must be a list")
        if len(value) > max_items:
            raise self.fail(key, f"has more than {max_items} items")
        return [item(v, f"{self.path}.{key}[{i}]") for i, v in enumerate(value)]

    def mapping(self, key: str, item: Callable[[JSONValue, str], T], *, required: bool = True,
                key_check: Callable[[str], bool] | None = None, key_rule: str = "",
                max_items: int = 100_000) -> dict[str, T]:
        value = self._get(key, required)
        if value is None and not required:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, "must be an object")
        if len(value) > max_items:
            raise self.fail(key, f"has more than {max_items} entries")
        out: dict[str, T] = {}
        for k, v in value.items():
            if key_check is not None and not key_check(k):
                raise self.fail(key, f"key {k[:60]!r} is not {key_rule}")
            out[k] = item(v, f"{self.path}.{key}[{k!r}]")
        return out

    def optional_object(self, key: str) -> JSONValue:
        """The raw value if present and not null, else None (caller parses it)."""
        return self._get(key, False)

    def extra(self) -> JSONObject:
        return {k: v for k, v in self.obj.items() if k not in self._seen}


def is_name(value: str) -> bool:
    return _NAME.fullmatch(value) is not None


def is_sha256(value: str) -> bool:
    return _SHA256.fullmatch(value) is not None


def string_item(value: JSONValue, path: str) -> str:
    if not isinstance(value, str):
        raise MalformedError(f"{path} must be a string")
    return value


def nonempty_string_item(value: JSONValue, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise MalformedError(f"{path} must be a non-empty string")
    return value


def merge_extra(known: JSONObject, extra: JSONObject) -> JSONObject:
    """Known fields win over preserved unknown ones (they cannot collide after parsing)."""
    return {**extra, **known}
