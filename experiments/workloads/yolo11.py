"""YOLO11 n / s object detection (Ultralytics), at 640x640.

Written after ``ultralytics/cfg/models/11/yolo11.yaml`` and the modules in
``ultralytics/nn/modules/{conv,block,head}.py``; the model is assembled from the yaml by a
``parse_model`` with the same channel / depth scaling rules (width scaling with
``make_divisible(min(c2, max_channels) * width, 8)``, repeats ``max(round(n * depth), 1)``):

  * Conv = Conv2d(bias=False) + BatchNorm2d(eps=1e-3, momentum=0.03) + SiLU; DWConv; Bottleneck;
  * C3k2 (a C2f): cv1 -> ``chunk(2, 1)`` -> Bottlenecks (or C3k blocks when c3k=True) each fed
    the last chunk and appended -> ``torch.cat`` -> cv2;
  * SPPF: cv1 -> 3 chained MaxPool2d(5, 1, 2) -> cat -> cv2;
  * C2PSA: cv1 -> ``split`` -> PSABlock (Attention: qkv Conv -> view [B, heads, 2*key_dim+head_dim, N]
    -> split q/k/v -> q^T k * scale -> softmax -> v attn^T -> view + depthwise positional Conv(v)
    -> proj; FFN of two 1x1 Convs; residuals) -> cat -> cv2;
  * neck: nn.Upsample(scale 2, nearest) + Concat, stride-2 Convs + Concat;
  * Detect (non-legacy YOLO11 head, nc=80, reg_max=16): per level cv2 (box, 3x3 Convs) and cv3
    (cls, DWConv+1x1 Conv pairs) -> cat; inference decoding as in export mode: view/cat the
    three levels -> split box/cls -> DFL (view [b, 4, 16, a] -> transpose -> softmax -> fixed 1x1
    conv with weights arange(16)) -> dist2bbox with anchors from make_anchors (computed from the
    feature shapes in forward) -> * strides [8, 16, 32] -> cat with sigmoid(cls).

Output (``Detect`` in export mode): [b, 84, 8400] (4 box xywh + 80 class scores for the
80x80 + 40x40 + 20x20 anchors at 640x640).

Parameter counts (``sum(p.numel() for p in model.parameters())``, unfused, as the yaml summary):
YOLO11n 2,624,080 and YOLO11s 9,458,752 — exactly the numbers in the comments of Ultralytics'
yolo11.yaml ("summary: 319 layers, 2624080 parameters" / "9458752 parameters"); the docs' rounded
2.6M / 9.4M. The 16 DFL weights are a fixed (requires_grad=False) parameter, as upstream.

``size="tiny"``: the same yaml at half the variant's width (n: 0.125, s: 0.25) and 64x64 input;
every module kind (C3k2 with Bottleneck and C3k, SPPF, C2PSA, Upsample/Concat, Detect + DFL) is present.
"""

from __future__ import annotations

import math

import torch
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

VARIANTS = ("n", "s")
# from the comments of ultralytics/cfg/models/11/yolo11.yaml ("summary: 319 layers, ... parameters")
OFFICIAL_PARAMS = {"n": 2_624_080, "s": 9_458_752}

