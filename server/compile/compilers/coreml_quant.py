"""Core ML weight compression through `coremltools.optimize.coreml`: which schemes a version can
ask for, the deployment target each needs, and applying one to a converted ML Program.

Schemes (`weight_compression`):
- `int8`: linear symmetric INT8, one scale per output channel;
- `int8-block<N>` / `int4-block<N>`: linear symmetric INT8 / INT4 with one scale per block of
  N input-channel weights (coremltools' `granularity="per_block"`), which Core ML stores as
  `constexpr_blockwise_shift_scale`: an iOS18 / macOS15 op, so these need that target; a
  weight whose input channels N does not divide gets INT8 per output channel instead (not
  FP16, coremltools' own fallback), unless N divides no weight at all (refused);
- `palettize<B>` (B in 1, 2, 3, 4, 6, 8): a 2^B-entry lookup table per tensor
  (`constexpr_lut_to_dense`).

`keep_ops` names MIL ops whose weights stay uncompressed (mixed precision: the precision
search keeps the layers that lose the most at FP16 this way, via `op_name_configs`); a
weight a kept op shares with other ops stays uncompressed for all of them.

Only weights are compressed: a const that no op with a weight layout reads (`WEIGHT_READERS`)
stays FP16 (`folded_activations`). Such consts are activations the converter folded for a
static shape — position embeddings gathered at fixed positions, `[1, seq, hidden]` tables an
`add` reads — and coremltools gives them its default "output channel", axis 0, which is the
batch axis of size 1 there: one scale for the whole table (15 dB on all-MiniLM-L6-v2's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from server.compile.errors import InvalidSourceError

_SCHEME = re.compile(r"(none|int8|(int8|int4)-block(\d+)|palettize([123468]))")
BLOCKWISE_TARGET = "iOS18"
# MIL ops whose const inputs have a weight layout coremltools knows the output channel of
# (conv / conv_transpose / linear / matmul: select_input_output_channel_axis; gather and the
# recurrent ops: a table's rows / a gate's outputs on axis 0).
WEIGHT_READERS = frozenset({"conv", "conv_transpose", "linear", "matmul", "gather",
                            "gather_nd", "gather_along_axis", "lstm", "gru", "rnn"})


@dataclass(frozen=True)
class Compression:
    scheme: str  # as the version wrote it, e.g. "int4-block32"
    kind: str  # "none" | "linear" | "palettize"
    nbits: int = 16
    block_size: int = 0  # 0: per channel (linear) / per tensor (palettize)

    @property
    def needs_ios18(self) -> bool:
        return self.kind == "linear" and (self.block_size > 0 or self.nbits == 4)

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per weight (with one FP16 scale per block), for ordering by size."""
        return self.nbits + (16 / self.block_size if self.block_size else 0.0)


def parse(scheme: str) -> Compression:
    m = _SCHEME.fullmatch(scheme)
    if m is None:
        raise InvalidSourceError(
            f"weight_compression {scheme!r} is not one of none, int8, int8-block<N>, "
            "int4-block<N> (N: weights per block, e.g. 32 or 128), palettize<B> "
            "(B in 1, 2, 3, 4, 6, 8)")
    if scheme == "none":
        return Compression(scheme, "none")
    if scheme == "int8":
        return Compression(scheme, "linear", 8)
    if m.group(2):
        block = int(m.group(3))
        if block <= 0:
            raise InvalidSourceError(f"weight_compression {scheme!r}: the block size must be "
                                     "a positive number of weights, e.g. 32")
        return Compression(scheme, "linear", int(m.group(2)[3:]), block)
    return Compression(scheme, "palettize", int(m.group(4)))


def check_target(c: Compression, target_name: str, target: Any) -> None:
    import coremltools as ct

    if c.needs_ios18 and target < ct.target.iOS18:
        raise InvalidSourceError(
            f"weight_compression {c.scheme} stores weights as constexpr_blockwise_shift_scale, "
            f"an iOS18 / macOS15 op; minimum_deployment_target {target_name} is older. Set "
            "minimum_deployment_target=iOS18 (devices on older OS versions then get no Core ML "
            "artifact of this version), or use weight_compression int8 / palettize<B>.")


