#!/usr/bin/python3
"""Times torch.optim.AdamW steps on N float32 parameters (one tensor, the default
foreach implementation), the PyTorch side of `lamina bench adam`. Prints the median ms
per step and ms per million parameters; the last line is JSON.

  OMP_NUM_THREADS=2 /usr/bin/python3 perf/torch_adamw.py --params 10000000 --threads 2
"""
import argparse
import json
import statistics
import time

import torch

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--params", type=int, default=10_000_000)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--reps", type=int, default=20)
a = ap.parse_args()
torch.set_num_threads(a.threads)
p = torch.nn.Parameter(torch.full((a.params,), 0.5))
p.grad = torch.full((a.params,), 0.01)
opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
opt.step()
times = []
for _ in range(a.reps):
    t0 = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - t0)
ms = statistics.median(times) * 1e3
print(f"torch {torch.__version__} AdamW, {a.params} parameters, {a.threads} threads: {ms:.3f} ms median, "
      f"{ms / (a.params / 1e6):.3f} ms per million")
print(json.dumps({"peer": "pytorch", "params": a.params, "threads": a.threads, "ms_median": round(ms, 4),
                  "ms_per_million_params": round(ms / (a.params / 1e6), 4)}))
