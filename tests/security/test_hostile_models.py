"""Hostile model uploads against the embedded default (issue 9), each named after its attack:
code that runs when a model is opened, data that explodes when decompressed, ONNX files that
point at the server's own files. Every attack must end in a failed or refused upload that
changed and revealed nothing."""

from __future__ import annotations

import logging
import tracemalloc
import uuid
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.security import hostile_models as hostile
from tests.security.conftest import Embedded, all_api_text

X = [{"name": "x", "dtype": "float32", "shape": [1, 4]}]


def test_torchscript_setstate_cannot_read_release_key(embedded: Embedded, tmp_path: Path,
                                                      caplog) -> None:
    caplog.set_level(logging.DEBUG)
    thief = hostile.torchscript_key_thief(tmp_path / "thief.pt", embedded.key_path)
    r = embedded.upload("thief", thief, X)
    assert r.status_code == 201, r.text
    assert r.json()["source_format"] == "torchscript"

    assert embedded.settle("thief") == "failed"
    text = all_api_text(embedded, "thief")
    seed = embedded.seed_hex
    assert seed not in text and seed not in caplog.text
    assert seed[:16] not in text  # not even a prefix of it
    (build,) = embedded.client.get("/v1/models/thief/versions/1.0.0/builds").json()
    assert build["state"] == "failed"
    assert "cannot load" in build["error"] and "torchscript" in build["error"]
    assert "release.key" in build["error"]  # the attempt is visible, its bytes are not


def test_pt2_pickled_constant_cannot_run_commands(embedded: Embedded, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    targets = [tmp_path / f"pwned-{tag}", embedded.data_dir / f"pwned-{tag}",
               embedded.key_path.parent / f"pwned-{tag}", Path(f"/tmp/pwned-{tag}"),
               Path.home() / f"pwned-{tag}"]
    code = "import os\n" + "".join(
        f"os.system('touch {t} 2>/dev/null')\n" for t in targets) + "".join(
        f"open({str(t) + '.py'!r}, 'w').write('x')\n" for t in targets[:1])
    evil = hostile.pt2_pickle_payload(tmp_path / "evil.pt2", code)
    r = embedded.upload("pickled", evil, X)
    assert r.status_code == 201, r.text
    assert r.json()["source_format"] == "pt2"

    assert embedded.settle("pickled") == "failed"
    made = [t for t in [*targets, Path(str(targets[0]) + ".py")] if t.exists()]
    assert made == [], f"the pickle ran outside the sandbox and created {made}"
    (build,) = embedded.client.get("/v1/models/pickled/versions/1.0.0/builds").json()
    assert "cannot load" in build["error"] and "exported_program" in build["error"]


def _image_onnx(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["image"], ["y"])], "g",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 64, 64])])
    path.write_bytes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString())
    return path


def test_npz_bomb_is_refused_before_it_is_decompressed(embedded: Embedded,
                                                       tmp_path: Path) -> None:
    bomb = hostile.npz_bomb()
    assert bomb.stat().st_size < 2_000_000  # 1.9 MB that inflates to 1.96 GB
    model = _image_onnx(tmp_path / "relu.onnx")
    image = [{"name": "image", "dtype": "float32", "shape": [1, 3, 64, 64]}]
    tracemalloc.start()
    try:
        r = embedded.upload("bombed", model, image, reference=bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.status_code == 413, r.text
    assert "decompresses to 1966080128 bytes" in r.json()["detail"]
    assert r.json()["field"] == "reference"
    assert peak < 64 * 1024 * 1024, f"upload peaked at {peak / 2**20:.0f} MiB"
    assert embedded.client.get("/v1/models/bombed/versions/1.0.0").status_code == 404


def test_npz_with_object_array_pickle_is_refused(embedded: Embedded, tmp_path: Path) -> None:
    model = _image_onnx(tmp_path / "relu.onnx")
    evil = tmp_path / "evil.npz"
    np.savez(evil, image=np.array([{"a": 1}], dtype=object))
    r = embedded.upload("objnpz", model,
                        [{"name": "image", "dtype": "float32", "shape": [1, 3, 64, 64]}],
                        calibration=evil)
    assert r.status_code == 415 and "dtype object" in r.json()["detail"], r.text


def test_npz_whose_directory_lies_about_sizes_is_refused(embedded: Embedded,
                                                         tmp_path: Path) -> None:
    import zipfile

    model = _image_onnx(tmp_path / "relu.onnx")
    honest = tmp_path / "honest.npz"
    np.savez(honest, image=np.zeros((300, 1, 3, 64, 64), np.float32))
    liar = tmp_path / "liar.npz"
    with zipfile.ZipFile(honest) as zin, zipfile.ZipFile(liar, "w") as zout:
        info = zin.infolist()[0]
        data = zin.read(info)
        fake = zipfile.ZipInfo(info.filename)
        zout.writestr(fake, data[:4096])  # header says 300 samples, the entry holds 4 KiB
    r = embedded.upload("liar", model,
                        [{"name": "image", "dtype": "float32", "shape": [1, 3, 64, 64]}],
                        reference=liar)
    assert r.status_code == 415 and "header describes" in r.json()["detail"], r.text


def test_onnx_constant_external_data_pointing_at_host_files_is_refused(
        embedded: Embedded, tmp_path: Path) -> None:
    evil = hostile.onnx_constant_external_data(tmp_path / "const.onnx")
    r = embedded.upload("extconst", evil, X)
    assert r.status_code == 415, r.text
    assert "external-data" in r.json()["detail"]
    assert "attribute > tensor" in r.json()["detail"]
    assert embedded.client.get("/v1/models/extconst/versions/1.0.0").status_code == 404


@pytest.mark.parametrize("location", ["../../etc/passwd", "/etc/passwd", "model.onnx"])
def test_onnx_external_data_behind_an_unknown_group_field_is_refused_at_upload(
        embedded: Embedded, tmp_path: Path, location: str) -> None:
    """A hand-written TensorProto reader stopped at the group (wire types 3/4) and never saw
    the `data_location`; protobuf, which every ONNX loader uses, skips it and sees it."""
    evil = hostile.onnx_external_data_behind_a_group(tmp_path / "group.onnx", location)
    loaded = onnx.load_model_from_string(evil.read_bytes())  # what a loader would see
    assert loaded.graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL
    r = embedded.upload("extgroup", evil, X)
    assert r.status_code == 415, r.text
    assert "external-data" in r.json()["detail"] and "graph > tensor" in r.json()["detail"]
    assert embedded.client.get("/v1/models/extgroup/versions/1.0.0").status_code == 404
