#!/usr/bin/python3
"""The planner against measurement on this machine: for each rank count, `lamina plan`
(measuring the machine and the model under mpirun, every planner key free) writes its
best deck; then `lamina bench step` and `lamina bench memory` run that deck with the same
ranks. Prints, per rank count, the plan and the predicted against the measured step time
and peak memory per space, and the relative errors.

  perf/plan_validation.py --deck inputs/scaling-small.toml --ranks 1 2 4
"""
import argparse
import json
import os
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
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    lamina = os.path.join(args.build, "apps", "lamina", "lamina")
    env_sets = ["--set", "checkpoint.save_final=false", "--set", "output.sample_tokens=0"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            mpi = ["mpirun", "--oversubscribe", "-np", str(n)]
            planned = os.path.join(tmp, f"planned_{n}.toml")
            plan = run(mpi + [lamina, "-q", "plan", args.deck, "--write-deck", planned] + env_sets)
            step = run(mpi + [lamina, "-q", "bench", "step", planned, "--steps", str(args.steps), "--warmup", "2"])
            mem = run(mpi + [lamina, "-q", "bench", "memory", planned, "--steps", "2"])
            measured_s = step["step_ms_median"] / 1e3
            meas = mem["measured_bytes"]
            dev_name = [k for k in meas if "host tier" not in k]
            host_name = [k for k in meas if "host tier" in k]
            mdev = meas[dev_name[0]] if dev_name else 0
            mhost = meas[host_name[0]] if host_name else 0
            rows.append((n, plan, measured_s, mdev, mhost))
    print("| ranks | plan (dp x tp x pp, ZeRO, schedule, micro-batch x M) | step predicted | measured | error "
          "| device peak predicted / measured | host peak predicted / measured |")
    print("|---|---|---|---|---|---|---|")
    for n, p, ms, mdev, mhost in rows:
        layout = (f"{p['dp']} x {p['tp']} x {p['pp']}, ZeRO {p['zero']}, {p['schedule']}"
                  f"{' layered' if p['layered'] else ''}, {p['micro_batch_size']} x {p['micro_batches']}")
        err = (p["step_s"] - ms) / ms
        pdev, phost = p["peak_bytes"]["device"], p["peak_bytes"]["host"]
        print(f"| {n} | {layout} | {p['step_s'] * 1e3:.1f} ms | {ms * 1e3:.1f} ms | {100 * err:+.1f}% "
              f"| {pdev / 2**20:.2f} / {mdev / 2**20:.2f} MiB | {phost / 2**20:.2f} / {mhost / 2**20:.2f} MiB |")


if __name__ == "__main__":
    main()
