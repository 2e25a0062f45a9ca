#!/usr/bin/python3
"""Writes a PyTorch reference file for lamina's model tests and `lamina verify`.

The layout is docs/reference-format.md ("lamina-reference-1"): initial float32
weights in HuggingFace GPT-2 names and (in, out) Conv1D layout, a batch x/y, and, all
computed in float64 by PyTorch autograd, the loss, every gradient and the weights after
one torch.optim.AdamW step. The files the tests use (tests/reference/ref_*.h5) were made
by it; tests/reference/README.md has the commands. Needs Debian's python3-torch and
python3-h5py (run with /usr/bin/python3).

  make_reference.py --layers 2 --d-model 32 --heads 4 --seq 16 --batch 2 --vocab 64 --seed 1 --out ref_tiny.h5
"""
import argparse
import math

import h5py
import torch
import torch.nn.functional as F

LR, BETAS, EPS, WEIGHT_DECAY, LN_EPS = 3e-4, (0.9, 0.999), 1e-8, 0.01, 1e-5


def init_params(layers, d, heads, seq, vocab, gen):
    """GPT-2 initialisation, HuggingFace names and shapes, float64."""
    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    p = {"wte": normal(vocab, d), "wpe": normal(seq, d)}
    proj_std = 0.02 / math.sqrt(2 * layers)
    for i in range(layers):
        h = f"h.{i}."
        p[h + "ln_1.weight"] = torch.ones(d, dtype=torch.float64)
        p[h + "ln_1.bias"] = torch.zeros(d, dtype=torch.float64)
        p[h + "attn.c_attn.weight"] = normal(d, 3 * d)
        p[h + "attn.c_attn.bias"] = torch.zeros(3 * d, dtype=torch.float64)
        p[h + "attn.c_proj.weight"] = normal(d, d, std=proj_std)
        p[h + "attn.c_proj.bias"] = torch.zeros(d, dtype=torch.float64)
        p[h + "ln_2.weight"] = torch.ones(d, dtype=torch.float64)
        p[h + "ln_2.bias"] = torch.zeros(d, dtype=torch.float64)
        p[h + "mlp.c_fc.weight"] = normal(d, 4 * d)
        p[h + "mlp.c_fc.bias"] = torch.zeros(4 * d, dtype=torch.float64)
        p[h + "mlp.c_proj.weight"] = normal(4 * d, d, std=proj_std)
        p[h + "mlp.c_proj.bias"] = torch.zeros(d, dtype=torch.float64)
    p["ln_f.weight"] = torch.ones(d, dtype=torch.float64)
    p["ln_f.bias"] = torch.zeros(d, dtype=torch.float64)
    return p


def logits_fn(p, x, layers, heads):
    B, T = x.shape
    d = p["wte"].shape[1]
    hd = d // heads
    h = p["wte"][x] + p["wpe"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(layers):
        q = f"h.{i}."
        a = F.layer_norm(h, (d,), p[q + "ln_1.weight"], p[q + "ln_1.bias"], LN_EPS)
        qkv = a @ p[q + "attn.c_attn.weight"] + p[q + "attn.c_attn.bias"]
        qq, kk, vv = (t.view(B, T, heads, hd).transpose(1, 2) for t in qkv.split(d, dim=2))
        att = (qq @ kk.transpose(-2, -1)) / math.sqrt(hd)
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y_att = (att @ vv).transpose(1, 2).reshape(B, T, d)
        h = h + y_att @ p[q + "attn.c_proj.weight"] + p[q + "attn.c_proj.bias"]
        m = F.layer_norm(h, (d,), p[q + "ln_2.weight"], p[q + "ln_2.bias"], LN_EPS)
        m = F.gelu(m @ p[q + "mlp.c_fc.weight"] + p[q + "mlp.c_fc.bias"], approximate="tanh")
        h = h + m @ p[q + "mlp.c_proj.weight"] + p[q + "mlp.c_proj.bias"]
    h = F.layer_norm(h, (d,), p["ln_f.weight"], p["ln_f.bias"], LN_EPS)
    return h @ p["wte"].t()


def loss_fn(p, x, y, layers, heads):
    logits = logits_fn(p, x, layers, heads)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in (("layers", 2), ("d-model", 64), ("heads", 4), ("seq", 16), ("batch", 2), ("vocab", 101), ("seed", 1)):
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.d_model % a.heads:
        ap.error("--d-model must be divisible by --heads")
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(a.seed)
    # Weights are stored in float32; the computation starts from exactly those values.
    params = {k: v.float().double().requires_grad_() for k, v in
              init_params(a.layers, a.d_model, a.heads, a.seq, a.vocab, gen).items()}
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    initial = {k: v.detach().clone() for k, v in params.items()}
    loss = loss_fn(params, x, y, a.layers, a.heads)
    loss.backward()
    grads = {k: v.grad.detach().clone() for k, v in params.items()}
    opt = torch.optim.AdamW(params.values(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    opt.step()
    with h5py.File(a.out, "w") as f:
        for key in ("layers", "d_model", "heads", "seq", "batch", "vocab", "seed"):
            f.attrs[key] = getattr(a, key)
        f.attrs.update({"format": "lamina-reference-1", "layout": "huggingface-gpt2", "ln_eps": LN_EPS,
                        "gelu": "tanh", "computed_in": "float64", "lr": LR, "beta1": BETAS[0], "beta2": BETAS[1],
                        "eps": EPS, "weight_decay": WEIGHT_DECAY, "adam_step": 1})
        f["x"] = x.to(torch.int32).numpy()
        f["y"] = y.to(torch.int32).numpy()
        f["loss"] = loss.detach().numpy()
        for k in params:
            f[k] = initial[k].float().numpy()
            f["grad/" + k] = grads[k].numpy()
            f["updated/" + k] = params[k].detach().numpy()
    print(f"wrote {a.out}: loss {loss.item():.6f} (ln V = {math.log(a.vocab):.6f})")


if __name__ == "__main__":
    main()
