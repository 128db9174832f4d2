"""Reference data for tests/lua/test_dit_ops.lua, made with diffusers' Flux modules.

Writes tests/data/flux_ops/:
  ref.safetensors  float32 tensors:
    rope/ids [11, 3]          3 text tokens at (0, 0, 0), then a 2 x 4 grid of image tokens at (1, row, col)
                              (axis 0 at 1, as FLUX.1 Kontext places its reference image, so that all three
                              axes turn)
    rope/cos, rope/sin [11, 16]  FluxPosEmbed(theta=10000, axes_dim=(4, 6, 6)) of the ids (each repeated twice,
                              repeat_interleave_real=True)
    rope/x [2, 11, 32], rope/out  apply_rotary_emb(x as [B, L, H=2, D=16], (cos, sin), sequence_dim=1), as
                              FluxAttnProcessor calls it (use_real_unbind_dim=-1: adjacent pairs)
    rms/x [3, 5, 16], rms/weight [16], rms/out   torch.nn.RMSNorm(16, eps=1e-6)
    ln/x [2, 5, 32], ln/out   torch.nn.LayerNorm(32, elementwise_affine=False, eps=1e-6)
    adaln/x [1, 8, 32], adaln/emb [1, 32], adaln/norm1.linear.weight [192, 32], adaln/norm1.linear.bias [192],
    adaln/out, adaln/gate_msa  AdaLayerNormZero(32): out = LayerNorm(x) * (1 + scale_msa) + shift_msa, chunks in
                              the order shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
    adaln/y [1, 8, 32], adaln/gated  x + gate_msa[:, None] * y, the block's gated residual
    attn/hidden [1, 8, 32], attn/encoder [1, 3, 32], attn/<parameter> (FluxAttention's names: to_q, to_k,
    to_v, add_q_proj, add_k_proj, add_v_proj, to_out.0, to_add_out weights and biases, norm_q, norm_k,
    norm_added_q, norm_added_k weights), attn/out, attn/encoder_out  FluxAttention(query_dim=32, heads=2,
                              dim_head=16, added_kv_proj_dim=32, bias=True, eps=1e-6), as FluxTransformerBlock
                              builds it, on the image tokens with the text tokens, rope of rope/ids
  VERSIONS.txt     the package versions that made them

Run: python tests/ref/make_flux_ops_ref.py (from the repository root), in a venv with torch and diffusers.
"""
import os

import diffusers
import numpy as np
import safetensors
import torch
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.normalization import AdaLayerNormZero
from diffusers.models.transformers.transformer_flux import FluxAttention, FluxPosEmbed
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "flux_ops")


def main():
    torch.manual_seed(30)
    t = {}
    ids = torch.zeros(11, 3)
    for k in range(8):
        ids[3 + k] = torch.tensor([1.0, k // 4, k % 4])
    cos, sin = FluxPosEmbed(theta=10000, axes_dim=[4, 6, 6])(ids)
    x = torch.randn(2, 11, 32)
    t["rope/ids"], t["rope/cos"], t["rope/sin"], t["rope/x"] = ids, cos.float(), sin.float(), x
    t["rope/out"] = apply_rotary_emb(x.view(2, 11, 2, 16), (cos, sin), sequence_dim=1).reshape(2, 11, 32)

    rms = torch.nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        rms.weight.copy_(torch.randn(16) * 0.5 + 1)
    x = torch.randn(3, 5, 16) * 2 + 0.5
    t["rms/x"], t["rms/weight"], t["rms/out"] = x, rms.weight.detach().clone(), rms(x).detach()

    x = torch.randn(2, 5, 32) * 3 + 1
    t["ln/x"], t["ln/out"] = x, torch.nn.LayerNorm(32, elementwise_affine=False, eps=1e-6)(x).detach()

    norm1 = AdaLayerNormZero(32)
    with torch.no_grad():
        for p in norm1.parameters():
            p.copy_(torch.randn(p.shape) * 0.3)
    x, emb, y = torch.randn(1, 8, 32), torch.randn(1, 32), torch.randn(1, 8, 32)
    out, gate_msa, _, _, _ = norm1(x, emb=emb)
    t["adaln/x"], t["adaln/emb"], t["adaln/y"] = x, emb, y
    t["adaln/norm1.linear.weight"] = norm1.linear.weight.detach().clone()
    t["adaln/norm1.linear.bias"] = norm1.linear.bias.detach().clone()
    t["adaln/out"], t["adaln/gate_msa"] = out.detach(), gate_msa.detach()
    t["adaln/gated"] = (x + gate_msa[:, None] * y).detach()

    attn = FluxAttention(query_dim=32, heads=2, dim_head=16, added_kv_proj_dim=32, bias=True, eps=1e-6)
    with torch.no_grad():
        for name, p in attn.named_parameters():
            p.copy_(torch.randn(p.shape) * (0.3 if p.dim() > 1 else 0.1) + (1.0 if name.startswith("norm") else 0.0))
    hidden, encoder = torch.randn(1, 8, 32), torch.randn(1, 3, 32)
    with torch.no_grad():
        out, enc_out = attn(hidden_states=hidden, encoder_hidden_states=encoder, image_rotary_emb=(cos, sin))
    t["attn/hidden"], t["attn/encoder"], t["attn/out"], t["attn/encoder_out"] = hidden, encoder, out, enc_out
    for name, p in attn.named_parameters():
        t["attn/" + name] = p.detach().clone()

    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.float().contiguous() for k, v in t.items()}, os.path.join(OUT, "ref.safetensors"))
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write(f"diffusers {diffusers.__version__}\ntorch {torch.__version__}\nnumpy {np.__version__}\n"
                f"safetensors {safetensors.__version__}\nmade by tests/ref/make_flux_ops_ref.py\n")


if __name__ == "__main__":
    main()
