"""Per-cohort watermarked artifacts in the compile pipeline (server/compile/cohorts.py): every
readable artifact of a watermarked version gets one marked, gated, packed copy per cohort;
each copy's weights carry its own cohort's fingerprint in the artifact's own dtype; a copy
whose watermark would move the outputs past the gate fails the build naming the cohort."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from server import watermark as wm
from server.compile import BuildSpec, Pipeline, SourceFormat, mark_plan, weights
from server.compile import cohorts as cohorts_mod
from server.compile.cohorts import WatermarkSpec
from server.compile.packing import unpack_directory

KEY = b"release watermark key for tests"
COHORTS = 4


def make_mlp(tmp, dims):  # type: ignore[no-untyped-def]
    """An ONNX MLP of `dims` (MatMul + bias, ReLU between) and its reference inputs."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.compile.compile_models import onnx_model

    rng = np.random.default_rng(5)
    inits, nodes, x = [], [], "x"
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        inits += [numpy_helper.from_array(
            (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), f"w{i}"),
            numpy_helper.from_array((rng.standard_normal(b) * 0.1).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        x = f"a{i}"
        if i < len(dims) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    path = onnx_model(tmp / "mlp.onnx", nodes,
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dims[0]])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dims[-1]])],
                      inits)
    ref = tmp / "mlp.ref.npz"
    np.savez(ref, x=rng.standard_normal((4, 1, dims[0])).astype(np.float32))
    return path, ref


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A 64 → 1024 → 1024 → 10 MLP (1.1M weights): big enough for a 1e-9 claim."""
    return make_mlp(tmp_path_factory.mktemp("mlp"), (64, 1024, 1024, 10))


@pytest.fixture(scope="module")
def small_mlp(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A 64 → 512 → 512 → 10 MLP (300k weights, a small corpus model's size), whose
    one-FP16-step mark does not survive 1% weight noise. (Its random weights make its
    outputs more sensitive than a trained model's: at 84k weights the outputs could afford
    only 2 steps, z 7.5.)"""
    return make_mlp(tmp_path_factory.mktemp("small-mlp"), (64, 512, 512, 10))


def mlp_spec(mlp, platforms, watermark):  # type: ignore[no-untyped-def]
    from server.compile import InputSpec

    return BuildSpec(mlp[0], SourceFormat.ONNX, {"default": (InputSpec("x", (1, 64)),)},
                     platforms=platforms, reference_path=mlp[1], watermark=watermark)


def by_platform(outcomes):  # type: ignore[no-untyped-def]
    return {o.platform: o for o in outcomes}


def tensors(path, tmp):  # type: ignore[no-untyped-def]
    if path.suffix == ".tar":
        path = unpack_directory(path, tmp)
    return {t.name: t.values for t in weights.read(path)}


@pytest.mark.slow
def test_each_cohort_gets_a_gated_artifact_marked_in_its_own_dtype(mlp, tmp_path):
    spec = mlp_spec(mlp, ("onnx", "coreml"), WatermarkSpec(COHORTS, KEY))
    out = by_platform(Pipeline().build(spec, tmp_path / "build"))
    for platform, o in out.items():
        assert o.state == "ready", (platform, o.error)
        assert len(o.cohorts) == COHORTS
        gate = o.gates["watermark"]
        assert gate["status"] == "passed" and gate["lowest_output_psnr_db"] > 60
        shas = {c.sha256 for c in o.cohorts} | {o.artifact.sha256}
        assert len(shas) == COHORTS + 1  # every cohort differs, and from the unmarked one
        original = tensors(o.artifact.path, tmp_path / f"{platform}-orig")
        marked = [t for t in original.values() if t.size >= weights.MIN_ELEMENTS]
        assert sum(t.size for t in marked) > 1_000_000
        for c, packed in enumerate(o.cohorts):
            copy = tensors(packed.path, tmp_path / f"{platform}-{c}")
            assert {n: v.dtype for n, v in copy.items()} == \
                {n: v.dtype for n, v in original.items()}
            got = wm.identify_tensors(copy, original.items(), KEY, COHORTS)
            assert got.cohort == c, (platform, c, got)
    # Core ML holds FP16 weights: the marks are whole FP16 steps in FP16.
    coreml = tensors(out["coreml"].artifact.path, tmp_path / "dtype")
    assert any(v.dtype == np.float16 for v in coreml.values())


