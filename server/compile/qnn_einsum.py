"""Einsum as Transpose / Reshape / MatMul, for the QNN HTP (which has no general Einsum).

A two-operand equation with an explicit output is a (batched, grouped) matrix product when
every index is one of:
- batch: in both operands and the output (e.g. `g` in `btgi,gih->btgh`);
- left / right free: in one operand and the output (`b`, `t` / `h`);
- contracted: in both operands, not in the output (`i`).

Such an equation becomes: each operand transposed to (batch…, free…, contracted…) /
(batch…, contracted…, free…) and reshaped to 3-D, one MatMul, a Reshape back to the named
dims and a Transpose to the output's order (identity transposes and reshapes are left out).
Any other form (an index summed in one operand only, a repeated index, an ellipsis, one or
three operands, no `->`) raises `ValueError` naming what the equation does that a matrix
product does not; the node then stays where the HTP probe put it and the report names it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def parse(equation: str) -> tuple[str, str, str]:
    """(left, right, output) index strings of a matrix-product equation, or ValueError."""
    eq = equation.replace(" ", "")
    if "..." in eq:
        raise ValueError(f"Einsum {equation!r} uses an ellipsis; declare every index")
    if "->" not in eq:
        raise ValueError(f"Einsum {equation!r} has no explicit output ('->')")
    ins, out = eq.split("->")
    operands = ins.split(",")
    if len(operands) != 2:
        raise ValueError(f"Einsum {equation!r} has {len(operands)} operand(s); only two-"
                         "operand matrix products are rewritten")
    a, b = operands
    for name, idx in (("first operand", a), ("second operand", b), ("output", out)):
        repeated = sorted({c for c in idx if idx.count(c) > 1})
        if repeated:
            raise ValueError(f"Einsum {equation!r} repeats index {''.join(repeated)} in the "
                             f"{name} (a diagonal or trace, not a matrix product)")
    for c in out:
        if c not in a and c not in b:
            raise ValueError(f"Einsum {equation!r}: output index {c} is in no operand")
    for c in set(a) ^ set(b):
        if c not in out:
            raise ValueError(f"Einsum {equation!r} sums index {c} over one operand only "
                             "(a reduction, not a matrix product)")
    return a, b, out


def plan(equation: str) -> dict[str, str]:
    """The index groups: batch, left free (m), right free (n), contracted (k)."""
    a, b, out = parse(equation)
    return {"batch": "".join(c for c in out if c in a and c in b),
            "m": "".join(c for c in a if c in out and c not in b),
            "n": "".join(c for c in b if c in out and c not in a),
            "k": "".join(c for c in a if c in b and c not in out)}


def build(b: Any, node: Any, shapes: dict[str, Any]) -> str:
    """Emits the rewrite of Einsum `node` through the qnn_prep builder `b`."""
    equation = next(a.s.decode() for a in node.attribute if a.name == "equation")
    left, right, out = parse(equation)
    sa, sb = shapes.get(node.input[0]), shapes.get(node.input[1])
    if not sa or not sb or len(sa) != len(left) or len(sb) != len(right):
        raise ValueError(f"Einsum {equation!r} needs static input shapes")
    g = plan(equation)
    size = {**dict(zip(left, sa, strict=True)), **dict(zip(right, sb, strict=True))}
    for c in g["batch"] + g["k"]:
        da, db = sa[left.index(c)], sb[right.index(c)]
        if da != db:  # broadcasting a batch dim of 1 is not a matrix product here
            raise ValueError(f"Einsum {equation!r}: index {c} has size {da} and {db}")

    def n(idx: str) -> int:
        return int(np.prod([size[c] for c in idx], dtype=np.int64)) if idx else 1

    x = _arrange(b, node.input[0], left, g["batch"] + g["m"] + g["k"],
                 [n(g["batch"]), n(g["m"]), n(g["k"])])
    y = _arrange(b, node.input[1], right, g["batch"] + g["k"] + g["n"],
                 [n(g["batch"]), n(g["k"]), n(g["n"])])
    prod = b.op("MatMul", [x, y])
    named = g["batch"] + g["m"] + g["n"]
    prod = b.op("Reshape", [prod, b.const([size[c] for c in named], np.int64)])
    perm = [named.index(c) for c in out]
    if perm != list(range(len(perm))):
        prod = b.op("Transpose", [prod], perm=perm)
    b.op("Identity", [prod], node.output[0])
    return (f"Einsum {equation!r} as a batched MatMul (batch {g['batch'] or '-'}, "
            f"rows {g['m'] or '-'}, columns {g['n'] or '-'}, contracted {g['k'] or '-'})")


def _arrange(b: Any, x: str, have: str, want: str, shape3: list[int]) -> str:
    perm = [have.index(c) for c in want]
    if perm != list(range(len(perm))):
        x = b.op("Transpose", [x], perm=perm)
    return str(b.op("Reshape", [x, b.const(shape3, np.int64)]))
