"""Held-out check: models outside the zoo, through ``vtcsearch.compile`` on the CPU, against eager (issue 14).

The zoo's models are the ones the project is tested on; these are the ones it is not.  Each is built from its
library at a tiny configuration (random weights, no downloads), compiled with the defaults a user gets, called
on the example input, and compared with eager: a wrong answer, a crash or a multi-line error is a finding.

    python3 -m experiments.held_out                     # every model, each in its own process
    python3 -m experiments.held_out hf_opt vit_tiny     # those only

A model's line says ``ok`` with the relative error, or the one-line error ``vtcsearch.compile`` raised.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Callable

import torch


def _timm(name: str, res: int, **kw: Any) -> Callable[[], tuple]:
    def build():
        import timm
        return timm.create_model(name, pretrained=False, num_classes=10, **kw), (torch.randn(1, 3, res, res),)
    return build


def _hf(config: str, model: str, **kw: Any) -> Callable[[], tuple]:
    def build():
        import transformers
        cfg = getattr(transformers, config)(**kw)
        cfg.use_cache = False          # they return a DynamicCache otherwise, which export cannot return
        return getattr(transformers, model)(cfg), (torch.randint(0, kw["vocab_size"], (1, 8)),)
    return build


MODELS: dict[str, Callable[[], tuple]] = {
    "hf_opt": _hf("OPTConfig", "OPTModel", vocab_size=100, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                  num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=32),
    "hf_gpt_neox": _hf("GPTNeoXConfig", "GPTNeoXModel", vocab_size=100, hidden_size=32, num_hidden_layers=2,
                       intermediate_size=64, num_attention_heads=2, rotary_pct=0.5, max_position_embeddings=64),
    "hf_falcon": _hf("FalconConfig", "FalconModel", vocab_size=100, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, new_decoder_architecture=True, num_kv_heads=2),
    "hf_stablelm": _hf("StableLmConfig", "StableLmModel", vocab_size=100, hidden_size=32, num_hidden_layers=2,
                       intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       partial_rotary_factor=0.25),
    "hf_t5_encoder": _hf("T5Config", "T5EncoderModel", vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                         num_heads=4),
    "hf_distilbert": _hf("DistilBertConfig", "DistilBertModel", vocab_size=100, dim=32, hidden_dim=64, n_layers=2,
                         n_heads=2, max_position_embeddings=64),
    "vit_tiny": _timm("vit_tiny_patch16_224", 32, img_size=32, patch_size=8, depth=2),
    "xcit_nano": _timm("xcit_nano_12_p16_224", 32, img_size=32, patch_size=8, depth=2),
    "cait_xxs24": _timm("cait_xxs24_224", 32, img_size=32, patch_size=8, depth=2),
    "swin_tiny": _timm("swin_tiny_patch4_window7_224", 56, img_size=56, depths=(1, 1), num_heads=(1, 2),
                       embed_dim=16, window_size=7),
    "pit_ti": _timm("pit_ti_224", 64, img_size=64),
    "edgenext_xx_small": _timm("edgenext_xx_small", 64),
    "mobilevitv2_050": _timm("mobilevitv2_050", 64),
    "resnet10t": _timm("resnet10t", 32),
}


def check(name: str) -> str:
    """One model: ``ok`` and the relative error against eager, or the error's first line."""
    import warnings

    import vtcsearch
    from experiments.workloads.zoo import TOLERANCES
    from vtcsearch.run import tensors_of
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    t0 = time.perf_counter()
    try:
        model, inputs = MODELS[name]()
        model.eval()
        with torch.no_grad():
            want = tensors_of(model(*inputs))
            got = tensors_of(vtcsearch.compile(model, inputs)(*inputs))
        rtol, atol = TOLERANCES[torch.float32]   # every output, as the zoo's check compares them
        ok = len(got) == len(want) and all(a.shape == b.shape and torch.allclose(a, b, rtol=rtol, atol=atol)
                                           for a, b in zip(got, want))
        err = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-9)).item() for a, b in zip(got, want))
        verdict = "ok" if ok else "WRONG"
        return f"{name}: {verdict} (relative error {err:.1e}, {time.perf_counter() - t0:.0f} s)"
    except Exception as e:   # the finding is the message: its first line, as a user sees it
        lines = str(e).strip().splitlines()
        return f"{name}: FAILED {type(e).__name__}: {lines[0] if lines else ''} ({len(lines)} lines)"


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        print(check(argv[1]), flush=True)
        return
    names = argv or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; choices: {', '.join(MODELS)}")
    # Triton's interpreter must be on before anything imports triton (transformers and timm do) on a CPU
    env = dict(os.environ) if torch.cuda.is_available() else {**os.environ, "TRITON_INTERPRET": "1"}
    for n in names:   # each in its own process: a crash is a finding, not the end of the run
        r = subprocess.run([sys.executable, "-m", "experiments.held_out", "--one", n], capture_output=True,
                           text=True, timeout=900, env=env)
        lines = [x for x in r.stdout.splitlines() if x.startswith(f"{n}: ")]
        print(lines[-1] if lines else f"{n}: CRASHED (exit {r.returncode}) {r.stderr.strip()[-300:]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