YOLO11_YAML = {
    "nc": 80,
    "scales": {  # [depth, width, max_channels]
        "n": [0.50, 0.25, 1024],
        "s": [0.50, 0.50, 1024],
    },
    "backbone": [
        # [from, repeats, module, args]
        [-1, 1, "Conv", [64, 3, 2]],  # 0-P1/2
        [-1, 1, "Conv", [128, 3, 2]],  # 1-P2/4
        [-1, 2, "C3k2", [256, False, 0.25]],
        [-1, 1, "Conv", [256, 3, 2]],  # 3-P3/8
        [-1, 2, "C3k2", [512, False, 0.25]],
        [-1, 1, "Conv", [512, 3, 2]],  # 5-P4/16
        [-1, 2, "C3k2", [512, True]],
        [-1, 1, "Conv", [1024, 3, 2]],  # 7-P5/32
        [-1, 2, "C3k2", [1024, True]],
        [-1, 1, "SPPF", [1024, 5]],  # 9
        [-1, 2, "C2PSA", [1024]],  # 10
    ],
    "head": [
        [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
        [[-1, 6], 1, "Concat", [1]],  # cat backbone P4
        [-1, 2, "C3k2", [512, False]],  # 13
        [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
        [[-1, 4], 1, "Concat", [1]],  # cat backbone P3
        [-1, 2, "C3k2", [256, False]],  # 16 (P3/8-small)
        [-1, 1, "Conv", [256, 3, 2]],
        [[-1, 13], 1, "Concat", [1]],  # cat head P4
        [-1, 2, "C3k2", [512, False]],  # 19 (P4/16-medium)
        [-1, 1, "Conv", [512, 3, 2]],
        [[-1, 10], 1, "Concat", [1]],  # cat head P5
        [-1, 2, "C3k2", [1024, True]],  # 22 (P5/32-large)
        [[16, 19, 22], 1, "Detect", ["nc"]],  # Detect(P3, P4, P5)
    ],
}


def autopad(k, p=None, d=1):
    """Pad to 'same' shape outputs."""
    if d > 1:
        k = d * (k - 1) + 1 if isinstance(k, int) else [d * (x - 1) + 1 for x in k]
    if p is None:
        p = k // 2 if isinstance(k, int) else [x // 2 for x in k]
    return p


def make_divisible(x, divisor):
    return math.ceil(x / divisor) * divisor


class Conv(nn.Module):
    """Conv2d + BatchNorm2d + SiLU."""

    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, d=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU() if act is True else act if isinstance(act, nn.Module) else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class DWConv(Conv):
    """Depth-wise convolution."""

    def __init__(self, c1, c2, k=1, s=1, d=1, act=True):
        super().__init__(c1, c2, k, s, g=math.gcd(c1, c2), d=d, act=act)


class Concat(nn.Module):
    def __init__(self, dimension=1):
        super().__init__()
        self.d = dimension

    def forward(self, x):
        return torch.cat(x, self.d)


class Bottleneck(nn.Module):
    def __init__(self, c1, c2, shortcut=True, g=1, k=(3, 3), e=0.5):
        super().__init__()
        c_ = int(c2 * e)  # hidden channels
        self.cv1 = Conv(c1, c_, k[0], 1)
        self.cv2 = Conv(c_, c2, k[1], 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x):
        return x + self.cv2(self.cv1(x)) if self.add else self.cv2(self.cv1(x))


class C2f(nn.Module):
    """Faster implementation of CSP Bottleneck with 2 convolutions."""

    def __init__(self, c1, c2, n=1, shortcut=False, g=1, e=0.5):
        super().__init__()
        self.c = int(c2 * e)  # hidden channels
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut, g, k=((3, 3), (3, 3)), e=1.0) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class C3(nn.Module):
    """CSP Bottleneck with 3 convolutions."""

    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, k=((1, 1), (3, 3)), e=1.0) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C3k(C3):
    """C3 with customizable kernel size."""

    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5, k=3):
        super().__init__(c1, c2, n, shortcut, g, e)
        c_ = int(c2 * e)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, k=(k, k), e=1.0) for _ in range(n)))


class C3k2(C2f):
    """Faster CSP Bottleneck with 2 convolutions; C3k blocks when c3k=True."""

    def __init__(self, c1, c2, n=1, c3k=False, e=0.5, g=1, shortcut=True):
        super().__init__(c1, c2, n, shortcut, g, e)
        self.m = nn.ModuleList(
            C3k(self.c, self.c, 2, shortcut, g) if c3k else Bottleneck(self.c, self.c, shortcut, g) for _ in range(n)
        )


