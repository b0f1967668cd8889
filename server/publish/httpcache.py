"""HTTP conditional and range request rules used by the serving routes (pure functions).

- ETags are strong: the quoted lowercase hex sha256 of the exact bytes served.
- If-None-Match uses the weak comparison RFC 9110 §13.1.2 prescribes (W/ prefixes ignored).
- Range: one `bytes=` range (a-b, a-, -n); several ranges, or a header we cannot parse, are
  ignored (a full 200 is allowed by RFC 9110 §14.2); an unsatisfiable one is a 416.
"""

from __future__ import annotations

from dataclasses import dataclass

# What never changes under its URL (a root version, content-addressed blobs): cache for a year.
IMMUTABLE_CACHE_CONTROL = "public, max-age=31536000, immutable"


def etag_for(sha256: str) -> str:
    return f'"{sha256}"'


def if_none_match(header: str | None, etag: str) -> bool:
    """True when the request's If-None-Match matches `etag` (so the answer is 304)."""
    if not header:
        return False
    if header.strip() == "*":
        return True
    bare = etag.removeprefix("W/")
    return any(tag.strip().removeprefix("W/") == bare for tag in header.split(","))


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # exclusive

    @property
    def length(self) -> int:
        return self.end - self.start

    def content_range(self, total: int) -> str:
        return f"bytes {self.start}-{self.end - 1}/{total}"


class RangeNotSatisfiable(Exception):
    """The range lies outside the representation: answer 416 with `bytes */length`."""


def parse_range(header: str | None, length: int) -> ByteRange | None:
    """The single byte range asked for, None for "send everything", or RangeNotSatisfiable."""
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    first, last = first.strip(), last.strip()
    if not (first.isdigit() or first == "") or not (last.isdigit() or last == ""):
        return None
    if first == "":
        if last == "":
            return None
        suffix = int(last)
        if suffix == 0:
            raise RangeNotSatisfiable
        return ByteRange(max(0, length - suffix), length)
    start = int(first)
    if last != "" and int(last) < start:
        return None  # syntactically invalid: ignore the header
    if start >= length:
        raise RangeNotSatisfiable
    end = length if last == "" else min(int(last) + 1, length)
    return ByteRange(start, end)
