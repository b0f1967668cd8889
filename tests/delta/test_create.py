"""server.delta: ONNX layout, mfdelta1 vs bsdiff4 on model pairs, best-of selection policy."""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

import bsdiff4
import onnx
import pytest

from client_sdk.patching import apply_patch
from server.delta import (
    DeltaInputError,
    DeltaPolicy,
    PatchResult,
    choose_best,
    create_mfdelta1,
    make_patches,
)
from server.delta.inspect import op_summary
from server.delta.onnx_layout import read_layout

Pairs = dict[str, tuple[Path, Path]]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_onnx_layout_finds_every_initializers_raw_bytes(model_pairs: Pairs) -> None:
    _, new = model_pairs["int8_requant"]
    model = onnx.load(str(new))
    data = new.read_bytes()
    layout = {t.name: t for t in read_layout(new)}
    assert set(layout) == {init.name for init in model.graph.initializer}
    for init in model.graph.initializer:
        tensor = layout[init.name]
        assert data[tensor.offset : tensor.offset + tensor.length] == init.raw_data
        assert tensor.dims == tuple(init.dims)
        assert tensor.width == (1 if init.data_type == onnx.TensorProto.INT8 else 4)


def test_onnx_layout_of_a_non_onnx_file_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(bytes(range(256)) * 100)
    assert read_layout(path) == []


@pytest.mark.parametrize(
    "scenario", ["head_only", "full_finetune", "int8_requant", "insert_tensor", "unrelated",
                 "fp16_to_int8"]
)
def test_mfdelta1_is_no_larger_than_bsdiff4_on_model_pairs(
    model_pairs: Pairs, tmp_path: Path, scenario: str
) -> None:
    base, new = model_pairs[scenario]
    create_mfdelta1(base, new, tmp_path / "p.mfdelta1")
    bsdiff4.file_diff(str(base), str(new), str(tmp_path / "p.bsdiff4"))
    apply_patch("mfdelta1", base, tmp_path / "p.mfdelta1", tmp_path / "out", max_output=10**9)
    assert (tmp_path / "out").read_bytes() == new.read_bytes()
    ours = (tmp_path / "p.mfdelta1").stat().st_size
    theirs = (tmp_path / "p.bsdiff4").stat().st_size
    assert ours <= theirs, f"{scenario}: mfdelta1 {ours} > bsdiff4 {theirs}"


