#!/usr/bin/python3
"""Writes a small Llama as HuggingFace stores it, and what PyTorch computes with it.

The model is the Llama block written out here in float64 (no downloaded code): RMSNorm,
rotary positions on q and k with HuggingFace's half-split pairs and Llama 3's frequency
scaling, grouped-query attention (query head h reads key/value head h // (heads /
kv_heads)), a SwiGLU MLP down(silu(gate(x)) * up(x)), no biases, the output layer tied
to the embedding (--untied 1: an lm_head.weight of its own). Norm gains are perturbed so
that a tensor read into the wrong place shows. Files, in --out:

  hf/model.safetensors, hf/config.json   LlamaForCausalLM's names, float32, nn.Linear's
                                         (out, in) matrices, lm_head.weight only if untied
  sharded/                               bfloat16 in two shards with
                                         model.safetensors.index.json, config.json
  grads/model.safetensors, config.json   the loss's gradient with respect to every weight,
                                         float32, stored like the weights
  expected.safetensors                   in float64 from the float32 weights: tokens
                                         (batch, seq + 1), logits (batch, seq, vocab), loss

tests/unit/io/model_weights_test.cpp reads them; tests/reference/README.md has the command
that made them. Needs Debian's python3-torch (run with /usr/bin/python3).
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F

from make_weights import write_safetensors, write_two_shards


def init_params(a, gen):
    """HuggingFace names and shapes, float64."""
    def normal(*shape, std=a.std):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    d, hd = a.d_model, a.d_model // a.heads
    proj_std = a.std / math.sqrt(2 * a.layers)
    p = {"model.embed_tokens.weight": normal(a.vocab, d)}
    for i in range(a.layers):
        h = f"model.layers.{i}."
        p[h + "self_attn.q_proj.weight"] = normal(a.heads * hd, d)
        p[h + "self_attn.k_proj.weight"] = normal(a.kv_heads * hd, d)
        p[h + "self_attn.v_proj.weight"] = normal(a.kv_heads * hd, d)
        p[h + "self_attn.o_proj.weight"] = normal(d, a.heads * hd, std=proj_std)
        p[h + "mlp.gate_proj.weight"] = normal(a.ffn, d)
        p[h + "mlp.up_proj.weight"] = normal(a.ffn, d)
        p[h + "mlp.down_proj.weight"] = normal(d, a.ffn, std=proj_std)
        p[h + "input_layernorm.weight"] = 1 + 0.1 * normal(d, std=1.0)
        p[h + "post_attention_layernorm.weight"] = 1 + 0.1 * normal(d, std=1.0)
    p["model.norm.weight"] = 1 + 0.1 * normal(d, std=1.0)
    if a.untied:
        p["lm_head.weight"] = normal(a.vocab, d)
    return p


def inv_freq(a):
    """Rotary frequencies with Llama 3's scaling (long wavelengths stretched by factor)."""
    hd = a.d_model // a.heads
    f = 1.0 / (a.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if a.rope_factor <= 0:
        return f
    low_wavelen = a.rope_original / a.rope_low
    high_wavelen = a.rope_original / a.rope_high
    wavelen = 2 * math.pi / f
    scaled = torch.where(wavelen > low_wavelen, f / a.rope_factor, f)
    smooth = (a.rope_original / wavelen - a.rope_low) / (a.rope_high - a.rope_low)
    smoothed = (1 - smooth) * scaled / a.rope_factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def logits_fn(p, x, a):
    B, T = x.shape
    d, hd, group = a.d_model, a.d_model // a.heads, a.heads // a.kv_heads
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(a))
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    h = p["model.embed_tokens.weight"][x]
    for i in range(a.layers):
        q = f"model.layers.{i}."
        n = rms_norm(h, p[q + "input_layernorm.weight"], a.eps)
        qq = (n @ p[q + "self_attn.q_proj.weight"].t()).view(B, T, a.heads, hd).transpose(1, 2)
        kk = (n @ p[q + "self_attn.k_proj.weight"].t()).view(B, T, a.kv_heads, hd).transpose(1, 2)
        vv = (n @ p[q + "self_attn.v_proj.weight"].t()).view(B, T, a.kv_heads, hd).transpose(1, 2)
        qq, kk = rotate(qq, cos, sin), rotate(kk, cos, sin)
        kk, vv = kk.repeat_interleave(group, dim=1), vv.repeat_interleave(group, dim=1)
        att = (qq @ kk.transpose(-2, -1)) / math.sqrt(hd)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ vv).transpose(1, 2).reshape(B, T, a.heads * hd)
        h = h + y @ p[q + "self_attn.o_proj.weight"].t()
        n = rms_norm(h, p[q + "post_attention_layernorm.weight"], a.eps)
        m = F.silu(n @ p[q + "mlp.gate_proj.weight"].t()) * (n @ p[q + "mlp.up_proj.weight"].t())
        h = h + m @ p[q + "mlp.down_proj.weight"].t()
    h = rms_norm(h, p["model.norm.weight"], a.eps)
    return h @ p.get("lm_head.weight", p["model.embed_tokens.weight"]).t()


