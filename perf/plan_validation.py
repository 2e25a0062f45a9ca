#!/usr/bin/python3
"""The planner against measurement on this machine: for each case, `lamina plan` (measuring
the machine and the model, the free planner keys chosen) writes its best deck for N ranks;
then `lamina bench step` and `lamina bench memory` run that deck under `mpirun -np N` (one
rank on its own).
Prints, per case, the plan and the predicted against the measured step time (median of the
rounds' medians) and peak memory per space, and the relative errors.

By default `lamina plan` runs as one process, as a new user first tries it: it starts the
other ranks itself to measure the machine with all of them at once. With --under-mpirun it
runs under `mpirun -np N` instead.

  perf/plan_validation.py --deck inputs/scaling-small.toml [--cases 2 4 2:zero3] [--rounds 3]

A case is N (every planner key free), N:zero3 (dp N, ZeRO-3, tp = pp = 1 fixed) or
N:key=value,key=value (those deck keys fixed, e.g. 4:parallel.tp=4,parallel.sequence_parallel=true).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deck", default=os.path.join(here, "..", "inputs", "scaling-small.toml"))
    ap.add_argument("--build", default=os.path.join(here, "..", "build"))
    ap.add_argument("--cases", nargs="+", default=["1", "2", "4", "2:zero3"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--under-mpirun", action="store_true", help="run `lamina plan` under mpirun -np N")
    args = ap.parse_args()
    lamina = os.path.join(args.build, "apps", "lamina", "lamina")
    common = ["--set", "checkpoint.save_final=false", "--set", "output.sample_tokens=0"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            n = int(case.split(":")[0])
            fixed = []
            if case.endswith(":zero3"):
                fixed = ["--set", f"parallel.dp={n}", "--set", "parallel.zero=3", "--set", "parallel.tp=1",
                         "--set", "parallel.pp=1"]
            elif "=" in case:
                for kv in case.split(":", 1)[1].split(","):
                    fixed += ["--set", kv]
            # One rank runs on its own, as a user runs it (mpirun -np 1 would bind it to one core).
            mpi = ["mpirun", "--oversubscribe", "-np", str(n)] if n > 1 else []
            planned = os.path.join(tmp, f"planned_{len(rows)}.toml")
            plan_cmd = [lamina, "-q", "plan", args.deck, "--ranks", str(n), "--write-deck", planned] + common + fixed
            plan = run((mpi if args.under_mpirun else []) + plan_cmd)
            times = [run(mpi + [lamina, "-q", "bench", "step", planned, "--steps", str(args.steps), "--warmup", "2"])
                     ["step_ms_median"] / 1e3 for _ in range(args.rounds)]
            mem = run(mpi + [lamina, "-q", "bench", "memory", planned, "--steps", "2"])
            meas = mem["measured_bytes"]
            dev_name = [k for k in meas if "host tier" not in k]
            host_name = [k for k in meas if "host tier" in k]
            mdev = meas[dev_name[0]] if dev_name else 0
            mhost = meas[host_name[0]] if host_name else 0
            rows.append((case, plan, times, mdev, mhost))
    print("| case | plan (dp x tp x pp, ZeRO, schedule, micro-batch x M) | step predicted | measured (rounds) | error "
          "| device peak predicted / measured | host peak predicted / measured |")
    print("|---|---|---|---|---|---|---|")
    for case, p, times, mdev, mhost in rows:
        layout = (f"{p['dp']} x {p['tp']}{' (sp)' if p.get('sequence_parallel') else ''} x {p['pp']}, "
                  f"ZeRO {p['zero']}, {p['schedule']}"
                  f"{' layered' if p['layered'] else ''}, {p['micro_batch_size']} x {p['micro_batches']}")
        ms = statistics.median(times)
        err = (p["step_s"] - ms) / ms
        pdev, phost = p["peak_bytes"]["device"], p["peak_bytes"]["host"]
        rounds = ", ".join(f"{t * 1e3:.1f}" for t in times)
        print(f"| {case} | {layout} | {p['step_s'] * 1e3:.1f} ms | {ms * 1e3:.1f} ms ({rounds}) | {100 * err:+.1f}% "
              f"| {pdev / 2**20:.2f} / {mdev / 2**20:.2f} MiB | {phost / 2**20:.2f} / {mhost / 2**20:.2f} MiB |")


if __name__ == "__main__":
    main()
