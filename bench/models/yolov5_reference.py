"""YOLOv5 ("v5u" anchor-free head, as ultralytics builds it from `yolov5{n,s,m,l,x}.yaml`) in
plain torch, for GPU machines without ultralytics: the real compute of the architecture, random
weights. Same layers, channels and output `(B, 4 + classes, N)` (xywh in input pixels, class
scores after sigmoid) as the exported ONNX; `bench/cloud/gpu_cloud.py` times it as a reference.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

SCALES = {  # depth, width, max channels
    "n": (0.33, 0.25, 1024),
    "s": (0.33, 0.50, 1024),
    "m": (0.67, 0.75, 1024),
    "l": (1.00, 1.00, 1024),
    "x": (1.33, 1.25, 1024),
}
REG_MAX = 16


class Conv(nn.Sequential):
    """Conv2d (no bias) + BatchNorm + SiLU, 'same' padding."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None) -> None:
        pad = k // 2 if p is None else p
        super().__init__(
            nn.Conv2d(c1, c2, k, s, pad, bias=False), nn.BatchNorm2d(c2, eps=1e-3), nn.SiLU()
        )


class Bottleneck(nn.Module):
    """1x1 then 3x3 conv, with a residual add when `shortcut`."""

    def __init__(self, c: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1, self.cv2, self.add = Conv(c, c, 1), Conv(c, c, 3), shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP block with three convs and `n` bottlenecks."""

    def __init__(self, c1: int, c2: int, n: int, shortcut: bool = True) -> None:
        super().__init__()
        c = c2 // 2
        self.cv1, self.cv2, self.cv3 = Conv(c1, c, 1), Conv(c1, c, 1), Conv(2 * c, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c, shortcut) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))
        return out


class SPPF(nn.Module):
    """Spatial pyramid pooling (fast): three chained 5x5 max-pools."""

    def __init__(self, c1: int, c2: int) -> None:
        super().__init__()
        self.cv1, self.cv2 = Conv(c1, c1 // 2, 1), Conv(c1 // 2 * 4, c2, 1)
        self.m = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        out: torch.Tensor = self.cv2(torch.cat(y, 1))
        return out


class Detect(nn.Module):
    """Anchor-free head: DFL box branch and class branch per level, decoded to pixels."""

    def __init__(self, nc: int, ch: tuple[int, ...], strides: tuple[int, ...]) -> None:
        super().__init__()
        c2, c3 = max(16, ch[0] // 4, REG_MAX * 4), max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * REG_MAX, 1))
            for x in ch
        )
        self.cv3 = nn.ModuleList(
            nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch
        )
        self.bins: torch.Tensor
        self.register_buffer("bins", torch.arange(REG_MAX, dtype=torch.float32))
        self.strides, self.nc = strides, nc

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        boxes, scores, points, scales = [], [], [], []
        for i, x in enumerate(features):
            b, _, h, w = x.shape
            boxes.append(self.cv2[i](x).view(b, 4 * REG_MAX, -1))
            scores.append(self.cv3[i](x).view(b, self.nc, -1))
            ys, xs = torch.meshgrid(
                torch.arange(h, device=x.device), torch.arange(w, device=x.device), indexing="ij"
            )
            points.append(torch.stack((xs, ys)).view(2, -1).to(x.dtype) + 0.5)
            scales.append(torch.full((1, h * w), self.strides[i], device=x.device, dtype=x.dtype))
        box, anchor, stride = torch.cat(boxes, 2), torch.cat(points, 1), torch.cat(scales, 1)
        b, _, n = box.shape
        dist = (
            box.view(b, 4, REG_MAX, n).softmax(2) * self.bins.to(box.dtype).view(1, 1, -1, 1)
        ).sum(2)
        lt, rb = dist[:, :2], dist[:, 2:]
        xywh = torch.cat(((anchor + (rb - lt) / 2), lt + rb), 1) * stride
        return torch.cat((xywh, torch.cat(scores, 2).sigmoid()), 1)


class YoloV5(nn.Module):
    """YOLOv5 backbone + PAN neck + anchor-free head at one of the five scales."""

    def __init__(self, scale: str = "x", nc: int = 80) -> None:
        super().__init__()
        depth, width, max_ch = SCALES[scale]

        def ch(c: int) -> int:
            return math.ceil(min(c, max_ch) * width / 8) * 8

        def n(count: int) -> int:
            return max(round(count * depth), 1)

        self.backbone = nn.ModuleList(
            [
                Conv(3, ch(64), 6, 2, 2),
                Conv(ch(64), ch(128), 3, 2),
                C3(ch(128), ch(128), n(3)),
                Conv(ch(128), ch(256), 3, 2),
                C3(ch(256), ch(256), n(6)),
                Conv(ch(256), ch(512), 3, 2),
                C3(ch(512), ch(512), n(9)),
                Conv(ch(512), ch(1024), 3, 2),
                C3(ch(1024), ch(1024), n(3)),
                SPPF(ch(1024), ch(1024)),
            ]
        )
        self.lat5, self.c3_p4 = Conv(ch(1024), ch(512), 1), C3(ch(1024), ch(512), n(3), False)
        self.lat4, self.c3_p3 = Conv(ch(512), ch(256), 1), C3(ch(512), ch(256), n(3), False)
        self.down3, self.c3_n4 = Conv(ch(256), ch(256), 3, 2), C3(ch(512), ch(512), n(3), False)
        self.down4, self.c3_n5 = Conv(ch(512), ch(512), 3, 2), C3(ch(1024), ch(1024), n(3), False)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.detect = Detect(nc, (ch(256), ch(512), ch(1024)), (8, 16, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        taps = {}
        for i, layer in enumerate(self.backbone):
            x = layer(x)
            taps[i] = x
        p5 = self.lat5(x)
        p4 = self.lat4(self.c3_p4(torch.cat((self.up(p5), taps[6]), 1)))
        out3 = self.c3_p3(torch.cat((self.up(p4), taps[4]), 1))
        out4 = self.c3_n4(torch.cat((self.down3(out3), p4), 1))
        out5 = self.c3_n5(torch.cat((self.down4(out4), p5), 1))
        output: torch.Tensor = self.detect([out3, out4, out5])
        return output


def build(scale: str = "x", device: str = "cuda", half: bool = True, seed: int = 0) -> Any:
    """A random-weight YOLOv5 in eval mode on `device` (fp16 where `half`, channels-last)."""
    torch.manual_seed(seed)
    model = YoloV5(scale).eval()
    with torch.no_grad():  # random weights detect nothing: no NMS flood in end-to-end runs
        for module in model.detect.cv3.modules():
            if isinstance(module, nn.Conv2d) and module.bias is not None:
                module.bias.fill_(-10.0)  # the only biased convs: each branch's last
    model = model.to(device).to(memory_format=torch.channels_last)
    return model.half() if half else model