def compress(mlmodel: Any, c: Compression, threshold: int, palette_mode: str,
             keep_ops: tuple[str, ...] = ()) -> Any:
    """`mlmodel` with its weights compressed by `c` (unchanged for "none")."""
    if c.kind == "none":
        return mlmodel
    from coremltools.optimize import coreml as cto

    op_config: Any
    if c.kind == "linear":
        granularity = {"granularity": "per_block", "block_size": c.block_size} \
            if c.block_size else {}
        op_config = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype=f"int{c.nbits}",
                                                weight_threshold=threshold, **granularity)
    else:
        op_config = cto.OpPalettizerConfig(mode=palette_mode, nbits=c.nbits,
                                           weight_threshold=threshold)
    keep_ops = with_shared_weights(mlmodel, keep_ops) + folded_activations(mlmodel)
    # None in op_name_configs: that op's (or const's) weights stay as they are (coremltools'
    # own opt-out).
    cfg = cto.OptimizationConfig(global_config=op_config,
                                 op_name_configs=dict.fromkeys(keep_ops))
    if c.kind == "linear":
        out = cto.linear_quantize_weights(mlmodel, config=cfg)
        if c.block_size and compressed_weights(out):
            out = _per_channel_rest(out, threshold, keep_ops)
    else:
        out = cto.palettize_weights(mlmodel, config=cfg)
    if not compressed_weights(out):
        # coremltools skips a weight it cannot compress with a warning only (a block size
        # that does not divide the input channels); a package labelled INT8 must hold some.
        raise InvalidSourceError(
            f"weight_compression {c.scheme} compressed no weight of this model: every weight "
            f"is at most weight_threshold ({threshold}) elements"
            + (f" or has input channels that are not a multiple of the block size "
               f"{c.block_size}" if c.block_size else "")
            + ". Lower weight_threshold, pick a block size that divides the channels, or use "
            "weight_compression int8.")
    return out


def with_shared_weights(mlmodel: Any, keep_ops: tuple[str, ...]) -> tuple[str, ...]:
    """`keep_ops` and every other op reading a weight one of them reads.

    A weight two ops share (a tied LM head: the embedding's gather and the logits' matmul)
    is one const; keeping it for one consumer and compressing it for the other is a
    "compression config conflict" in coremltools, so keeping one keeps it for all.
    """
    if not keep_ops:
        return keep_ops
    wanted, out = set(keep_ops), list(keep_ops)
    for fn in mlmodel._mil_program.functions.values():
        for op in fn.operations:
            if op.name not in wanted:
                continue
            args = [v for arg in op.inputs.values()
                    for v in (arg if isinstance(arg, (list, tuple)) else [arg])]
            for var in args:
                if getattr(var, "op", None) is None or var.op.op_type != "const":
                    continue
                for child in var.child_ops:
                    if child.name not in wanted:
                        wanted.add(child.name)
                        out.append(child.name)
    return tuple(out)


def folded_activations(mlmodel: Any) -> tuple[str, ...]:
    """Names of the const ops only non-weight ops read (an `add`'s `[1, seq, hidden]` table):
    per channel they would get one scale for the whole tensor (see the module docstring)."""
    out = []
    for fn in mlmodel._mil_program.functions.values():
        for op in fn.operations:
            if op.op_type != "const" or op.outputs[0].val is None:
                continue
            readers = op.outputs[0].child_ops
            if readers and not any(r.op_type in WEIGHT_READERS for r in readers):
                out.append(op.name)
    return tuple(out)


def _per_channel_rest(mlmodel: Any, threshold: int, keep_ops: tuple[str, ...]) -> Any:
    """INT8 per output channel for the weights a block-wise pass left uncompressed.

    coremltools skips a weight whose input channels the block size does not divide (a first
    conv on 3 channels, a 16-channel conv at block 32) and leaves it FP16: on a small conv
    net those are most of the weights, so "int4-block32" came out larger than "int8". Per
    channel INT8 is the scheme that fits any shape, and never less precise than the block.
    """
    from coremltools.optimize import coreml as cto

    rest = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8",
                                       weight_threshold=threshold)
    return cto.linear_quantize_weights(mlmodel, config=cto.OptimizationConfig(
        global_config=rest, op_name_configs=dict.fromkeys(keep_ops)))


def compressed_weights(mlmodel: Any) -> int:
    """How many `constexpr_*` (compressed weight) ops the model's main function holds."""
    fn = mlmodel.get_spec().mlProgram.functions["main"]
    block = fn.block_specializations[fn.opset]
    return sum(1 for op in block.operations if op.type.startswith("constexpr_"))
