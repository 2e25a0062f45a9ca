#!/usr/bin/python3
"""For each memory option of a deck (activation recompute and offload, parameter and
optimizer offload, Deep Optimizer States, bf16, and all of them with ZeRO-3 on 2 ranks),
prints the peak memory per space and category that `lamina bench memory` measures beside
the analytic prediction, and the step time `lamina bench step` measures, as a ratio to
keeping everything on the device (same rank count). Step times are the median over
rounds that run every option once in turn, so that a machine whose speed drifts (shared
or thermally limited) shifts all options alike.

  perf/memory_report.py --deck inputs/bench-torch.toml
"""
import argparse
import json
import os
import statistics
import subprocess

OPTIONS = [
    ("keep all", 1, {}),
    ("recompute all", 1, {"memory.activations": "recompute"}),
    ("offload activations", 1, {"memory.activations": "offload"}),
    ("params host", 1, {"memory.params": "host", "memory.optimizer": "host"}),
    ("optimizer host", 1, {"memory.optimizer": "host"}),
    ("optimizer dynamic", 1, {"memory.optimizer": "dynamic"}),
    ("bf16", 1, {"train.precision": "bf16"}),
    ("bf16 + optimizer host", 1, {"train.precision": "bf16", "memory.optimizer": "host"}),
    ("dp2 keep all", 2, {"parallel.dp": 2}),
    ("dp2 zero3 + all", 2, {"parallel.dp": 2, "parallel.zero": 3, "memory.activations": "recompute",
                            "memory.params": "host", "memory.optimizer": "dynamic", "train.precision": "bf16"}),
]


def run(cmd, env):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def mib(b):
    return f"{b / 2**20:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deck", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lamina", default=os.path.join(os.path.dirname(__file__), "..", "build", "apps", "lamina", "lamina"))
    a = ap.parse_args()
    env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    over = {name: [x for k, v in sets.items() for x in ("--set", f"{k}={v}")] for name, _, sets in OPTIONS}
    launch = {name: (["mpirun", "-np", str(ranks)] if ranks > 1 else []) for name, ranks, _ in OPTIONS}
    mems = {}
    for name, ranks, sets in OPTIONS:
        mem = mems[name] = run(launch[name] + [a.lamina, "bench", "memory", a.deck, "--steps", "2"] + over[name], env)
        detail = "; ".join(f"{space}: " + ", ".join(f"{c} {mib(b)}" for c, b in sorted(v.items()))
                           for space, v in mem["measured_by_category"].items())
        print(f"{name:22} measured MiB " + ", ".join(f"{s} {mib(b)}" for s, b in mem["measured_bytes"].items())
              + "  predicted " + ", ".join(f"{s} {mib(b)}" for s, b in mem["predicted_bytes"].items())
              + f"  max error {100 * mem['max_relative_error']:.2f}%\n    {detail}", flush=True)
    times = {name: [] for name, _, _ in OPTIONS}
    for r in range(a.rounds):
        for name, ranks, sets in OPTIONS:
            # Two ranks share the two cores: one BLAS thread each.
            step_env = dict(env, OPENBLAS_NUM_THREADS="1") if ranks > 1 else env
            step = run(launch[name] + [a.lamina, "bench", "step", a.deck, "--steps", str(a.steps)] + over[name], step_env)
            times[name].append(step["step_ms_median"])
        print(f"round {r + 1}: " + ", ".join(f"{n} {t[-1]:.0f}" for n, t in times.items()), flush=True)
    base = {}
    rows = []
    for name, ranks, sets in OPTIONS:
        ms = statistics.median(times[name])
        base.setdefault(ranks, ms)
        rows.append((name, ranks, mems[name], ms, ms / base[ranks]))
    print()
    spaces = sorted({s for r in rows for s in r[2]["measured_bytes"]})
    print("| option | ranks | " + " | ".join(f"{s} measured / predicted (MiB)" for s in spaces)
          + " | step ms | vs keep all |")
    print("|---|---|" + "---|" * len(spaces) + "---|---|")
    for name, ranks, mem, ms, ratio in rows:
        cells = []
        for s in spaces:
            m, p = mem["measured_bytes"].get(s), mem["predicted_bytes"].get(s)
            cells.append("-" if m is None else f"{mib(m)} / {mib(p)}")
        print(f"| {name} | {ranks} | " + " | ".join(cells) + f" | {ms:.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
