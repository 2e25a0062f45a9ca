#!/usr/bin/python3
"""Scaling study driver: runs `lamina bench step DECK` under mpirun for a list of process
layouts, writes one CSV row per layout and draws efficiency plots (PNG).

Layouts are "name:key=value,key=value" with keys of the deck's [parallel] table (dp, tp, pp,
zero, schedule, virtual_stages, layered) or any "section.key". Strong scaling keeps the
deck's global batch; weak scaling multiplies data.batch_size by dp, so every data-parallel
rank keeps the same work. Efficiency is against the first layout:
  strong: speedup / (ranks / ranks_0),  weak: (tokens/s per rank) / (tokens/s per rank)_0.
Each rank's OpenBLAS gets cores / ranks threads (at least 1), so ranks do not oversubscribe.

  perf/scaling.py --deck inputs/scaling-small.toml --mode strong \\
      --layout 1:dp=1 --layout dp2:dp=2 --layout tp2:tp=2 --layout pp2:pp=2 --out runs/scaling
"""
import argparse
import csv
import json
import os
import subprocess
import sys


def parse_layout(text):
    name, _, spec = text.partition(":")
    sets = {}
    for kv in filter(None, spec.split(",")):
        k, _, v = kv.partition("=")
        sets[k if "." in k else "parallel." + k] = v
    return name, sets


def ranks_of(sets):
    n = 1
    for k in ("parallel.dp", "parallel.tp", "parallel.pp"):
        n *= int(sets.get(k, 1))
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deck", required=True)
    ap.add_argument("--layout", action="append", required=True, help="name:key=value,... (repeatable)")
    ap.add_argument("--mode", choices=("strong", "weak"), default="strong")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lamina", default=os.path.join(os.path.dirname(__file__), "..", "build", "apps", "lamina", "lamina"))
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--base-batch", type=int, default=None, help="weak scaling: batch per data-parallel rank")
    ap.add_argument("--out", default="runs/scaling")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for text in a.layout:
        name, sets = parse_layout(text)
        np_ = ranks_of(sets)
        if a.mode == "weak":
            dp = int(sets.get("parallel.dp", 1))
            if a.base_batch is None:
                sys.exit("--mode weak needs --base-batch (sequences per data-parallel rank)")
            sets["data.batch_size"] = str(a.base_batch * dp)
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(max(1, a.cores // np_)),
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        if os.geteuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = ["mpirun", "-np", str(np_), a.lamina, "bench", "step", a.deck, "--steps", str(a.steps)]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        print("+", " ".join(cmd), flush=True)
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{name}: exit {out.returncode}\n{out.stdout}\n{out.stderr}")
        j = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append({"layout": name, "ranks": np_, "settings": " ".join(f"{k}={v}" for k, v in sets.items()),
                     "step_ms": j["step_ms_median"], "tokens_per_s": j["tokens_per_s"],
                     "tokens_per_s_per_rank": j["tokens_per_s"] / np_, "gemm_fraction": j["gemm_fraction"]})
        print(f"  {name}: {np_} rank(s), {j['step_ms_median']:.1f} ms/step, {j['tokens_per_s']:.0f} tokens/s", flush=True)
    base = rows[0]
    for r in rows:
        if a.mode == "strong":
            r["efficiency"] = (base["step_ms"] / r["step_ms"]) / (r["ranks"] / base["ranks"])
        else:
            r["efficiency"] = r["tokens_per_s_per_rank"] / base["tokens_per_s_per_rank"]
    path = os.path.join(a.out, f"{a.mode}.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not found (Debian: python3-matplotlib): no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([r["layout"] for r in rows], [100 * r["efficiency"] for r in rows], color="tab:blue")
    ax.axhline(100, color="gray", linewidth=0.8)
    ax.set_ylabel(f"{a.mode} scaling efficiency (%)")
    ax.set_title(f"{os.path.basename(a.deck)}: {a.mode} scaling vs {base['layout']}")
    for i, r in enumerate(rows):
        ax.text(i, 100 * r["efficiency"] + 1, f"{r['ranks']} rk\n{r['step_ms']:.0f} ms", ha="center", fontsize=8)
    fig.tight_layout()
    png = os.path.join(a.out, f"{a.mode}.png")
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