def noisy(tensors, seed):  # type: ignore[no-untyped-def]
    """1% Gaussian noise of each weight's magnitude (a leaker's attempt to wash the mark)."""
    rng = np.random.default_rng(seed)
    return {n: (v.astype(np.float32) * (1 + 0.01 * rng.standard_normal(v.shape))
                ).astype(np.float32) for n, v in tensors.items()}


def test_a_small_models_cohorts_are_strong_enough_to_survive_one_percent_noise(small_mlp,
                                                                                tmp_path):
    (o,) = Pipeline().build(mlp_spec(small_mlp, ("onnx",), WatermarkSpec(COHORTS, KEY)),
                            tmp_path / "build")
    assert o.state == "ready", o.error
    gate = o.gates["watermark"]
    n = gate["marked_weights"]
    assert wm.strength_for(n) > 1  # one FP16 step would not do: z ≈ 0.072·√n < 7.05
    assert 1 < gate["strength"] and gate["noise_z"] >= 10, gate
    assert gate["lowest_output_psnr_db"] > 60, gate
    original = tensors(o.artifact.path, tmp_path / "orig")
    markable = [(k, v) for k, v in original.items() if v.size >= weights.MIN_ELEMENTS]
    for c, packed in enumerate(o.cohorts):
        copy = noisy(tensors(packed.path, tmp_path / f"c{c}"), c)
        got = wm.identify_tensors(copy, markable, KEY, COHORTS)
        assert got.cohort == c and got.false_positive <= 1e-9, (c, got)
    assert wm.identify_tensors(noisy(original, 9), markable, KEY, COHORTS).cohort is None


def test_the_probe_cohort_lowers_a_strength_the_outputs_cannot_afford(small_mlp, tmp_path,
                                                                      monkeypatch):
    (first,) = Pipeline().build(mlp_spec(small_mlp, ("onnx",), WatermarkSpec(COHORTS, KEY)),
                                tmp_path / "a")
    k, psnr = first.gates["watermark"]["strength"], first.gates["watermark"][
        "lowest_output_psnr_db"]
    assert k > 1
    # Ask for half the dB the full strength costs on top of its PSNR: the probe must drop it.
    monkeypatch.setattr(cohorts_mod, "PSNR_MARGIN_DB", psnr - 60 + 10 * np.log10(k))
    lines: list[str] = []
    (o,) = Pipeline(log=lines.append).build(
        mlp_spec(small_mlp, ("onnx",), WatermarkSpec(COHORTS, KEY)), tmp_path / "b")
    gate = o.gates["watermark"]
    assert o.state == "ready" and len(o.cohorts) == COHORTS, o.error
    assert 1 <= gate["strength"] < k and gate["lowest_output_psnr_db"] > psnr, (k, gate)
    assert any(f"cohort 0's watermark at strength {k}, share 1 costs" in line
               for line in lines), lines


def test_a_watermark_that_moves_outputs_past_the_gate_fails_naming_the_cohort(
        convnet, tmp_path, monkeypatch):
    monkeypatch.setattr(wm, "DEFAULT_STRENGTH", 1.0)
    strong = wm.embed
    monkeypatch.setattr(cohorts_mod.wm, "embed",
                        lambda v, k, c, strength=1.0, name="", share=1.0:
                        strong(v, k, c, 4000.0, name, share))
    spec = BuildSpec(convnet.onnx, SourceFormat.ONNX, {"default": convnet.inputs},
                     platforms=("onnx",), reference_path=convnet.reference,
                     watermark=WatermarkSpec(COHORTS, KEY))
    (o,) = Pipeline().build(spec, tmp_path / "build")
    assert o.state == "failed" and o.artifact is None and not o.cohorts
    assert "cohort 0" in o.error
    assert o.gates["watermark"]["status"] == "failed"


