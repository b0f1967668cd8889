"""Networks of the corpus defined in code (torchvision does not install beside CPU torch):
a ResNet-style and a MobileNetV3-style classifier, a single-shot detector and a U-Net, plus
the wrappers that give Hugging Face models plain tensor outputs for export."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _conv_bn(cin: int, cout: int, stride: int = 1, act: type[nn.Module] = nn.ReLU
             ) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         act())


class Basic(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, cout, stride),
                                  nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(cout))
        self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class ResNetish(nn.Module):
    """ResNet-18 layout at reduced width: stem, 4 stages of 2 basic blocks, pool, FC."""

    def __init__(self, width: int = 32, classes: int = 100) -> None:
        super().__init__()
        w = [width, width * 2, width * 4, width * 8]
        layers: list[nn.Module] = [_conv_bn(3, w[0], 2), nn.MaxPool2d(3, 2, 1)]
        cin = w[0]
        for i, c in enumerate(w):
            layers += [Basic(cin, c, 1 if i == 0 else 2), Basic(c, c, 1)]
            cin = c
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class SqueezeExcite(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, expand: int, stride: int) -> None:
        super().__init__()
        mid = cin * expand
        self.use_skip = stride == 1 and cin == cout
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.Hardswish(),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid),
            nn.Hardswish(), SqueezeExcite(mid), nn.Conv2d(mid, cout, 1, bias=False),
            nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.use_skip else y


class MobileNetV3ish(nn.Module):
    """MobileNetV3-small layout: hardswish, depthwise convs, squeeze-excite, hardsigmoid."""

    def __init__(self, classes: int = 100) -> None:
        super().__init__()
        cfg = [(16, 16, 1, 2), (16, 24, 4, 2), (24, 24, 3, 1), (24, 40, 4, 2), (40, 48, 3, 1),
               (48, 96, 4, 2)]
        self.stem = _conv_bn(3, 16, 2, nn.Hardswish)
        self.blocks = nn.Sequential(*[InvertedResidual(*c) for c in cfg])
        self.head = nn.Sequential(nn.Linear(96, 256), nn.Hardswish(), nn.Dropout(0.2),
                                  nn.Linear(256, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(
            self.blocks(self.stem(x)), 1), 1))


class TinyDetector(nn.Module):
    """Single-shot detector: conv backbone, 2-level FPN (nearest upsample), per-cell box,
    objectness and class heads decoded to (cx, cy, w, h) with sigmoid/exp — no NMS."""

    def __init__(self, classes: int = 8, anchors: int = 3) -> None:
        super().__init__()
        self.a, self.k = anchors, classes
        self.c3 = nn.Sequential(_conv_bn(3, 16, 2), _conv_bn(16, 32, 2), _conv_bn(32, 48, 2))
        self.c4 = _conv_bn(48, 96, 2)
        self.lat3, self.lat4 = nn.Conv2d(48, 64, 1), nn.Conv2d(96, 64, 1)
        self.head = nn.Conv2d(64, anchors * (5 + classes), 1)

    def _decode(self, p: torch.Tensor) -> torch.Tensor:
        b, _, h, w = p.shape
        p = p.reshape(b, self.a, 5 + self.k, h, w).permute(0, 1, 3, 4, 2).reshape(b, -1,
                                                                                  5 + self.k)
        return torch.cat([torch.sigmoid(p[..., :2]), torch.exp(p[..., 2:4].clamp(max=4.0)),
                          torch.sigmoid(p[..., 4:])], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f3 = self.c3(x)
        f4 = self.lat4(self.c4(f3))
        p3 = self.lat3(f3) + nn.functional.interpolate(f4, scale_factor=2.0, mode="nearest")
        return torch.cat([self._decode(self.head(p3)), self._decode(self.head(f4))], dim=1)


class UNet(nn.Module):
    """U-Net with 3 levels: conv blocks, max-pool down, ConvTranspose and bilinear up."""

    def __init__(self, classes: int = 4, w: int = 16) -> None:
        super().__init__()
        self.d1 = nn.Sequential(_conv_bn(3, w), _conv_bn(w, w))
        self.d2 = nn.Sequential(_conv_bn(w, 2 * w), _conv_bn(2 * w, 2 * w))
        self.mid = nn.Sequential(_conv_bn(2 * w, 4 * w), _conv_bn(4 * w, 4 * w))
        self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, 2)
        self.u2 = _conv_bn(4 * w, 2 * w)
        self.u1 = _conv_bn(3 * w, w)
        self.out = nn.Conv2d(w, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.d1(x)
        b = self.d2(nn.functional.max_pool2d(a, 2))
        m = self.mid(nn.functional.max_pool2d(b, 2))
        b2 = self.u2(torch.cat([self.up2(m), b], 1))
        up = nn.functional.interpolate(b2, scale_factor=2.0, mode="bilinear",
                                       align_corners=False)
        return self.out(self.u1(torch.cat([up, a], 1)))


class Encoder(nn.Module):
    """A Hugging Face encoder with (input_ids, attention_mask) → last hidden state."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class Logits(nn.Module):
    """A Hugging Face model with one tensor input → logits (ViT pixels, GPT-2 token ids)."""

    def __init__(self, model: Any, arg: str) -> None:
        super().__init__()
        self.model, self.arg = model, arg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(**{self.arg: x})
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


class SpeakerEncoder(nn.Module):
    """Resemblyzer's GE2E speaker encoder: a 3-layer LSTM over 40 mel channels, the last
    layer's final hidden state through Linear + ReLU, L2-normalised (the wheel's weights)."""

    def __init__(self, mels: int = 40, hidden: int = 256, layers: int = 3) -> None:
        super().__init__()
        self.lstm = nn.LSTM(mels, hidden, layers, batch_first=True)
        self.linear = nn.Linear(hidden, hidden)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)
        embeds = torch.relu(self.linear(hidden[-1]))
        return embeds / torch.norm(embeds, dim=1, keepdim=True)