def _zstd_patch_from(base: Path, new: Path) -> int:
    """Bytes of `zstd -3 --patch-from=base` (the base as a raw-content dictionary)."""
    import zstandard

    ref = zstandard.ZstdCompressionDict(base.read_bytes(),
                                        dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    params = zstandard.ZstdCompressionParameters.from_level(
        3, window_log=max(20, (base.stat().st_size + new.stat().st_size).bit_length()),
        enable_ldm=True)
    return len(zstandard.ZstdCompressor(dict_data=ref, compression_params=params)
               .compress(new.read_bytes()))


def test_fp16_artifact_to_its_int8_successor_is_no_larger_than_bsdiff4_or_zstd(
    model_pairs: Pairs, tmp_path: Path
) -> None:
    base, new = model_pairs["fp16_to_int8"]
    create_mfdelta1(base, new, tmp_path / "p.mfdelta1")
    bsdiff4.file_diff(str(base), str(new), str(tmp_path / "p.bsdiff4"))
    apply_patch("mfdelta1", base, tmp_path / "p.mfdelta1", tmp_path / "out", max_output=10**9)
    assert (tmp_path / "out").read_bytes() == new.read_bytes()
    ours = (tmp_path / "p.mfdelta1").stat().st_size
    assert ours <= min((tmp_path / "p.bsdiff4").stat().st_size, _zstd_patch_from(base, new))


@pytest.mark.xfail(strict=True, reason="known gap (docs/benchmarks.md, 'Delta patches across "
                   "precisions'): sparse ±1 int8 changes after a fine-tune; bsdiff4's bz2 "
                   "codes them nearer their entropy than mfdelta1's zstd-compressed bit planes")
def test_int8_builds_after_a_fine_tune_are_no_larger_than_bsdiff4(
    model_pairs: Pairs, tmp_path: Path
) -> None:
    base, new = model_pairs["int8_finetune"]
    create_mfdelta1(base, new, tmp_path / "p.mfdelta1")
    apply_patch("mfdelta1", base, tmp_path / "p.mfdelta1", tmp_path / "out", max_output=10**9)
    assert (tmp_path / "out").read_bytes() == new.read_bytes()  # correct, only larger
    assert (tmp_path / "p.mfdelta1").stat().st_size <= _zstd_patch_from(base, new)
    bsdiff4.file_diff(str(base), str(new), str(tmp_path / "p.bsdiff4"))
    assert (tmp_path / "p.mfdelta1").stat().st_size <= (tmp_path / "p.bsdiff4").stat().st_size


def test_mfdelta1_copies_untouched_tensors_of_a_head_only_fine_tune(
    model_pairs: Pairs, tmp_path: Path
) -> None:
    base, new = model_pairs["head_only"]
    create_mfdelta1(base, new, tmp_path / "p")
    summary = op_summary(tmp_path / "p")
    assert summary["copy"][1] > 0.9 * new.stat().st_size
    assert (tmp_path / "p").stat().st_size < 0.06 * new.stat().st_size


def test_mfdelta1_codes_int8_requantization_with_context_sorted_bit_planes(
    model_pairs: Pairs, tmp_path: Path
) -> None:
    base, new = model_pairs["int8_requant"]
    create_mfdelta1(base, new, tmp_path / "p")
    summary = op_summary(tmp_path / "p")
    assert summary["add_bits_sorted"][1] > 0.9 * new.stat().st_size


def test_choose_best_returns_the_smallest_verified_patch(
    model_pairs: Pairs, tmp_path: Path
) -> None:
    base, new = model_pairs["int8_requant"]
    result = choose_best(new, sha256(base), base, tmp_path / "work")
    assert result is not None
    assert result.algorithm == "mfdelta1"
    assert result.length == result.path.stat().st_size
    assert result.sha256 == sha256(result.path)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [result.path.name]
    apply_patch(result.algorithm, base, result.path, tmp_path / "out", max_output=10**9)
    assert sha256(tmp_path / "out") == sha256(new)


def test_choose_best_skips_a_patch_above_the_ratio(model_pairs: Pairs, tmp_path: Path) -> None:
    base, new = model_pairs["unrelated"]
    assert choose_best(new, sha256(base), base, tmp_path / "work") is None
    assert list((tmp_path / "work").iterdir()) == []


def test_choose_best_drops_a_candidate_that_fails_verification(
    model_pairs: Pairs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(base: Path, new: Path, out: Path, policy: DeltaPolicy) -> None:
        create_mfdelta1(base, base, out)  # a valid patch, but to the wrong file

    base, new = model_pairs["head_only"]
    policy = DeltaPolicy(creators={"mfdelta1": broken, "bsdiff4": _real_bsdiff4})
    with caplog.at_level(logging.WARNING):
        result = choose_best(new, sha256(base), base, tmp_path / "work", policy)
    assert result is not None and result.algorithm == "bsdiff4"
    assert [p.name for p in (tmp_path / "work").iterdir()] == [result.path.name]


def _real_bsdiff4(base: Path, new: Path, out: Path, policy: DeltaPolicy) -> None:
    bsdiff4.file_diff(str(base), str(new), str(out))


def test_choose_best_skips_bsdiff4_above_its_size_cap(model_pairs: Pairs, tmp_path: Path) -> None:
    calls: list[str] = []

    def recording(base: Path, new: Path, out: Path, policy: DeltaPolicy) -> None:
        calls.append(out.suffix)
        create_mfdelta1(base, new, out)

    base, new = model_pairs["head_only"]
    policy = DeltaPolicy(
        bsdiff4_max_bytes=1000, creators={"mfdelta1": recording, "bsdiff4": recording}
    )
    result = choose_best(new, sha256(base), base, tmp_path / "work", policy)
    assert result is not None and result.algorithm == "mfdelta1"
    assert calls == [".mfdelta1"]


def test_choose_best_refuses_a_base_that_does_not_match_its_hash(
    model_pairs: Pairs, tmp_path: Path
) -> None:
    base, new = model_pairs["head_only"]
    with pytest.raises(DeltaInputError, match="does not hash"):
        choose_best(new, "0" * 64, base, tmp_path / "work")


def test_choose_best_refuses_inputs_above_the_artifact_cap(
    model_pairs: Pairs, tmp_path: Path
) -> None:
    base, new = model_pairs["head_only"]
    with pytest.raises(DeltaInputError, match="max_artifact_bytes"):
        choose_best(new, sha256(base), base, tmp_path, DeltaPolicy(max_artifact_bytes=1000))


def test_make_patches_uses_the_k_newest_distinct_bases(model_pairs: Pairs, tmp_path: Path) -> None:
    base, new = model_pairs["full_finetune"]
    older = tmp_path / "older.onnx"
    oldest = tmp_path / "oldest.onnx"
    shutil.copy(model_pairs["unrelated"][1], older)  # unrelated weights: no patch
    oldest.write_bytes(base.read_bytes()[:-1] + b"\x01")  # close to new: worth a patch
    bases = [
        (sha256(new), new),  # the same artifact republished: nothing to patch
        (sha256(base), base),
        (sha256(base), base),  # listed twice
        (sha256(older), older),
        (sha256(oldest), oldest),
    ]
    results = make_patches(new, bases, tmp_path / "work", DeltaPolicy(k=2))
    assert [r.from_sha256 for r in results] == [sha256(base)]
    assert all(isinstance(r, PatchResult) for r in results)
    results_k3 = make_patches(new, bases, tmp_path / "work3", DeltaPolicy(k=3))
    assert [r.from_sha256 for r in results_k3] == [sha256(base), sha256(oldest)]


def test_public_names_are_exported() -> None:
    import client_sdk.patching
    import server.delta

    for module in (server.delta, client_sdk.patching):
        assert all(hasattr(module, name) for name in module.__all__), module.__name__
    assert {"make_patches", "choose_best", "DeltaPolicy", "PatchResult"} <= set(
        server.delta.__all__
    )
