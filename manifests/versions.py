"""Version numbers and version ranges for the OS / app version filters, compared numerically.

Grammar (ABNF; SP is U+0020 only)::

    range      = clause *( *SP "," *SP clause )      ; every clause must hold (AND)
    clause     = *SP operator *SP version *SP
    operator   = ">=" / "<=" / ">" / "<" / "==" / "!="
    version    = number *( "." number )              ; at most 8 components
    number     = 1*9DIGIT                            ; decimal, leading zeros allowed

Versions compare as tuples of integers after padding the shorter with zeros, so
"14.10" > "14.9" and "14" == "14.0". A filter lists several ranges; a device version
matches the filter when it satisfies ANY of them. A device version that is not a ``version``
(e.g. "17.2-beta") matches no range: SDKs must report the plain numeric version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import MalformedError

MAX_COMPONENTS = 8
_VERSION = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9}){0,7}")  # 8 components at most
_CLAUSE = re.compile(r" *(>=|<=|==|!=|>|<) *(" + _VERSION.pattern + ") *")
OPERATORS = (">=", "<=", ">", "<", "==", "!=")


def parse_version(text: str) -> tuple[int, ...] | None:
    """The numeric components of ``text``, trailing zeros dropped; None if not a version."""
    if not _VERSION.fullmatch(text):
        return None
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _compare(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    width = max(len(a), len(b))
    pa, pb = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (pa > pb) - (pa < pb)


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as ``a`` is lower than, equal to or higher than ``b``.

    Raises:
        ValueError: either string is not a version.
    """
    va, vb = parse_version(a), parse_version(b)
    if va is None or vb is None:
        raise ValueError(f"not a version: {a!r} or {b!r}")
    return _compare(va, vb)


@dataclass(frozen=True)
class VersionRange:
    """A parsed range string: a conjunction of (operator, version) clauses."""

    clauses: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def parse(cls, text: str) -> VersionRange:
        """Parse a range string.

        Raises:
            MalformedError: ``text`` does not follow the grammar in the module docstring.
        """
        clauses: list[tuple[str, tuple[int, ...]]] = []
        for piece in text.split(","):
            m = _CLAUSE.fullmatch(piece)
            version = parse_version(m.group(2)) if m else None
            if m is None or version is None:
                raise MalformedError(
                    f"version range {text!r}: clause {piece!r} is not <op><version> "
                    f"with op one of {', '.join(OPERATORS)} (e.g. '>=14.0,<18')"
                )
            clauses.append((m.group(1), version))
        return cls(tuple(clauses))

    def contains(self, version: str) -> bool:
        """True when ``version`` satisfies every clause; False if it is not a version."""
        v = parse_version(version)
        if v is None:
            return False
        for op, bound in self.clauses:
            c = _compare(v, bound)
            ok = {
                ">=": c >= 0, "<=": c <= 0, ">": c > 0, "<": c < 0, "==": c == 0, "!=": c != 0,
            }[op]
            if not ok:
                return False
        return True


def matches_any(ranges: list[str], version: str) -> bool:
    """True when ``ranges`` is empty (no constraint) or ``version`` is in at least one range."""
    if not ranges:
        return True
    return any(VersionRange.parse(r).contains(version) for r in ranges)
