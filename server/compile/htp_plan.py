"""The HTP plan of one graph: probe which nodes the HTP takes, rewrite the rejected nodes
that have an HTP form, probe again. Its own module because the whole-graph compile
(compilers/qnn.py), the precision-island compile of each part (qnn_islands.py) and the
support gate all run it, and the island compile is itself called by the whole-graph one."""

from __future__ import annotations

from pathlib import Path

from server.compile.errors import ConversionError
from server.compile.htp_support import HtpAssignment, probe


def htp_graph_path(workdir: Path, name: str) -> Path:
    """Where `plan_htp` writes the rewritten graph for target `name`."""
    return workdir / f"model.{name.lower()}.htp.onnx"


def plan_htp(model: Path, provider: dict[str, str], out: Path | None, workdir: Path,
             name: str) -> tuple[HtpAssignment, list[str]]:
    """Probes the HTP split (writing the EPContext model to `out` in the same session, when
    given); rewrites the rejected nodes that have an HTP form and probes again. Returns the
    final split and notes on what was rewritten. The support gate calls it without `out`."""
    import onnx

    from server.compile.qnn_prep import rewrite

    try:
        assignment = probe(model, provider, context_out=out)
        if not assignment.cpu_nodes:
            return assignment, []
        refused: dict[str, str] = {}
        rewritten, done = rewrite(onnx.load(str(model)), {n.name for n in assignment.cpu_nodes},
                                  refused)
        if not done:
            return _with_refusals(assignment, refused), []
        htp_model = htp_graph_path(workdir, name)
        onnx.save(rewritten, str(htp_model))
        notes = [f"rewritten for the HTP: {node} ({what})" for node, what in done.items()]
        return _with_refusals(probe(htp_model, provider, context_out=out), refused), notes
    except Exception as e:
        raise ConversionError(
            f"QNN HTP compile for {name} (soc_model {provider['soc_model']}, "
            f"v{provider['htp_arch']}) failed: {str(e)[:600]}") from e


def _with_refusals(assignment: HtpAssignment, refused: dict[str, str]) -> HtpAssignment:
    """The CPU nodes' reasons, plus why a node with a rewrite could not be rewritten."""
    from dataclasses import replace

    assignment.cpu_nodes = [replace(n, why=f"{n.why}; no HTP rewrite: {refused[n.name]}")
                            if n.name in refused else n for n in assignment.cpu_nodes]
    return assignment
