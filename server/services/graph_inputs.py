"""Upload-time checks of the declared `metadata.inputs` against an ONNX graph's own inputs.

A declaration the graph contradicts would be accepted and then fail every build of the
version, so it is a 422 at upload, naming the input:
- a spec naming no graph input, or a graph input without a spec;
- a dtype other than the graph input's element type;
- a rank other than the graph's (a scalar is rank 0: `"shape": []`);
- a size that contradicts a static dim, or one symbolic dim given two sizes in a variant.

`undeclared_inputs_error` answers an upload that declares no inputs at all: it lists each
graph input's name, dtype and dynamic dims, with the metadata JSON and the CLI `--input` flags
to declare them (placeholders where the graph leaves a dim open).
"""

from __future__ import annotations

import json
from typing import Any

from server.compile.shapes import declared_shape_conflicts
from server.errors import InvalidInputError
from server.services.sourcefiles import GraphInput
from server.services.version_metadata import DEFAULT_VARIANT, DTYPES


def check_input_names(specs: list[dict[str, Any]], graph: list[GraphInput]) -> None:
    """Every model input needs a spec and every spec must name a model input."""
    model_inputs = [g.name for g in graph]
    listed = [str(spec["name"]) for spec in specs]
    have = ", ".join(model_inputs) or "none"
    for i, name in enumerate(listed):
        if name not in model_inputs:
            raise InvalidInputError(
                f"metadata.inputs[{i}].name {name!r} is not an input of the model",
                field=f"metadata.inputs[{i}].name",
                fix=f"use the model's input names: {have}",
            )
    missing = [n for n in model_inputs if n not in listed]
    if missing:
        raise InvalidInputError(
            f"model input(s) {', '.join(map(repr, missing))} have no entry in metadata.inputs",
            field="metadata.inputs",
            fix="add a spec (name, dtype, shape or shapes) for every model input",
            errors=[g.to_dict() for g in graph if g.name in missing],
        )


def check_declared_inputs(specs: list[dict[str, Any]], graph: list[GraphInput]) -> None:
    """dtype, rank and sizes of each spec against its graph input (names already match)."""
    by_name = {g.name: g for g in graph}
    for i, spec in enumerate(specs):
        g = by_name[str(spec["name"])]
        if spec["dtype"] != g.dtype:
            fix = (f'declare "dtype": "{g.dtype}"' if g.dtype in DTYPES else
                   f"the graph's {g.dtype} input cannot be fed by a device; export the model "
                   f"with one of: {', '.join(DTYPES)}")
            raise InvalidInputError(
                f"metadata.inputs[{i}] ({g.name}): dtype {spec['dtype']} is declared, but the "
                f"ONNX input {g.name!r} is {g.dtype}", field=f"metadata.inputs[{i}].dtype",
                fix=fix)
        if g.dims is None:
            continue  # the graph gives no shape: any rank is the uploader's to choose
        for variant, shape in spec["shapes"].items():
            if len(g.dims) != len(shape):
                where = "shape" if variant == DEFAULT_VARIANT else f"shapes.{variant}"
                raise InvalidInputError(
                    f"metadata.inputs[{i}] ({g.name}): shape {shape} has rank {len(shape)} "
                    f"but the ONNX input has rank {len(g.dims)} ({_dims_text(g)})",
                    field=f"metadata.inputs[{i}].{where}",
                    fix="declare a scalar as \"shape\": []" if not g.dims else
                    f"declare {len(g.dims)} dims, e.g. {_shape_template(g)}")
    _check_sizes(specs, {g.name: list(g.dims or []) for g in graph})