class SPPF(nn.Module):
    """Spatial Pyramid Pooling - Fast."""

    def __init__(self, c1, c2, k=5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class Attention(nn.Module):
    def __init__(self, dim, num_heads=8, attn_ratio=0.5):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim**-0.5
        nh_kd = self.key_dim * num_heads
        h = dim + nh_kd * 2
        self.qkv = Conv(dim, h, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, 1, g=dim, act=False)

    def forward(self, x):
        B, C, H, W = x.shape
        N = H * W
        qkv = self.qkv(x)
        q, k, v = qkv.view(B, self.num_heads, self.key_dim * 2 + self.head_dim, N).split(
            [self.key_dim, self.key_dim, self.head_dim], dim=2
        )
        attn = (q.transpose(-2, -1) @ k) * self.scale
        attn = attn.softmax(dim=-1)
        x = (v @ attn.transpose(-2, -1)).view(B, C, H, W) + self.pe(v.reshape(B, C, H, W))
        x = self.proj(x)
        return x


class PSABlock(nn.Module):
    def __init__(self, c, attn_ratio=0.5, num_heads=4, shortcut=True) -> None:
        super().__init__()
        self.attn = Attention(c, attn_ratio=attn_ratio, num_heads=num_heads)
        self.ffn = nn.Sequential(Conv(c, c * 2, 1), Conv(c * 2, c, 1, act=False))
        self.add = shortcut

    def forward(self, x):
        x = x + self.attn(x) if self.add else self.attn(x)
        x = x + self.ffn(x) if self.add else self.ffn(x)
        return x


class C2PSA(nn.Module):
    def __init__(self, c1, c2, n=1, e=0.5):
        super().__init__()
        assert c1 == c2
        self.c = int(c1 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv(2 * self.c, c1, 1)
        self.m = nn.Sequential(*(PSABlock(self.c, attn_ratio=0.5, num_heads=self.c // 64) for _ in range(n)))

    def forward(self, x):
        a, b = self.cv1(x).split((self.c, self.c), dim=1)
        b = self.m(b)
        return self.cv2(torch.cat((a, b), 1))


class DFL(nn.Module):
    """Integral module of Distribution Focal Loss: expectation over reg_max bins via a fixed 1x1 conv."""

    def __init__(self, c1=16):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1))
        self.c1 = c1

    def forward(self, x):
        b, _, a = x.shape  # batch, channels, anchors
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


def make_anchors(feats, strides, grid_cell_offset=0.5):
    """Generate anchors from features (shape-only: no data dependence)."""
    anchor_points, stride_tensor = [], []
    dtype, device = feats[0].dtype, feats[0].device
    for i, stride in enumerate(strides):
        h, w = feats[i].shape[2:]
        sx = torch.arange(end=w, device=device, dtype=dtype) + grid_cell_offset  # shift x
        sy = torch.arange(end=h, device=device, dtype=dtype) + grid_cell_offset  # shift y
        sy, sx = torch.meshgrid(sy, sx, indexing="ij")
        anchor_points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride_tensor.append(torch.full((h * w, 1), stride, dtype=dtype, device=device))
    return torch.cat(anchor_points), torch.cat(stride_tensor)


def dist2bbox(distance, anchor_points, xywh=True, dim=-1):
    """Transform distance(ltrb) to box(xywh or xyxy)."""
    lt, rb = distance.chunk(2, dim)
    x1y1 = anchor_points - lt
    x2y2 = anchor_points + rb
    if xywh:
        c_xy = (x1y1 + x2y2) / 2
        wh = x2y2 - x1y1
        return torch.cat((c_xy, wh), dim)
    return torch.cat((x1y1, x2y2), dim)


class Detect(nn.Module):
    """YOLO Detect head (YOLO11, non-legacy), returning the decoded export-mode output."""

    def __init__(self, nc=80, ch=(), strides=(8.0, 16.0, 32.0)):
        super().__init__()
        self.nc = nc
        self.nl = len(ch)
        self.reg_max = 16
        self.no = nc + self.reg_max * 4
        self.stride = tuple(float(s) for s in strides)  # computed during build upstream
        c2, c3 = max((16, ch[0] // 4, self.reg_max * 4)), max(ch[0], min(self.nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * self.reg_max, 1)) for x in ch
        )
        self.cv3 = nn.ModuleList(
            nn.Sequential(
                nn.Sequential(DWConv(x, x, 3), Conv(x, c3, 1)),
                nn.Sequential(DWConv(c3, c3, 3), Conv(c3, c3, 1)),
                nn.Conv2d(c3, self.nc, 1),
            )
            for x in ch
        )
        self.dfl = DFL(self.reg_max) if self.reg_max > 1 else nn.Identity()

    def forward(self, x):
        x = list(x)
        for i in range(self.nl):
            x[i] = torch.cat((self.cv2[i](x[i]), self.cv3[i](x[i])), 1)
        return self._inference(x)

    def _inference(self, x):
        shape = x[0].shape  # BCHW
        x_cat = torch.cat([xi.view(shape[0], self.no, -1) for xi in x], 2)
        anchors, strides = (t.transpose(0, 1) for t in make_anchors(x, self.stride, 0.5))
        box, cls = x_cat.split((self.reg_max * 4, self.nc), 1)
        dbox = dist2bbox(self.dfl(box), anchors.unsqueeze(0), xywh=True, dim=1) * strides
        return torch.cat((dbox, cls.sigmoid()), 1)


_MODULES = {
    "Conv": Conv,
    "C3k2": C3k2,
    "SPPF": SPPF,
    "C2PSA": C2PSA,
    "nn.Upsample": nn.Upsample,
    "Concat": Concat,
    "Detect": Detect,
}


def parse_model(d: dict, depth: float, width: float, max_channels: int, ch: int = 3):
    """Ultralytics ``parse_model`` restricted to the modules of yolo11.yaml."""
    nc = d["nc"]
    ch = [ch]
    layers, save, c2 = [], [], ch[-1]
    for i, (f, n, m, args) in enumerate(d["backbone"] + d["head"]):
        m_cls = _MODULES[m]
        args = [nc if a == "nc" else a for a in args]
        n = max(round(n * depth), 1) if n > 1 else n  # depth gain
        if m in ("Conv", "C3k2", "SPPF", "C2PSA"):
            c1, c2 = ch[f], args[0]
            if c2 != nc:
                c2 = make_divisible(min(c2, max_channels) * width, 8)
            args = [c1, c2, *args[1:]]
            if m in ("C3k2", "C2PSA"):
                args.insert(2, n)  # number of repeats
                n = 1
        elif m == "Concat":
            c2 = sum(ch[x] for x in f)
        elif m == "Detect":
            args.append([ch[x] for x in f])
        else:
            c2 = ch[f]
        m_ = nn.Sequential(*(m_cls(*args) for _ in range(n))) if n > 1 else m_cls(*args)
        m_.i, m_.f = i, f
        save.extend(x % i for x in ([f] if isinstance(f, int) else f) if x != -1)
        layers.append(m_)
        if i == 0:
            ch = []
        ch.append(c2)
    return nn.Sequential(*layers), sorted(save)


class DetectionModel(nn.Module):
    def __init__(self, variant: str = "n", width_scale: float = 1.0, nc: int = 80):
        super().__init__()
        d = dict(YOLO11_YAML, nc=nc)
        depth, width, max_channels = d["scales"][variant]
        self.model, self.save = parse_model(d, depth, width * width_scale, max_channels)

    def forward(self, x):
        y = []  # outputs
        for m in self.model:
            if m.f != -1:  # if not from previous layer
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
            x = m(x)
            y.append(x if m.i in self.save else None)
        return x


_VALID = ("variant", "imgsz")


def build(
    *,
    size: str = "full",
    batch: int = 1,
    device="meta",
    dtype=None,
    variant: str = "n",
    imgsz=None,
    **unknown,
) -> Workload:
    """YOLO11 detection workload. params: variant {"n","s"}, imgsz (int or (H, W), multiple of 32)."""
    check_unknown("yolo11", unknown, _VALID)
    check_common(size, batch)
    check_choice("variant", variant, VARIANTS)
    if imgsz is None:
        imgsz = 640 if size == "full" else 64
    H, W = _resolution("imgsz", imgsz)
    if H % 32 or W % 32:
        raise ValueError(f"invalid imgsz {(H, W)!r}; height and width must be multiples of 32")
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype, torch.float16, dev)
    with torch.device(dev):
        model = DetectionModel(variant, width_scale=1.0 if size == "full" else 0.5)
        randomize_batchnorm_(model)
        model = finalize(model, dtype)
        x = torch.randn(batch, 3, H, W, dtype=dtype)
    n_anchors = sum((H // s) * (W // s) for s in (8, 16, 32))
    tag = f"yolo11{variant}" if size == "full" else f"yolo11{variant}-tiny"
    return Workload(
        name=f"{tag}/{H}x{W}",
        model=model,
        example_inputs=(x,),
        dtype=dtype,
        description=f"YOLO11{variant}{'' if size == 'full' else ' (tiny: half width)'} detection at {H}x{W}; "
        f"output [{batch}, 84, {n_anchors}] (xywh + 80 class scores per anchor)",
        params=dict(size=size, batch=batch, variant=variant, imgsz=(H, W)),
    )
