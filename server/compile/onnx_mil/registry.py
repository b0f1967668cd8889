"""The ONNX → MIL rule registry: one function per ONNX operator (default domain), registered
with the opset range it implements.

    @onnx_op("Conv", since=1)
    def conv(ctx: NodeContext) -> Outputs: ...

A rule receives the node's context (inputs as numpy constants or MIL vars, attributes, the
opset) and returns one value per ONNX output (a MIL var, a numpy constant, or None for an
output the graph does not use). `rule_for(op_type, opset)` picks the rule whose range holds
the model's opset; `claimed_ops()` is the set the converter claims (the conformance suite and
the Core ML support gate read it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.compile.onnx_mil.context import NodeContext

Outputs = list[Any]
RuleFn = Callable[["NodeContext"], Outputs]
NEWEST_OPSET = 28  # the newest default-domain opset rules are written against


@dataclass(frozen=True)
class Rule:
    op_type: str
    since: int
    until: int  # inclusive
    fn: RuleFn


_RULES: dict[str, list[Rule]] = {}


def onnx_op(*op_types: str, since: int = 1, until: int = NEWEST_OPSET
            ) -> Callable[[RuleFn], RuleFn]:
    """Registers `fn` for each op type over opsets [since, until]."""
    def register(fn: RuleFn) -> RuleFn:
        for op in op_types:
            rules = _RULES.setdefault(op, [])
            rules[:] = [r for r in rules if r.until < since or r.since > until]
            rules.append(Rule(op, since, until, fn))
        return fn
    return register


def rule_for(op_type: str, opset: int) -> Rule | None:
    for r in _RULES.get(op_type, []):
        if r.since <= opset <= r.until:
            return r
    return None


def opset_range(op_type: str) -> tuple[int, int] | None:
    """The lowest and highest opset any rule of `op_type` covers, or None if unclaimed."""
    rules = _RULES.get(op_type)
    if not rules:
        return None
    return min(r.since for r in rules), max(r.until for r in rules)


def claimed_ops() -> set[str]:
    return set(_RULES)