def _check_sizes(specs: list[dict[str, Any]], graph_dims: dict[str, list[int | str]]) -> None:
    index = {str(spec["name"]): i for i, spec in enumerate(specs)}
    variants: dict[str, dict[str, list[int]]] = {}
    for spec in specs:
        for variant, shape in spec["shapes"].items():
            variants.setdefault(variant, {})[str(spec["name"])] = list(shape)
    conflicts = declared_shape_conflicts(graph_dims, variants)
    if conflicts:
        c = conflicts[0]
        i = index[c.input]
        actual = ", ".join(str(d) for d in graph_dims[c.input])
        raise InvalidInputError(
            f"metadata.inputs[{i}] ({c.input}) dim {c.dim}: declared {c.declared}, but the "
            f"ONNX input {c.input!r} is [{actual}]"
            + ("" if c.variant == DEFAULT_VARIANT else f" (shape variant {c.variant!r})")
            + "".join(f"; {more.message()}" for more in conflicts[1:5]),
            field=f"metadata.inputs[{i}].shape[{c.dim}]" if c.variant == DEFAULT_VARIANT
            else f"metadata.inputs[{i}].shapes.{c.variant}[{c.dim}]",
            fix=(f"declare {c.actual} there (the graph fixes it)" if isinstance(c.actual, int)
                 else f"give the graph's dim {c.actual!r} one size in every input of a "
                 "variant"))


def _dims_text(g: GraphInput) -> str:
    return "a scalar" if not g.dims else "[" + ", ".join(
        str(d) if isinstance(d, int) else repr(d or "?") for d in g.dims) + "]"


def _placeholder(g: GraphInput, i: int, d: int | str) -> str:
    """A dynamic dim's placeholder in a template: <its symbolic name>, else <input.i>."""
    return str(d) if isinstance(d, int) else f"<{d or f'{g.name}.{i}'}>"


def _shape_template(g: GraphInput) -> str:
    return "[" + ", ".join(_placeholder(g, i, d) for i, d in enumerate(g.dims or [])) + "]"


def input_templates(graph: list[GraphInput]) -> tuple[str, str]:
    """(metadata.inputs JSON, CLI --input flags) declaring `graph`'s inputs; a dynamic dim is
    a <placeholder> to replace with the size to build for. An input without any shape in the
    graph gets <shape> (its rank is not known)."""
    entries, flags = [], []
    for g in graph:
        dtype = g.dtype if g.dtype in DTYPES else "float32"
        shape = _shape_template(g) if g.dims is not None else "<shape>"
        entries.append(f'{{"name": {json.dumps(g.name)}, "dtype": "{dtype}", '
                       f'"shape": {shape}}}')
        cli = ("x".join(_placeholder(g, i, d) for i, d in enumerate(g.dims)) or "scalar") \
            if g.dims is not None else "<shape>"
        flags.append(f"--input {g.name}:{dtype}:{cli}")
    return "[" + ", ".join(entries) + "]", " ".join(flags)


def undeclared_inputs_error(graph: list[GraphInput], original: InvalidInputError
                            ) -> InvalidInputError:
    """The 422 for an upload without metadata.inputs, built from the graph's inputs."""
    if not graph:
        return original
    described = "; ".join(
        f"{g.name} ({g.dtype}, {_dims_text(g)}"
        + (f", dynamic dims {g.dynamic}" if g.dynamic else
           (", no shape in the graph" if g.dims is None else ", static")) + ")"
        for g in graph[:16])
    more = f" and {len(graph) - 16} more" if len(graph) > 16 else ""
    metadata, cli = input_templates(graph[:64])
    return InvalidInputError(
        f"metadata.inputs: Field required. The ONNX graph has {len(graph)} input(s): "
        f"{described}{more}. Each build compiles one static shape per input",
        field="metadata.inputs",
        fix=f'add "inputs": {metadata} to metadata, '
        + ("replacing each <placeholder> with the size to build for (several sizes: "
           "\"shapes\": {\"name\": [...], …}); "
           if any(g.dynamic or g.dims is None for g in graph[:64]) else
           "the sizes the graph fixes (it has no dynamic dims); ")
        + f"with the CLI: {cli}",
        errors=[g.to_dict() for g in graph[:64]],
    )
