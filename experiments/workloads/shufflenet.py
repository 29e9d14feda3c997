"""ShuffleNetV2 x1.0 (Ma et al., ECCV 2018), torchvision architecture, at 224x224.

Written after ``torchvision/models/shufflenetv2.py`` (``shufflenet_v2_x1_0``): stages_repeats
[4, 8, 4], stages_out_channels [24, 116, 232, 464, 1024]; conv1 (3x3 s2, 24) + BN + ReLU,
MaxPool 3x3 s2, stages of InvertedResidual blocks (stride 2 first: two branches on the full
input; stride 1: channel split with ``chunk(2, dim=1)``, branch2 on the second half), ``torch.cat``,
then ``channel_shuffle`` (view [b, 2, c/2, h, w] -> transpose(1, 2) -> contiguous -> view);
conv5 1x1 (1024) + BN + ReLU, global average pool ``x.mean([2, 3])``, fc 1024 -> 1000.
(torchvision's ReLUs are ``inplace=True``; here they are out-of-place, which is the same graph
after functionalisation.)

Parameters: 2,278,604 (torchvision ``ShuffleNet_V2_X1_0_Weights.IMAGENET1K_V1.meta["num_params"]``),
matched exactly. Output: logits [b, 1000].

``size="tiny"``: stages_repeats [2, 2, 2], stages_out_channels [8, 16, 32, 64, 128], 1000 classes,
input 64x64.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import (
    Workload,
    check_common,
    check_unknown,
    finalize,
    randomize_batchnorm_,
    resolution as _resolution,
    resolve_device,
    resolve_dtype,
)

OFFICIAL_PARAMS_X1_0 = 2_278_604  # torchvision ShuffleNet_V2_X1_0_Weights meta["num_params"]


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    batchsize, num_channels, height, width = x.size()
    channels_per_group = num_channels // groups

    # reshape
    x = x.view(batchsize, groups, channels_per_group, height, width)
    x = torch.transpose(x, 1, 2).contiguous()

    # flatten
    x = x.view(batchsize, num_channels, height, width)
    return x


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int) -> None:
        super().__init__()
        if not (1 <= stride <= 3):
            raise ValueError("illegal stride value")
        self.stride = stride

        branch_features = oup // 2
        if (self.stride == 1) and (inp != branch_features << 1):
            raise ValueError(
                f"Invalid combination of stride {stride}, inp {inp} and oup {oup} values. If stride == 1 then inp should be equal to oup // 2 << 1."
            )

        if self.stride > 1:
            self.branch1 = nn.Sequential(
                self.depthwise_conv(inp, inp, kernel_size=3, stride=self.stride, padding=1),
                nn.BatchNorm2d(inp),
                nn.Conv2d(inp, branch_features, kernel_size=1, stride=1, padding=0, bias=False),
                nn.BatchNorm2d(branch_features),
                nn.ReLU(),
            )
        else:
            self.branch1 = nn.Sequential()

        self.branch2 = nn.Sequential(
            nn.Conv2d(
                inp if (self.stride > 1) else branch_features,
                branch_features,
                kernel_size=1,
                stride=1,
                padding=0,
                bias=False,
            ),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(),
            self.depthwise_conv(branch_features, branch_features, kernel_size=3, stride=self.stride, padding=1),
            nn.BatchNorm2d(branch_features),
            nn.Conv2d(branch_features, branch_features, kernel_size=1, stride=1, padding=0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(),
        )

    @staticmethod
    def depthwise_conv(i: int, o: int, kernel_size: int, stride: int = 1, padding: int = 0, bias: bool = False) -> nn.Conv2d:
        return nn.Conv2d(i, o, kernel_size, stride, padding, bias=bias, groups=i)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)

        out = channel_shuffle(out, 2)
        return out


class ShuffleNetV2(nn.Module):
    def __init__(self, stages_repeats: list[int], stages_out_channels: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        if len(stages_repeats) != 3:
            raise ValueError("expected stages_repeats as list of 3 positive ints")
        if len(stages_out_channels) != 5:
            raise ValueError("expected stages_out_channels as list of 5 positive ints")
        self._stage_out_channels = stages_out_channels

        input_channels = 3
        output_channels = self._stage_out_channels[0]
        self.conv1 = nn.Sequential(
            nn.Conv2d(input_channels, output_channels, 3, 2, 1, bias=False),
            nn.BatchNorm2d(output_channels),
            nn.ReLU(),
        )
        input_channels = output_channels

        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

        stage_names = [f"stage{i}" for i in [2, 3, 4]]
        for name, repeats, output_channels in zip(stage_names, stages_repeats, self._stage_out_channels[1:]):
            seq = [InvertedResidual(input_channels, output_channels, 2)]
            for i in range(repeats - 1):
                seq.append(InvertedResidual(output_channels, output_channels, 1))
            setattr(self, name, nn.Sequential(*seq))
            input_channels = output_channels

        output_channels = self._stage_out_channels[-1]
        self.conv5 = nn.Sequential(
            nn.Conv2d(input_channels, output_channels, 1, 1, 0, bias=False),
            nn.BatchNorm2d(output_channels),
            nn.ReLU(),
        )

        self.fc = nn.Linear(output_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.maxpool(x)
        x = self.stage2(x)
        x = self.stage3(x)
        x = self.stage4(x)
        x = self.conv5(x)
        x = x.mean([2, 3])  # globalpool
        x = self.fc(x)
        return x


X1_0 = dict(stages_repeats=[4, 8, 4], stages_out_channels=[24, 116, 232, 464, 1024])
TINY = dict(stages_repeats=[2, 2, 2], stages_out_channels=[8, 16, 32, 64, 128])

_VALID = ("resolution",)


def build(*, size: str = "full", batch: int = 1, device="meta", dtype=None, resolution=None, **unknown) -> Workload:
    """ShuffleNetV2 x1.0 workload. params: resolution (int or (H, W); default 224, tiny 64)."""
    check_unknown("shufflenet", unknown, _VALID)
    check_common(size, batch)
    if resolution is None:
        resolution = 224 if size == "full" else 64
    H, W = _resolution("resolution", resolution)
    if H % 32 or W % 32:
        raise ValueError(f"invalid resolution {(H, W)!r}; height and width must be multiples of 32")
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype, torch.float16, dev)
    with torch.device(dev):
        model = ShuffleNetV2(**(X1_0 if size == "full" else TINY))
        randomize_batchnorm_(model)
        model = finalize(model, dtype)
        x = torch.randn(batch, 3, H, W, dtype=dtype)
    tag = "x1.0" if size == "full" else "tiny"
    return Workload(
        name=f"shufflenetv2-{tag}/{H}x{W}",
        model=model,
        example_inputs=(x,),
        dtype=dtype,
        description=f"ShuffleNetV2 {tag} classification at {H}x{W}; output logits [{batch}, 1000]",
        params=dict(size=size, batch=batch, resolution=(H, W)),
    )
