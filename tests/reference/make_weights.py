#!/usr/bin/python3
"""Writes a small GPT-2 in the weight files lamina converts, and what PyTorch computes with it.

The model is make_reference.py's initialisation with every bias and norm parameter
perturbed (so that a tensor read into the wrong place shows). Files, in --out:

  hf/model.safetensors, hf/config.json   HuggingFace layout: float32, `transformer.` names,
                                         the tied lm_head.weight stored too
  bare_bf16.safetensors                  bfloat16, names without the prefix, plus the
                                         attention-mask buffers (h.N.attn.bias) older files carry
  sharded/                               float16 in two shards, model.safetensors.index.json,
                                         config.json
  llmc.bin, llmc_bf16.bin                llm.c model files, versions 3 (float32) and 5
                                         (bfloat16), vocabulary padded to a multiple of 128
  eval_tokens.bin                        an llm.c token file (uint16) of held-out tokens
  expected.safetensors                   computed in float64 from the float32 weights:
                                         tokens (batch, seq + 1), logits (batch, seq, vocab),
                                         loss, and window_loss: the mean loss of each
                                         window of eval_tokens.bin (seq + 1 tokens, stride seq)

The safetensors and llm.c writers here follow the formats' specifications independently
of lamina's. tests/unit/io/model_weights_test.cpp reads the files; tests/reference/README.md
has the command that made them. Needs Debian's python3-torch (run with /usr/bin/python3).
"""
import argparse
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

from make_reference import init_params, logits_fn

DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
          torch.int32: "I32"}


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors, metadata=None):
    header, data, at = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        data.append(b)
        at += len(b)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(data))


def write_two_shards(directory, tensors):
    """The tensors (2 bytes each) in two shards and model.safetensors.index.json, as
    save_pretrained writes them."""
    names = list(tensors)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for s, keys in enumerate(shards):
        fname = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(directory, fname), {k: tensors[k] for k in keys}, {"format": "pt"})
        weight_map.update({k: fname for k in keys})
    total = sum(v.numel() * 2 for v in tensors.values())
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def hf_names(p, prefix):
    out = {}
    for k, v in p.items():
        key = k + ".weight" if k in ("wte", "wpe") else k
        out[prefix + key] = v
    return out


def write_config(path, layers, d, heads, seq, vocab):
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": layers, "n_head": heads,
           "n_embd": d, "n_positions": seq, "n_ctx": seq, "vocab_size": vocab, "activation_function": "gelu_new",
           "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def write_llmc(path, p, layers, d, heads, seq, vocab, dtype):
    vp = (vocab + 127) // 128 * 128
    header = [0] * 256
    header[:8] = [20240326, 3 if dtype == torch.float32 else 5, seq, vocab, layers, heads, d, vp]
    linear = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    order = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
             "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
             "mlp.c_proj.weight", "mlp.c_proj.bias"]
    parts = [torch.cat([p["wte"], torch.zeros(vp - vocab, d)]), p["wpe"]]
    for kind in order:
        for i in range(layers):
            t = p[f"h.{i}.{kind}"]
            parts.append(t.t() if kind in linear else t)  # nn.Linear's (out, in)
    parts += [p["ln_f.weight"], p["ln_f.bias"]]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        for t in parts:
            f.write(tensor_bytes(t.to(dtype)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in (("layers", 2), ("d-model", 32), ("heads", 4), ("seq", 16), ("batch", 2), ("vocab", 64),
                 ("seed", 3), ("eval-windows", 12)):
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(a.seed)
    p = init_params(a.layers, a.d_model, a.heads, a.seq, a.vocab, gen)
    for k in p:
        if k.endswith("bias"):
            p[k] = p[k] + 0.05 * torch.randn(p[k].shape, generator=gen, dtype=torch.float64)
        elif "ln_" in k:
            p[k] = p[k] + 0.1 * torch.randn(p[k].shape, generator=gen, dtype=torch.float64)
    p = {k: v.float() for k, v in p.items()}  # the stored weights; PyTorch computes from these in float64
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
    held_out = torch.randint(0, a.vocab, (a.eval_windows * a.seq + 1,), generator=gen)

    os.makedirs(os.path.join(a.out, "hf"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "sharded"), exist_ok=True)
    dims = (a.layers, a.d_model, a.heads, a.seq, a.vocab)
    full = hf_names(p, "transformer.")
    full["lm_head.weight"] = p["wte"]
    write_safetensors(os.path.join(a.out, "hf", "model.safetensors"), full, {"format": "pt"})
    write_config(os.path.join(a.out, "hf", "config.json"), *dims)
    bare = {k: v.to(torch.bfloat16) for k, v in hf_names(p, "").items()}
    mask = torch.ones(a.seq, a.seq).tril().view(1, 1, a.seq, a.seq)
    for i in range(a.layers):
        bare[f"h.{i}.attn.bias"] = mask.to(torch.bfloat16)
    write_safetensors(os.path.join(a.out, "bare_bf16.safetensors"), bare)
    half = {k: v.to(torch.float16) for k, v in hf_names(p, "transformer.").items()}
    write_two_shards(os.path.join(a.out, "sharded"), half)
    write_config(os.path.join(a.out, "sharded", "config.json"), *dims)
    write_llmc(os.path.join(a.out, "llmc.bin"), p, *dims, torch.float32)
    write_llmc(os.path.join(a.out, "llmc_bf16.bin"), p, *dims, torch.bfloat16)
    with open(os.path.join(a.out, "eval_tokens.bin"), "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, held_out.numel()] + [0] * 253)))
        f.write(held_out.to(torch.int16).numpy().tobytes())

    p64 = {k: v.double() for k, v in p.items()}
    x, y = tokens[:, :-1], tokens[:, 1:]
    logits = logits_fn(p64, x, a.layers, a.heads)
    loss = F.cross_entropy(logits.reshape(-1, a.vocab), y.reshape(-1))
    windows = held_out[: a.eval_windows * a.seq + 1].unfold(0, a.seq + 1, a.seq)
    wl = logits_fn(p64, windows[:, :-1], a.layers, a.heads)
    window_loss = F.cross_entropy(wl.reshape(-1, a.vocab), windows[:, 1:].reshape(-1), reduction="none")
    expected = {"tokens": tokens.to(torch.int32), "logits": logits.detach(), "loss": loss.detach(),
                "window_loss": window_loss.view(a.eval_windows, a.seq).mean(1).detach()}
    write_safetensors(os.path.join(a.out, "expected.safetensors"), expected)
    print(f"wrote {a.out}: loss {loss.item():.6f}, held-out loss {window_loss.mean().item():.6f}")


if __name__ == "__main__":
    main()
