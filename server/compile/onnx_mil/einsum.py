"""Einsum lowered to the matrix product it is: reduce_sum over letters only one operand has,
transpose + reshape into (batch, free, contracted) blocks, one matmul, reshape + transpose to
the output order. Covers one- and two-operand equations (with `...`); a repeated letter within
one operand (a diagonal) is refused, naming the equation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from coremltools.converters.mil import Builder as mb

from server.compile.onnx_mil.context import NodeContext, shape_of


def _parse(ctx: NodeContext, equation: str, ranks: list[int]) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        ctx.fail(f"Einsum equation {equation!r} names {len(terms)} operands, got {len(ranks)}")
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    ell_rank = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks, strict=True)
                    if "..." in t), default=0)
    ell = "".join(spare[:ell_rank])
    out_terms = []
    for t, r in zip(terms, ranks, strict=True):
        n = r - len(t.replace("...", ""))
        out_terms.append(t.replace("...", ell[ell_rank - n:]) if "..." in t else t)
    if "->" in eq:
        out = rhs.replace("...", ell)
    else:
        letters = "".join(out_terms)
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1
                                   and c not in ell))
    for t in out_terms:
        if len(set(t)) != len(t):
            ctx.fail(f"Einsum {equation!r}: a letter repeated within one operand (a diagonal) "
                     "is not converted")
    return out_terms, out


def _sum_out(ctx: NodeContext, x: Any, term: str, keep: set[str]) -> tuple[Any, str]:
    drop = [i for i, c in enumerate(term) if c not in keep]
    if not drop:
        return x, term
    y = mb.reduce_sum(x=x, axes=drop, keep_dims=False, name=ctx.tmp())
    return y, "".join(c for c in term if c in keep)


def _arrange(ctx: NodeContext, x: Any, term: str, order: str) -> Any:
    perm = [term.index(c) for c in order]
    return x if perm == list(range(len(perm))) else mb.transpose(x=x, perm=perm, name=ctx.tmp())


def lower_einsum(ctx: NodeContext, equation: str, xs: list[Any]) -> Any:
    terms, out = _parse(ctx, equation, [len(shape_of(x)) for x in xs])
    if len(xs) == 1:
        y, t = _sum_out(ctx, xs[0], terms[0], set(out))
        return mb.identity(x=_arrange(ctx, y, t, out), name=ctx.name())
    if len(xs) != 2:
        ctx.fail(f"Einsum {equation!r} with {len(xs)} operands: only one or two are converted")
    (a, ta), (b, tb) = (_sum_out(ctx, xs[0], terms[0], set(out) | set(terms[1])),
                        _sum_out(ctx, xs[1], terms[1], set(out) | set(terms[0])))
    dims = {c: d for x, t in ((a, ta), (b, tb)) for c, d in zip(t, shape_of(x), strict=True)}
    batch = "".join(c for c in ta if c in tb and c in out)
    contract = "".join(c for c in ta if c in tb and c not in out)
    free_a = "".join(c for c in ta if c not in tb)
    free_b = "".join(c for c in tb if c not in ta)

    def block(letters: str) -> int:
        return int(np.prod([dims[c] for c in letters])) if letters else 1

    am = mb.reshape(x=_arrange(ctx, a, ta, batch + free_a + contract),
                    shape=[block(batch), block(free_a), block(contract)], name=ctx.tmp())
    bm = mb.reshape(x=_arrange(ctx, b, tb, batch + contract + free_b),
                    shape=[block(batch), block(contract), block(free_b)], name=ctx.tmp())
    prod = mb.matmul(x=am, y=bm, name=ctx.tmp())
    got = batch + free_a + free_b
    y = mb.reshape(x=prod, shape=[dims[c] for c in got] or [1], name=ctx.tmp())
    if not got:
        return mb.reshape(x=y, shape=np.zeros((0,), np.int32), name=ctx.name())
    return mb.identity(x=_arrange(ctx, y, got, out), name=ctx.name())