def test_without_a_watermark_nothing_is_marked_or_run(convnet, tmp_path, monkeypatch):
    def refuse(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("marked a version without a watermark")

    monkeypatch.setattr("server.compile.pipeline.build_cohorts", refuse)
    spec = BuildSpec(convnet.onnx, SourceFormat.ONNX, {"default": convnet.inputs},
                     platforms=("onnx",), reference_path=convnet.reference)
    (o,) = Pipeline().build(spec, tmp_path / "build")
    assert o.state == "ready" and o.cohorts == [] and "watermark" not in o.gates
    assert "cohorts" in o.to_dict() and o.to_dict()["cohorts"] == []


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8])
def test_embed_keeps_dtype_zeros_and_sentinels(dtype):
    rng = np.random.default_rng(0)
    if dtype is np.int8:
        w = rng.integers(-128, 128, 5000).astype(np.int8)
    else:
        w = (rng.standard_normal(5000) * 0.1).astype(dtype)
        w[:10] = 0
        w[10] = -1e4 if dtype is np.float16 else -1e9
    m = wm.embed(w, KEY, 3, name="t")
    assert m.dtype == w.dtype and m.shape == w.shape
    if dtype is np.int8:
        moved = (m.astype(int) != w.astype(int)).mean()
        assert 0 < moved < 2 * wm.DENSITY
        assert np.abs(m.astype(int) - w.astype(int)).max() == 1
    else:
        assert (m[:11] == w[:11]).all()
        assert 0.5 * wm.DENSITY < (m[11:] != w[11:]).mean() < 2 * wm.DENSITY


def test_a_model_that_cannot_afford_one_step_is_marked_on_a_share_and_still_named(
        small_mlp, tmp_path, monkeypatch):
    """Some corpus models lose more than the gate allows to one FP16 step on 1/32 of their
    weights (ppocr-det: 53 dB); here the gate is raised over what strength 1 costs this
    MLP. The copies then mark a share of the positions (a subset of the detector's mask)
    and each is still named as shipped and after an FP16 round trip."""
    (first,) = Pipeline().build(mlp_spec(small_mlp, ("onnx",), WatermarkSpec(COHORTS, KEY)),
                                tmp_path / "a")
    k, psnr = first.gates["watermark"]["strength"], first.gates["watermark"][
        "lowest_output_psnr_db"]
    one_step = psnr + 20 * np.log10(k)  # what strength 1 costs (PSNR grows as k falls)
    monkeypatch.setattr(cohorts_mod, "MIN_PSNR_DB", one_step + 4)
    # No per-tensor plan (it probes no tensor, so it marks none): every tensor thinned alike,
    # the fallback when the plan affords too few marks.
    monkeypatch.setattr(mark_plan, "MAX_PROBED", 0)
    (o,) = Pipeline().build(mlp_spec(small_mlp, ("onnx",), WatermarkSpec(COHORTS, KEY)),
                            tmp_path / "b")
    gate = o.gates["watermark"]
    assert o.state == "ready" and len(o.cohorts) == COHORTS, o.error
    assert gate["strength"] == 1 and gate["share"] <= 0.5, gate
    assert gate["lowest_output_psnr_db"] >= one_step + 4, gate
    original = tensors(o.artifact.path, tmp_path / "orig")
    markable = [(n, v) for n, v in original.items() if v.size >= weights.MIN_ELEMENTS]
    for c, packed in enumerate(o.cohorts):
        copy = tensors(packed.path, tmp_path / f"c{c}")
        for n, v in markable:  # moved only inside the detector's (full-share) mask
            moved = copy[n].reshape(-1) != v.reshape(-1)
            assert not (moved & ~wm.mask(KEY, n, v.size)).any()
        for leaked in (copy, {n: v.astype(np.float16).astype(np.float32)
                              for n, v in copy.items()}):
            got = wm.identify_tensors(leaked, markable, KEY, COHORTS)
            assert got.cohort == c and got.false_positive <= 1e-9, (c, got)


