"""The version's flat per-platform settings → pipeline settings."""

from __future__ import annotations

import pytest

from server.compile.errors import InvalidSourceError
from server.compile.settings_map import pipeline_settings


def test_known_soc_name_alone_selects_model_and_arch():
    s = pipeline_settings("qnn", {"soc": "sm8550", "precision": "fp16"})
    assert s["qnn"] == {"precision": "fp16", "targets": [
        {"name": "SM8550", "soc_model": "43", "htp_arch": "73"}]}


def test_several_targets_mix_names_and_explicit_triples():
    s = pipeline_settings("qnn", {"targets": "SM8650, X1:99:75"})
    assert s["qnn"]["targets"] == [{"name": "SM8650", "soc_model": "57", "htp_arch": "75"},
                                   {"name": "X1", "soc_model": "99", "htp_arch": "75"}]


def test_explicit_model_and_arch_keep_the_given_name():
    s = pipeline_settings("qnn", {"soc_model": 43, "htp_arch": 73, "soc": "S23"})
    assert s["qnn"]["targets"] == [{"name": "S23", "soc_model": "43", "htp_arch": "73"}]


@pytest.mark.parametrize("flat", [{"soc": "SM1234"}, {"soc_model": "43"},
                                  {"targets": "SM8650:57"}])
def test_bad_targets_say_how_to_fix(flat):
    with pytest.raises(InvalidSourceError, match=r"SM8650|htp_arch"):
        pipeline_settings("qnn", flat)


def test_numeric_overrides_and_operator_lists_apply_to_every_precision():
    s = pipeline_settings("onnx", {"min_snr_db": 30, "deny_ops": "Softmax, Einsum",
                                   "allow_ops": "NonZero"})
    assert s["onnx"] == {}
    assert s["numeric"]["int8"] == s["numeric"]["fp16"] == {"min_snr_db": 30}
    assert s["operator_gate"] == {"deny": ["Softmax", "Einsum"], "allow": ["NonZero"]}


def test_numeric_samples_is_a_build_level_setting():
    s = pipeline_settings("qnn", {"numeric_samples": 4, "soc": "SM8650"})
    assert s["numeric_samples"] == 4 and "numeric_samples" not in s["qnn"]


def test_precision_gate_margin_and_task_reach_the_numeric_gate():
    from server.compile.gates import numeric
    from server.compile.types import Precision

    s = pipeline_settings("qnn", {"precision_gate": "seed", "margin_db": 6,
                                  "task": "classification"})
    assert s["precision_gate"] == "seed" and s["task"] == "classification"
    assert numeric.precision_gate_enforced(s)
    assert numeric.thresholds_for(Precision.FP16, s).margin_db == 6
    assert "precision_gate" not in s["qnn"] and "task" not in s["qnn"]
