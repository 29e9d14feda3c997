"""Triton helper functions the generated kernels may call (imported into every generated module).

Pointwise expressions given to :func:`vtcsearch.codegen.kernels.pointwise` may use them too,
e.g. ``"vtc_silu(x0) * x1"``.
"""
import triton
import triton.language as tl


@triton.jit
def vtc_tanh(x):
    # tanh through the logistic function: exact at +-inf, no libdevice needed
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def vtc_sigmoid(x):
    return tl.sigmoid(x)


@triton.jit
def vtc_relu(x):
    return tl.maximum(x, 0.0)


@triton.jit
def vtc_silu(x):
    return x * tl.sigmoid(x)


@triton.jit
def vtc_gelu(x):
    # exact (erf) GELU, torch's default
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def vtc_gelu_tanh(x):
    return 0.5 * x * (1.0 + vtc_tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


@triton.jit
def vtc_hardswish(x):
    # x * relu6(x + 3) / 6, torch's hardswish
    return x * tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0) / 6.0


@triton.jit
def vtc_softcap(x, cap):
    return cap * vtc_tanh(x / cap)


@triton.jit
def vtc_rtne_bf16(x):
    # fp32 -> bf16 rounded to nearest even, by integer arithmetic on the bits: Triton's CPU
    # interpreter truncates ``x.to(tl.bfloat16)``; GPUs round, and so does this (NaN kept)
    x = x.to(tl.float32)
    bits = x.to(tl.uint32, bitcast=True)
    up = bits + 0x7FFF + ((bits >> 16) & 1)
    r = (up & 0xFFFF0000).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, r).to(tl.bfloat16)


# activation name -> expression over `{x}` (used by the GEMM epilogue and pointwise)
ACTIVATIONS = {
    None: "{x}",
    "none": "{x}",
    "relu": "vtc_relu({x})",
    "silu": "vtc_silu({x})",
    "sigmoid": "vtc_sigmoid({x})",
    "tanh": "vtc_tanh({x})",
    "gelu": "vtc_gelu({x})",
    "gelu_tanh": "vtc_gelu_tanh({x})",
    "hardswish": "vtc_hardswish({x})",
}