def make_cancelling_mlp(tmp):  # type: ignore[no-untyped-def]
    """The small MLP plus a head whose two large tensors cancel (y += h·P − h·Q, P = Q,
    |P| ~ 100): they add nothing to the outputs, but a mark on them (keyed per tensor, so
    unequal) moves the outputs ~10⁴ times more than every other tensor's — as a detector
    head before a mostly-zero probability map does (ppocr-det's `conv2d_399.w_0`)."""
    import onnx
    from onnx import helper, numpy_helper

    path, ref = make_mlp(tmp, (64, 512, 512, 10))
    model = onnx.load(str(path))
    big = (np.random.default_rng(8).standard_normal((512, 10)) * 100).astype(np.float32)
    model.graph.initializer.extend([numpy_helper.from_array(big, "P"),
                                    numpy_helper.from_array(big.copy(), "Q")])
    out = model.graph.node[-1]  # Identity(a1) -> y
    model.graph.node.remove(out)
    model.graph.node.extend([helper.make_node("MatMul", ["r0", "P"], ["hp"]),
                             helper.make_node("MatMul", ["r0", "Q"], ["hq"]),
                             helper.make_node("Sub", ["hp", "hq"], ["head"]),
                             helper.make_node("Add", [out.input[0], "head"], ["y"])])
    onnx.save(model, str(path))
    return path, ref


@pytest.mark.slow
def test_a_tensor_the_outputs_cannot_afford_is_left_unmarked_and_the_rest_still_names(
        tmp_path):
    """Thinning every tensor alike cannot pay for P and Q (the outputs would need 40 dB
    of it, 1/10⁴ of the marks); the per-tensor plan leaves them unmarked and marks the
    rest: every cohort passes the gate and is named as shipped."""
    mlp = make_cancelling_mlp(tmp_path)
    lines: list[str] = []
    (o,) = Pipeline(log=lines.append).build(
        mlp_spec(mlp, ("onnx",), WatermarkSpec(COHORTS, KEY)), tmp_path / "build")
    assert o.state == "ready" and len(o.cohorts) == COHORTS, o.error
    gate = o.gates["watermark"]
    assert gate["status"] == "passed" and gate["lowest_output_psnr_db"] > 60, gate
    plan = gate["plan"]
    # P and Q unmarked, or one of them on what budget is left once the rest is marked.
    assert {"P", "Q"} & set(plan["unmarked"]), plan
    assert all(plan["partial"].get(n, 0) < 0.01 for n in ("P", "Q")), plan
    assert plan["marked_weights"] > 0.9 * gate["marked_weights"], plan  # the rest marked
    assert any("mark plan:" in line and "left unmarked" in line for line in lines), lines
    original = tensors(o.artifact.path, tmp_path / "orig")
    markable = [(n, v) for n, v in original.items() if v.size >= weights.MIN_ELEMENTS]
    for c, packed in enumerate(o.cohorts):
        copy = tensors(packed.path, tmp_path / f"c{c}")
        full = [int((wm.embed(original[n], KEY, c, name=n) != original[n]).sum())
                for n in ("P", "Q", "w1")]
        assert all(int((copy[n] != original[n]).sum()) <= full[i] // 50
                   for i, n in enumerate(("P", "Q"))), full
        assert int((copy["w1"] != original["w1"]).sum()) == full[2] > 0
        got = wm.identify_tensors(copy, markable, KEY, COHORTS)
        assert got.cohort == c and got.false_positive <= 1e-9, (c, got)


def test_the_plan_spends_the_budget_on_the_most_marks_per_unit_of_error():
    counts = {"a": 100, "b": 10, "c": 50, "free": 5}
    cost = {"a": np.array([1.0, 0.0]), "b": np.array([10.0, 0.0]),
            "c": np.array([0.0, 2.0]), "free": np.array([0.0, 0.0])}
    # Per sample/output budgets: a fits whole, c only half, b (10 marks for 10 units) not.
    shares = mark_plan.knapsack(counts, cost, np.array([1.5, 1.0]))
    assert shares == {"free": 1.0, "a": 1.0, "c": 0.5, "b": 0.05}
    assert mark_plan.knapsack(counts, cost, np.array([0.0, 0.0])) == {"free": 1.0}


