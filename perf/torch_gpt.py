#!/usr/bin/python3
"""Times GPT-2 training steps in PyTorch, the PyTorch side of `lamina bench step`.

The model is lamina's GPT-2 (tests/reference/make_reference.py has the same model in
float64): learned token and position embeddings, pre-LayerNorm blocks
x + attn(ln_1(x)), x + mlp(ln_2(x)) with causal multi-head attention (fused QKV) and a
4*d_model MLP with tanh-approximated GELU, a final LayerNorm and the LM head tied to the
token embedding; mean cross-entropy over all positions, no dropout, float32. A step is
what lamina's step is: zero the gradients, forward, backward, clip the global gradient
norm to 1.0, one torch.optim.AdamW step (lr 3e-4, betas (0.9, 0.999), eps 1e-8, weight
decay 0.01, as inputs/bench-torch.toml). Tokens are random, as lamina's synthetic data.

--precision bf16 is what a PyTorch user runs for speed: forward and loss under bf16 autocast
(products on bf16 tensor cores, fp32 weights, gradients and optimizer state), and on a GPU
the fused AdamW where this PyTorch has it; with scaled_dot_product_attention (PyTorch >= 2.0)
attention is flash attention on such a GPU. Compare with `lamina bench step --set
train.precision=bf16`.

FLOPs per step use lamina's formula (src/lamina/model/flops.hpp), PaLM's model FLOPs:
per token 6 N_mm + 12 L C T with N_mm = 12 L C^2 + V C (weights in products, tied head
included, attention over the full T x T scores), times batch * seq tokens.

Prints a line per measured step and a summary; the last line is one JSON object
(ms_per_step_median, tokens_per_s, flops_per_step, tflops_per_s, ...).

  /usr/bin/python3 perf/torch_gpt.py --layers 6 --d-model 384 --heads 6 --seq 256 --batch 4 \\
    --vocab 8192 --threads 2 --steps 10 --warmup 3
"""
import argparse
import inspect
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LR, BETAS, EPS, WEIGHT_DECAY, GRAD_CLIP, LN_EPS = 3e-4, (0.9, 0.999), 1e-8, 0.01, 1.0, 1e-5


def training_flops_per_token(layers, d_model, seq, vocab):
    """lamina's training_flops_per_token (src/lamina/model/flops.hpp)."""
    n_mm = 12.0 * layers * d_model * d_model + vocab * d_model
    return 6.0 * n_mm + 12.0 * layers * d_model * seq


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, eps=LN_EPS)
        self.c_attn = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=LN_EPS)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def attention(self, x):
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch >= 2.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v
        return self.attn_proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, seq, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=LN_EPS)
        # GPT-2 initialisation, as lamina's (model/init.cpp) and make_reference.py's.
        proj_std = 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln_" in name or name.startswith("ln_f"):
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=proj_std if name.endswith("proj.weight") else 0.02)

    def forward(self, x, y):
        T = x.shape[1]
        h = self.wte(x) + self.wpe.weight[:T]
        for block in self.h:
            h = block(h)
        logits = F.linear(self.ln_f(h), self.wte.weight)  # tied LM head, no bias
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def time_training(model, a, flops_per_token, shape, fields):
    """Times a.warmup + a.steps training steps of `model` (model(x, y) is the loss) on random
    tokens; prints a line per measured step, a summary naming the model by `shape`, and the
    JSON line with the model's `fields`."""
    dev = torch.device(a.device)
    bf16 = a.precision == "bf16"
    fused = bf16 and dev.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                            **({"fused": True} if fused else {}))
    params = sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, a.vocab, (a.warmup + a.steps, a.batch, a.seq + 1), device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    times, losses = [], []
    for s in range(a.warmup + a.steps):
        x, y = tokens[s, :, :-1], tokens[s, :, 1:]
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        loss_value = loss.item()  # waits for the step on a GPU
        sync()
        dt = time.perf_counter() - t0
        losses.append(loss_value)
        if s >= a.warmup:
            times.append(dt)
            print(f"step {s - a.warmup + 1}/{a.steps}: {dt * 1e3:.1f} ms, loss {loss_value:.4f}", flush=True)

    tokens_per_step = a.batch * a.seq
    flops_per_step = flops_per_token * tokens_per_step
    med = statistics.median(times)
    print(f"torch {torch.__version__} on {a.device} ({a.threads} threads, {a.precision}"
          f"{', fused AdamW' if fused else ''}), {shape}, {params} parameters: "
          f"{med * 1e3:.1f} ms per step (median of {len(times)}), {tokens_per_step / med:.0f} tokens/s, "
          f"{flops_per_step / 1e9:.1f} GFLOP per step, {flops_per_step / med / 1e12:.4f} TFLOP/s")
    print(json.dumps({
        "peer": "pytorch", "torch": torch.__version__, "device": a.device, "threads": a.threads,
        "precision": a.precision, "fused_adamw": fused, **fields,
        "params": params, "steps": len(times), "warmup": a.warmup,
        "attention": "sdpa" if hasattr(F, "scaled_dot_product_attention") else "explicit",
        "ms_per_step_median": round(med * 1e3, 3), "ms_per_step_min": round(min(times) * 1e3, 3),
        "tokens_per_s": round(tokens_per_step / med, 1), "flops_per_token": flops_per_token,
        "flops_per_step": flops_per_step, "tflops_per_s": round(flops_per_step / med / 1e12, 5),
        "loss_first": round(losses[0], 6), "loss_last": round(losses[-1], 6)}))


def add_run_arguments(ap):
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                    help="fp32 (default), or bf16 autocast with the fused AdamW on a GPU")


def check_run_arguments(ap, a):
    if a.steps < 1 or a.warmup < 0:
        ap.error("--steps must be at least 1 and --warmup at least 0")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in (("layers", 6), ("d-model", 384), ("heads", 6), ("seq", 256), ("batch", 4), ("vocab", 8192),
                 ("threads", 2), ("steps", 10), ("warmup", 3), ("seed", 1)):
        ap.add_argument("--" + k, type=int, default=v)
    add_run_arguments(ap)
    a = ap.parse_args()
    if a.d_model % a.heads:
        ap.error("--d-model must be divisible by --heads")
    check_run_arguments(ap, a)
    model = GPT(a.layers, a.d_model, a.heads, a.seq, a.vocab).to(torch.device(a.device))
    time_training(model, a, training_flops_per_token(a.layers, a.d_model, a.seq, a.vocab),
                  f"{a.layers} layers, d {a.d_model}, {a.heads} heads, seq {a.seq}, batch {a.batch}, vocab {a.vocab}",
                  {"layers": a.layers, "d_model": a.d_model, "heads": a.heads, "seq": a.seq, "batch": a.batch,
                   "vocab": a.vocab})


if __name__ == "__main__":
    main()