def write_config(path, a, dtype):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": a.layers,
           "hidden_size": a.d_model, "intermediate_size": a.ffn, "num_attention_heads": a.heads,
           "num_key_value_heads": a.kv_heads, "max_position_embeddings": a.seq, "vocab_size": a.vocab,
           "hidden_act": "silu", "rms_norm_eps": a.eps, "rope_theta": a.rope_theta,
           "rope_scaling": {"rope_type": "llama3", "factor": a.rope_factor, "low_freq_factor": a.rope_low,
                            "high_freq_factor": a.rope_high, "original_max_position_embeddings": a.rope_original},
           "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": not a.untied, "torch_dtype": dtype}
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in (("layers", 2), ("d-model", 32), ("heads", 4), ("kv-heads", 2), ("ffn", 48), ("seq", 16),
                 ("batch", 2), ("vocab", 64), ("seed", 5), ("untied", 0)):
        ap.add_argument("--" + k, type=int, default=v)
    # Scaling that reaches every branch at head width 8: wavelengths 6.3 (between the
    # bounds 2 and 8: interpolated), 63, 628 and 6283 (beyond: divided by the factor).
    # A wider initialisation than training's 0.02, so that attention and logits are far from uniform.
    for k, v in (("std", 0.2), ("eps", 1e-5), ("rope-theta", 10000.0), ("rope-factor", 4.0), ("rope-low", 1.0), ("rope-high", 4.0),
                 ("rope-original", 8.0)):
        ap.add_argument("--" + k, type=float, default=v)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(a.seed)
    p = {k: v.float() for k, v in init_params(a, gen).items()}  # stored; computed from in float64
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)

    for sub in ("hf", "sharded", "grads"):
        os.makedirs(os.path.join(a.out, sub), exist_ok=True)
    write_safetensors(os.path.join(a.out, "hf", "model.safetensors"), p, {"format": "pt"})
    write_config(os.path.join(a.out, "hf", "config.json"), a, "float32")
    write_two_shards(os.path.join(a.out, "sharded"), {k: v.to(torch.bfloat16) for k, v in p.items()})
    write_config(os.path.join(a.out, "sharded", "config.json"), a, "bfloat16")

    p64 = {k: v.double().requires_grad_() for k, v in p.items()}
    x, y = tokens[:, :-1], tokens[:, 1:]
    logits = logits_fn(p64, x, a)
    loss = F.cross_entropy(logits.reshape(-1, a.vocab), y.reshape(-1))
    loss.backward()
    grads = {k: v.grad.float() for k, v in p64.items()}
    write_safetensors(os.path.join(a.out, "grads", "model.safetensors"), grads, {"format": "pt"})
    write_config(os.path.join(a.out, "grads", "config.json"), a, "float32")
    expected = {"tokens": tokens.to(torch.int32), "logits": logits.detach(), "loss": loss.detach()}
    write_safetensors(os.path.join(a.out, "expected.safetensors"), expected)
    print(f"wrote {a.out}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