def test_the_plan_probes_as_many_tensors_on_a_busy_worker_as_on_an_idle_one(
        small_mlp, tmp_path, monkeypatch):
    """The probe's budget is CPU seconds of the build, not wall seconds: a worker that
    other jobs slow down (here each marked copy waits 0.2 s, using no CPU) plans over the
    same tensors. Counted in wall seconds, a 0.3 s budget stopped after two tensors."""
    import time

    from server.compile import InputSpec
    from server.compile.compilers.onnx import OnnxCompiler
    from server.compile.source import load_samples
    from server.compile.types import CompileRequest

    path, ref = small_mlp
    compiler = OnnxCompiler()
    (tmp_path / "art").mkdir()
    (art,) = compiler.compile(CompileRequest(path, SourceFormat.ONNX, (InputSpec("x", (1, 64)),),
                                             onnx_path=path), tmp_path / "art")
    feeds = load_samples(ref, (InputSpec("x", (1, 64)),))
    unmarked = compiler.run(art, feeds)

    def slow_mark(src, dest, share_of):  # type: ignore[no-untyped-def]
        time.sleep(0.2)
        return cohorts_mod.mark_copy(src, dest, KEY, 0, 1, 1.0, share_of)

    monkeypatch.setattr(mark_plan, "PROBE_SECONDS", 0.3)
    made = mark_plan.plan(compiler, art, feeds, unmarked, KEY, tmp_path / "plan", 64.0,
                          slow_mark)
    counts = mark_plan.marked_counts(art.path, KEY)
    assert len(counts) == 5 and made.probed == len(counts), (made, counts)  # 3 w, 2 b


def test_a_later_cohort_that_needs_a_thinner_share_makes_every_cohort_again_at_it(
        small_mlp, tmp_path, monkeypatch):
    """identify scores the positions a mark moved, read off one cohort's copy: every cohort
    must mark the same ones. Cohort 1's first copy here costs the outputs more than the
    gate allows (its measured PSNR replaced by 55 dB), so it needs a thinner share than
    cohort 0 got: every cohort is made again at that share, on the same positions."""
    monkeypatch.setattr(cohorts_mod.wm, "strength_for", lambda n: 1)
    monkeypatch.setattr(mark_plan, "MAX_PROBED", 0)  # no plan: the share is what thins
    current = {"cohort": -1}
    made = cohorts_mod._cohort_artifact
    measure = cohorts_mod.output_psnr_db
    faked: list[int] = []

    def cohort_artifact(art, graph, where, spec, c, *rest):  # type: ignore[no-untyped-def]
        current["cohort"] = c
        return made(art, graph, where, spec, c, *rest)

    def psnr(*a):  # type: ignore[no-untyped-def]
        if current["cohort"] == 1 and not faked:
            faked.append(1)
            return 55.0
        return measure(*a)

    monkeypatch.setattr(cohorts_mod, "_cohort_artifact", cohort_artifact)
    monkeypatch.setattr(cohorts_mod, "output_psnr_db", psnr)
    lines: list[str] = []
    (o,) = Pipeline(log=lines.append).build(
        mlp_spec(small_mlp, ("onnx",), WatermarkSpec(COHORTS, KEY)), tmp_path / "b")
    assert o.state == "ready" and len(o.cohorts) == COHORTS, o.error
    gate = o.gates["watermark"]
    assert faked and gate["share"] < 1, gate
    assert any("cohort 1 needs share" in line and "made again" in line for line in lines), \
        lines
    original = tensors(o.artifact.path, tmp_path / "orig")
    moved = [{n: tensors(p.path, tmp_path / f"c{c}")[n] != v for n, v in original.items()}
             for c, p in enumerate(o.cohorts)]
    for later in moved[1:]:
        for n in original:
            assert np.array_equal(later[n], moved[0][n]), n
    assert sum(int(m.sum()) for m in moved[0].values()) > 0
