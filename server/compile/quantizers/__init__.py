"""QDQ quantizers for the QNN compiler (issue 22): `base.Quantizer` is the interface,
`ort.OrtQdqQuantizer` onnxruntime's QNN QDQ flow (the default), `aimet.AimetQuantizer` AIMET
in its own venv (`aimet_worker.py` is what runs there); `registry.default_quantizers` lists
them by the `qnn.quantizer` setting's names."""
