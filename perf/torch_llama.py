#!/usr/bin/python3
"""Times Llama training steps in PyTorch, the PyTorch side of `lamina bench step` on a Llama deck.

The model is lamina's Llama block (tests/reference/make_llama.py has the same model in
float64): token embedding, pre-RMSNorm blocks x + attn(norm_1(x)), x + mlp(norm_2(x)) with
causal grouped-query attention (query head h reads key/value head h // (heads / kv_heads))
on rotary positions (HuggingFace's half-split pairs, base 10000), a SwiGLU MLP
down(silu(gate(x)) * up(x)) of width --ffn, no biases, a final RMSNorm and the LM head tied
to the embedding; mean cross-entropy, no dropout, float32. A step is lamina's: zero the
gradients, forward, backward, clip the global gradient norm to 1.0, one
torch.optim.AdamW step (lr 3e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, as
inputs/bench-llama.toml). Tokens are random, as lamina's synthetic data.

--precision bf16: forward and loss under bf16 autocast (fp32 weights, gradients and
optimizer state), as torch_gpt.py.

FLOPs per step use lamina's formula (src/lamina/model/flops.hpp): per token 6 N_mm + 12 L C T,
N_mm = L (C (Q + 2 KV) + Q C + 3 C F) + V C.

  /usr/bin/python3 perf/torch_llama.py --layers 6 --d-model 384 --heads 6 --kv-heads 2 --ffn 1024 \\
    --seq 256 --batch 4 --vocab 8192 --threads 2 --steps 10 --warmup 3
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_gpt import add_run_arguments, check_run_arguments, time_training

NORM_EPS, THETA = 1e-5, 10000.0  # the optimizer's settings are torch_gpt.py's


def training_flops_per_token(layers, d, heads, kv_heads, ffn, seq, vocab):
    """lamina's training_flops_per_token (src/lamina/model/flops.hpp)."""
    hd = d / heads
    q, kv = hd * heads, hd * kv_heads
    n_mm = layers * (d * (q + 2 * kv) + q * d + 3 * d * ffn) + vocab * d
    return 6.0 * n_mm + 12.0 * layers * d * seq


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Block(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.norm_1 = RMSNorm(d)
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=False)
        self.attn_proj = nn.Linear(heads * self.hd, d, bias=False)
        self.norm_2 = RMSNorm(d)
        self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        self.mlp_proj = nn.Linear(ffn, d, bias=False)

    def attention(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], dim=2)
        q = rotate(q.view(B, T, self.heads, self.hd).transpose(1, 2), cos, sin)
        k = rotate(k.view(B, T, self.kv_heads, self.hd).transpose(1, 2), cos, sin)
        v = v.view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch >= 2.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v
        return self.attn_proj(y.transpose(1, 2).reshape(B, T, self.heads * self.hd))

    def forward(self, x, cos, sin):
        x = x + self.attention(self.norm_1(x), cos, sin)
        gate, up = self.gate_up(self.norm_2(x)).chunk(2, dim=-1)
        return x + self.mlp_proj(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, layers, d, heads, kv_heads, ffn, seq, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.h = nn.ModuleList(Block(d, heads, kv_heads, ffn) for _ in range(layers))
        self.norm_f = RMSNorm(d)
        hd = d // heads
        freqs = torch.outer(torch.arange(seq, dtype=torch.float32),
                            1.0 / THETA ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        # lamina's initialisation (model/init.cpp): normal 0.02, output projections / sqrt(2 L).
        proj_std = 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if "norm" in name:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=proj_std if name.endswith("proj.weight") else 0.02)

    def forward(self, x, y):
        T = x.shape[1]
        h = self.wte(x)
        for block in self.h:
            h = block(h, self.cos[:T], self.sin[:T])
        logits = F.linear(self.norm_f(h), self.wte.weight)  # tied LM head
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in (("layers", 6), ("d-model", 384), ("heads", 6), ("kv-heads", 2), ("ffn", 1024), ("seq", 256),
                 ("batch", 4), ("vocab", 8192), ("threads", 2), ("steps", 10), ("warmup", 3), ("seed", 1)):
        ap.add_argument("--" + k, type=int, default=v)
    add_run_arguments(ap)
    a = ap.parse_args()
    if a.d_model % a.heads or a.heads % a.kv_heads or (a.d_model // a.heads) % 2:
        ap.error("--d-model must be divisible by --heads into even widths, --heads by --kv-heads")
    check_run_arguments(ap, a)
    model = Llama(a.layers, a.d_model, a.heads, a.kv_heads, a.ffn, a.seq, a.vocab).to(torch.device(a.device))
    time_training(model, a,
                  training_flops_per_token(a.layers, a.d_model, a.heads, a.kv_heads, a.ffn, a.seq, a.vocab),
                  f"{a.layers} layers, d {a.d_model}, {a.heads} heads ({a.kv_heads} key/value), ffn {a.ffn}, "
                  f"seq {a.seq}, batch {a.batch}, vocab {a.vocab}",
                  {"model": "llama", "layers": a.layers, "d_model": a.d_model, "heads": a.heads,
                   "kv_heads": a.kv_heads, "ffn": a.ffn, "seq": a.seq, "batch": a.batch, "vocab": a.vocab})


if __name__ == "__main__":
    main()
