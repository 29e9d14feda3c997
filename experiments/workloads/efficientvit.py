"""EfficientViT-B1 for high-resolution dense prediction (Cai et al., ICCV 2023; mit-han-lab/efficientvit).

Written after the official ``efficientvit/models/nn/ops.py``, ``efficientvit/backbone.py``
(``efficientvit_backbone_b1``) and ``efficientvit/seg.py`` (``efficientvit_seg_b1(dataset="cityscapes")``):

  * backbone B1: width_list [16, 32, 64, 128, 256], depth_list [1, 2, 3, 3, 4], dim (head dim) 16,
    expand_ratio 4, BatchNorm2d, Hardswish. Input stem = ConvLayer(3->16, s2) + 1 residual DSConv;
    stages 1-2 = MBConv (first stride 2, no shortcut; the rest identity residuals); stages 3-4 =
    a stride-2 MBConv ("fewer_norm": bias instead of BN on the first two convs) followed by
    EfficientViTBlocks (LiteMLA context module + MBConv local module, both residual).
  * LiteMLA: ``qkv`` 1x1 conv -> multi-scale aggregation (scales (5,): depthwise 5x5 conv +
    grouped 1x1 conv with 3*heads groups) -> ``torch.cat`` -> ReLU linear attention
    (reshape [B, -1, 3*dim, H*W] -> transpose -> slice q/k/v -> ReLU -> pad v with a row of ones ->
    k^T v -> q (k^T v) -> divide by the last column -> transpose -> reshape) -> ``proj`` conv + BN.
    This is the released ICCV-2023 form of ``relu_linear_att`` (the current repo computes the same
    values without the transposes). As upstream, the attention runs in fp32 when the model is
    fp16/bf16 (upstream does this with ``autocast(enabled=False)``); the result is cast back to
    the input dtype so the fp16 graph runs without autocast.
  * SegHead (Cityscapes, 19 classes): 1x1 ConvLayer+BN projections of stage4/stage3/stage2 to
    64 channels, bicubic upsampling x4 / x2 to stride 8 (fp32 as upstream, cast back), sum,
    3 residual MBConvs (expand 4), ConvLayer 64->256 (BN + Hardswish), ConvLayer 256->19 (bias).

Resolution: the paper's high-resolution setting (and the official Cityscapes evaluation) is the
full 1024x2048 Cityscapes frame, which is the default here (``resolution=`` overrides; must be
divisible by 32).

Outputs: ``head="seg"`` (default): logits [b, 19, H/8, W/8] = [b, 19, 128, 256] at 1024x2048.
``head="none"``: the backbone's multi-scale feature maps as a tuple (stage0 .. stage4):
[b,16,H/2,W/2], [b,32,H/4,W/4], [b,64,H/8,W/8], [b,128,H/16,W/16], [b,256,H/32,W/32].

Parameter counts (counted here): seg model 4,803,443 (official README Cityscapes table and the
paper: EfficientViT-B1 4.8M params); backbone alone 4,643,936 (consistent with timm's
efficientvit_b1 classifier, 9.1M = this backbone + the 4,459,688-parameter B1 ClsHead).

``size="tiny"``: widths [8, 16, 16, 32, 32], depths [1, 2, 2, 1, 1], dim 8, seg head width 16,
depth 1, input 64x128 — every block kind (DSConv, MBConv with/without shortcut, fewer-norm MBConv,
LiteMLA, EfficientViTBlock, SegHead with bicubic upsample) is still present.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ._common import (
    Workload,
    check_choice,
    check_common,
    check_unknown,
    finalize,
    randomize_batchnorm_,
    resolution as _resolution,
    resolve_device,
    resolve_dtype,
)

HEADS = ("seg", "none")
OFFICIAL_PARAMS_SEG_B1 = 4_800_000  # "4.8M" (rounded) in the official Cityscapes table
EXACT_PARAMS_SEG_B1 = 4_803_443  # what this definition has (within 0.07% of 4.8M)
EXACT_PARAMS_BACKBONE_B1 = 4_643_936


def val2tuple(x, min_len: int = 1) -> tuple:
    x = tuple(x) if isinstance(x, (list, tuple)) else (x,)
    if len(x) < min_len:
        x = x + tuple(x[-1] for _ in range(min_len - len(x)))
    return x


def list_sum(x: list):
    return x[0] if len(x) == 1 else x[0] + list_sum(x[1:])


def get_same_padding(kernel_size: int) -> int:
    assert kernel_size % 2 > 0, "kernel size should be odd number"
    return kernel_size // 2


def build_act(name: Optional[str]) -> Optional[nn.Module]:
    if name is None:
        return None
    return {"relu": nn.ReLU, "relu6": nn.ReLU6, "hswish": nn.Hardswish, "silu": nn.SiLU, "gelu": nn.GELU}[name]()


def build_norm(name: Optional[str], num_features: int) -> Optional[nn.Module]:
    if name is None:
        return None
    assert name == "bn2d"
    return nn.BatchNorm2d(num_features)


class ConvLayer(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size=3,
        stride=1,
        dilation=1,
        groups=1,
        use_bias=False,
        norm="bn2d",
        act_func="relu",
    ):
        super().__init__()
        padding = get_same_padding(kernel_size) * dilation
        self.conv = nn.Conv2d(
            in_channels,
            out_channels,
            kernel_size=(kernel_size, kernel_size),
            stride=(stride, stride),
            padding=padding,
            dilation=(dilation, dilation),
            groups=groups,
            bias=use_bias,
        )
        self.norm = build_norm(norm, num_features=out_channels)
        self.act = build_act(act_func)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.norm:
            x = self.norm(x)
        if self.act:
            x = self.act(x)
        return x


class UpSampleLayer(nn.Module):
    def __init__(self, mode="bicubic", factor=2, align_corners=False):
        super().__init__()
        self.mode = mode
        self.factor = factor
        self.align_corners = align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.factor == 1:
            return x
        dtype = x.dtype
        if dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        x = F.interpolate(x, scale_factor=self.factor, mode=self.mode, align_corners=self.align_corners)
        return x.to(dtype)


class IdentityLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class DSConv(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size=3,
        stride=1,
        use_bias=False,
        norm=("bn2d", "bn2d"),
        act_func=("relu6", None),
    ):
        super().__init__()
        use_bias = val2tuple(use_bias, 2)
        norm = val2tuple(norm, 2)
        act_func = val2tuple(act_func, 2)
        self.depth_conv = ConvLayer(
            in_channels, in_channels, kernel_size, stride, groups=in_channels,
            norm=norm[0], act_func=act_func[0], use_bias=use_bias[0],
        )
        self.point_conv = ConvLayer(
            in_channels, out_channels, 1, norm=norm[1], act_func=act_func[1], use_bias=use_bias[1]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.depth_conv(x)
        x = self.point_conv(x)
        return x


class MBConv(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size=3,
        stride=1,
        mid_channels=None,
        expand_ratio=6,
        use_bias=False,
        norm=("bn2d", "bn2d", "bn2d"),
        act_func=("relu6", "relu6", None),
    ):
        super().__init__()
        use_bias = val2tuple(use_bias, 3)
        norm = val2tuple(norm, 3)
        act_func = val2tuple(act_func, 3)
        mid_channels = mid_channels or round(in_channels * expand_ratio)
        self.inverted_conv = ConvLayer(
            in_channels, mid_channels, 1, stride=1, norm=norm[0], act_func=act_func[0], use_bias=use_bias[0]
        )
        self.depth_conv = ConvLayer(
            mid_channels, mid_channels, kernel_size, stride=stride, groups=mid_channels,
            norm=norm[1], act_func=act_func[1], use_bias=use_bias[1],
        )
        self.point_conv = ConvLayer(
            mid_channels, out_channels, 1, norm=norm[2], act_func=act_func[2], use_bias=use_bias[2]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inverted_conv(x)
        x = self.depth_conv(x)
        x = self.point_conv(x)
        return x


class LiteMLA(nn.Module):
    r"""Lightweight multi-scale linear attention"""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        heads: Optional[int] = None,
        heads_ratio: float = 1.0,
        dim=8,
        use_bias=False,
        norm=(None, "bn2d"),
        act_func=(None, None),
        kernel_func="relu",
        scales: tuple[int, ...] = (5,),
        eps=1.0e-15,
    ):
        super().__init__()
        self.eps = eps
        heads = heads or int(in_channels // dim * heads_ratio)
        total_dim = heads * dim
        use_bias = val2tuple(use_bias, 2)
        norm = val2tuple(norm, 2)
        act_func = val2tuple(act_func, 2)

        self.dim = dim
        self.qkv = ConvLayer(
            in_channels, 3 * total_dim, 1, use_bias=use_bias[0], norm=norm[0], act_func=act_func[0]
        )
        self.aggreg = nn.ModuleList(
            [
                nn.Sequential(
                    nn.Conv2d(
                        3 * total_dim, 3 * total_dim, scale, padding=get_same_padding(scale),
                        groups=3 * total_dim, bias=use_bias[0],
                    ),
                    nn.Conv2d(3 * total_dim, 3 * total_dim, 1, groups=3 * heads, bias=use_bias[0]),
                )
                for scale in scales
            ]
        )
        self.kernel_func = build_act(kernel_func)
        self.proj = ConvLayer(
            total_dim * (1 + len(scales)), out_channels, 1, use_bias=use_bias[1], norm=norm[1], act_func=act_func[1]
        )

    def relu_linear_att(self, qkv: torch.Tensor) -> torch.Tensor:
        B, _, H, W = list(qkv.size())
        dtype = qkv.dtype
        if dtype in (torch.float16, torch.bfloat16):
            qkv = qkv.float()

        qkv = torch.reshape(qkv, (B, -1, 3 * self.dim, H * W))
        qkv = torch.transpose(qkv, -1, -2)
        q, k, v = (
            qkv[..., 0 : self.dim],
            qkv[..., self.dim : 2 * self.dim],
            qkv[..., 2 * self.dim :],
        )

        # lightweight linear attention
        q = self.kernel_func(q)
        k = self.kernel_func(k)

        # linear matmul
        trans_k = k.transpose(-1, -2)

        v = F.pad(v, (0, 1), mode="constant", value=1)
        kv = torch.matmul(trans_k, v)
        out = torch.matmul(q, kv)
        out = out[..., :-1] / (out[..., -1:] + self.eps)

        out = torch.transpose(out, -1, -2)
        out = torch.reshape(out, (B, -1, H, W))
        return out.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # generate multi-scale q, k, v
        qkv = self.qkv(x)
        multi_scale_qkv = [qkv]
        for op in self.aggreg:
            multi_scale_qkv.append(op(qkv))
        multi_scale_qkv = torch.cat(multi_scale_qkv, dim=1)

        out = self.relu_linear_att(multi_scale_qkv)
        out = self.proj(out)
        return out


class ResidualBlock(nn.Module):
    def __init__(self, main: Optional[nn.Module], shortcut: Optional[nn.Module]):
        super().__init__()
        self.main = main
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.main is None:
            res = x
        elif self.shortcut is None:
            res = self.main(x)
        else:
            res = self.main(x) + self.shortcut(x)
        return res


class EfficientViTBlock(nn.Module):
    def __init__(
        self,
        in_channels: int,
        heads_ratio: float = 1.0,
        dim=32,
        expand_ratio: float = 4,
        scales=(5,),
        norm="bn2d",
        act_func="hswish",
    ):
        super().__init__()
        self.context_module = ResidualBlock(
            LiteMLA(
                in_channels=in_channels, out_channels=in_channels, heads_ratio=heads_ratio,
                dim=dim, norm=(None, norm), scales=scales,
            ),
            IdentityLayer(),
        )
        local_module = MBConv(
            in_channels=in_channels,
            out_channels=in_channels,
            expand_ratio=expand_ratio,
            use_bias=(True, True, False),
            norm=(None, None, norm),
            act_func=(act_func, act_func, None),
        )
        self.local_module = ResidualBlock(local_module, IdentityLayer())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.context_module(x)
        x = self.local_module(x)
        return x


class OpSequential(nn.Module):
    def __init__(self, op_list: list):
        super().__init__()
        self.op_list = nn.ModuleList([op for op in op_list if op is not None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for op in self.op_list:
            x = op(x)
        return x


class EfficientViTBackbone(nn.Module):
    def __init__(
        self,
        width_list: list[int],
        depth_list: list[int],
        in_channels=3,
        dim=32,
        expand_ratio=4,
        norm="bn2d",
        act_func="hswish",
    ) -> None:
        super().__init__()
        self.width_list = []
        # input stem
        input_stem = [ConvLayer(in_channels, width_list[0], stride=2, norm=norm, act_func=act_func)]
        for _ in range(depth_list[0]):
            block = self.build_local_block(width_list[0], width_list[0], 1, 1, norm, act_func)
            input_stem.append(ResidualBlock(block, IdentityLayer()))
        in_channels = width_list[0]
        self.input_stem = OpSequential(input_stem)
        self.width_list.append(in_channels)

        # stages
        stages = []
        for w, d in zip(width_list[1:3], depth_list[1:3]):
            stage = []
            for i in range(d):
                stride = 2 if i == 0 else 1
                block = self.build_local_block(in_channels, w, stride, expand_ratio, norm, act_func)
                block = ResidualBlock(block, IdentityLayer() if stride == 1 else None)
                stage.append(block)
                in_channels = w
            stages.append(OpSequential(stage))
            self.width_list.append(in_channels)

        for w, d in zip(width_list[3:], depth_list[3:]):
            stage = []
            block = self.build_local_block(in_channels, w, 2, expand_ratio, norm, act_func, fewer_norm=True)
            stage.append(ResidualBlock(block, None))
            in_channels = w
            for _ in range(d):
                stage.append(
                    EfficientViTBlock(
                        in_channels=in_channels, dim=dim, expand_ratio=expand_ratio, norm=norm, act_func=act_func
                    )
                )
            stages.append(OpSequential(stage))
            self.width_list.append(in_channels)
        self.stages = nn.ModuleList(stages)

    @staticmethod
    def build_local_block(
        in_channels: int,
        out_channels: int,
        stride: int,
        expand_ratio: float,
        norm: str,
        act_func: str,
        fewer_norm: bool = False,
    ) -> nn.Module:
        if expand_ratio == 1:
            block = DSConv(
                in_channels=in_channels,
                out_channels=out_channels,
                stride=stride,
                use_bias=(True, False) if fewer_norm else False,
                norm=(None, norm) if fewer_norm else norm,
                act_func=(act_func, None),
            )
        else:
            block = MBConv(
                in_channels=in_channels,
                out_channels=out_channels,
                stride=stride,
                expand_ratio=expand_ratio,
                use_bias=(True, True, False) if fewer_norm else False,
                norm=(None, None, norm) if fewer_norm else norm,
                act_func=(act_func, act_func, None),
            )
        return block

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        output_dict = {"input": x}
        output_dict["stage0"] = x = self.input_stem(x)
        for stage_id, stage in enumerate(self.stages, 1):
            output_dict["stage%d" % stage_id] = x = stage(x)
        output_dict["stage_final"] = x
        return output_dict


class SegHead(nn.Module):
    """Official ``SegHead`` (a DAGBlock: input ops -> "add" merge -> middle -> outputs["segout"])."""

    def __init__(
        self,
        fid_list: list[str],
        in_channel_list: list[int],
        stride_list: list[int],
        head_stride: int,
        head_width: int,
        head_depth: int,
        expand_ratio: float,
        final_expand: Optional[float],
        n_classes: int,
        norm="bn2d",
        act_func="hswish",
    ):
        super().__init__()
        inputs = []
        for in_channel, stride in zip(in_channel_list, stride_list):
            factor = stride // head_stride
            if factor == 1:
                inputs.append(ConvLayer(in_channel, head_width, 1, norm=norm, act_func=None))
            else:
                inputs.append(
                    OpSequential(
                        [ConvLayer(in_channel, head_width, 1, norm=norm, act_func=None), UpSampleLayer(factor=factor)]
                    )
                )
        self.input_keys = list(fid_list)
        self.input_ops = nn.ModuleList(inputs)

        middle = []
        for _ in range(head_depth):
            block = MBConv(
                head_width, head_width, expand_ratio=expand_ratio, norm=norm, act_func=(act_func, act_func, None)
            )
            middle.append(ResidualBlock(block, IdentityLayer()))
        self.middle = OpSequential(middle)

        self.output_keys = ["segout"]
        self.output_ops = nn.ModuleList(
            [
                OpSequential(
                    [
                        None
                        if final_expand is None
                        else ConvLayer(head_width, head_width * final_expand, 1, norm=norm, act_func=act_func),
                        ConvLayer(
                            head_width * (final_expand or 1), n_classes, 1, use_bias=True, norm=None, act_func=None
                        ),
                    ]
                )
            ]
        )

    def forward(self, feature_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        feat = [op(feature_dict[key]) for key, op in zip(self.input_keys, self.input_ops)]
        out = self.middle(list_sum(feat))
        for key, op in zip(self.output_keys, self.output_ops):
            feature_dict[key] = op(out)
        return feature_dict


class EfficientViTSeg(nn.Module):
    def __init__(self, backbone: EfficientViTBackbone, head: SegHead) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feed_dict = self.backbone(x)
        feed_dict = self.head(feed_dict)
        return feed_dict["segout"]


class EfficientViTFeatures(nn.Module):
    """head="none": the backbone, returning its multi-scale feature maps (stage0 .. stage4)."""

    def __init__(self, backbone: EfficientViTBackbone) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        d = self.backbone(x)
        return tuple(d["stage%d" % i] for i in range(len(self.backbone.stages) + 1))


B1 = dict(width_list=[16, 32, 64, 128, 256], depth_list=[1, 2, 3, 3, 4], dim=16, head_width=64, head_depth=3)
TINY = dict(width_list=[8, 16, 16, 32, 32], depth_list=[1, 2, 2, 1, 1], dim=8, head_width=16, head_depth=1)


def efficientvit_seg_b1(cfg: dict = B1, head: str = "seg") -> nn.Module:
    backbone = EfficientViTBackbone(width_list=cfg["width_list"], depth_list=cfg["depth_list"], dim=cfg["dim"])
    if head == "none":
        return EfficientViTFeatures(backbone)
    w = cfg["width_list"]
    seg_head = SegHead(
        fid_list=["stage4", "stage3", "stage2"],
        in_channel_list=[w[4], w[3], w[2]],
        stride_list=[32, 16, 8],
        head_stride=8,
        head_width=cfg["head_width"],
        head_depth=cfg["head_depth"],
        expand_ratio=4,
        final_expand=4,
        n_classes=19,
    )
    return EfficientViTSeg(backbone, seg_head)


_VALID = ("head", "resolution")


def build(
    *,
    size: str = "full",
    batch: int = 1,
    device="meta",
    dtype=None,
    head: str = "seg",
    resolution=None,
    **unknown,
) -> Workload:
    """EfficientViT-B1 (Cityscapes) workload. params: head {"seg","none"}, resolution (H, W) or int."""
    check_unknown("efficientvit", unknown, _VALID)
    check_common(size, batch)
    check_choice("head", head, HEADS)
    if resolution is None:
        resolution = (1024, 2048) if size == "full" else (64, 128)
    H, W = _resolution("resolution", resolution)
    if H % 32 or W % 32:
        raise ValueError(f"invalid resolution {(H, W)!r}; height and width must be multiples of 32")
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype, torch.float16, dev)
    cfg = B1 if size == "full" else TINY
    with torch.device(dev):
        model = efficientvit_seg_b1(cfg, head)
        randomize_batchnorm_(model)
        model = finalize(model, dtype)
        x = torch.randn(batch, 3, H, W, dtype=dtype)
    tag = "b1" if size == "full" else "tiny"
    if head == "seg":
        out = f"seg logits [{batch}, 19, {H // 8}, {W // 8}]"
    else:
        out = "feature maps " + ", ".join(
            f"[{batch}, {c}, {H // s}, {W // s}]" for c, s in zip(cfg["width_list"], (2, 4, 8, 16, 32))
        )
    return Workload(
        name=f"efficientvit-{tag}/{'seg' if head == 'seg' else 'backbone'}-{H}x{W}",
        model=model,
        example_inputs=(x,),
        dtype=dtype,
        description=f"EfficientViT-{'B1' if size == 'full' else 'tiny'} "
        f"{'Cityscapes segmentation' if head == 'seg' else 'backbone'} at {H}x{W}; output {out}",
        params=dict(size=size, batch=batch, head=head, resolution=(H, W)),
    )
