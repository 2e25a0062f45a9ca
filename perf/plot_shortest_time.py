#!/usr/bin/python3
"""Draws `lamina plan --shortest-time --write-sweep FILE` sweeps: days to train against the
number of devices, for standard pipelines and for layered accumulation with modular
pipelines, one panel per sweep. The dotted lines mark how many devices the critical batch
can keep busy at tensor-parallel degree 8 by the closed forms (4 micro-batches per stage
for standard pipelines, 1 for modular ones); a cross marks each family's shortest time.
Needs python3-matplotlib.

  perf/plot_shortest_time.py sweep_a.csv [sweep_b.csv ...] --out docs/images/shortest_time.png
"""
import argparse
import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    meta, rows = {}, []
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        if line.startswith("#") and "=" in line:
            k, v = line[1:].strip().split("=", 1)
            meta[k] = v
    for r in csv.DictReader(line for line in lines if not line.startswith("#")):
        if r["feasible"] == "1":
            rows.append(r)
    return meta, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=8, help="tensor-parallel degree of the closed-form limits")
    args = ap.parse_args()
    fig, axes = plt.subplots(1, len(args.sweeps), figsize=(6 * len(args.sweeps), 4.5), squeeze=False)
    for ax, path in zip(axes[0], args.sweeps):
        meta, rows = read(path)
        for family, label, color, dy in (("standard", "standard (GPipe, 1F1B, interleaved)", "tab:blue", 10),
                                         ("layered_modular", "with layered accumulation + modular pipelines",
                                          "tab:red", -16)):
            pts = sorted((int(r["ranks"]), float(r["days"])) for r in rows if r["family"] == family)
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=label, markersize=4)
            best = min(pts, key=lambda p: p[1])
            ax.plot([best[0]], [best[1]], "x", color=color, markersize=12, mew=2)
            ax.annotate(f"{best[1]:.2f} d on {best[0]}", best, textcoords="offset points", xytext=(-60, dy),
                        color=color, fontsize=8)
        seqs = int(meta.get("batch_sequences", 0))
        if seqs:
            for n, color, what in ((args.tp * max(1, seqs // 4), "tab:blue", "4 micro-batches per stage"),
                                   (args.tp * seqs, "tab:red", "1 micro-batch per stage")):
                ax.axvline(n, color=color, linestyle=":", linewidth=1,
                           label=f"critical batch fed at tp {args.tp}, {what}")
        crit = float(meta.get("critical_batch_tokens", 0))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("devices")
        ax.set_ylabel("days to train")
        title = f"{meta.get('model', '').split('/')[-1]}, {float(meta.get('tokens', 0)) / 1e9:.0f}B tokens\n" \
                f"{meta.get('machine', '').replace('_', ' ')}; critical batch {crit / 1e6:.1f}M tokens"
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
