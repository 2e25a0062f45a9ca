#!/usr/bin/python3
"""Runs one training step of a deck on a set of process layouts (mpirun, synthetic data)
and prints, per layout, the bytes each rank-0 communicator sent per group and the pipeline
bubble fraction measured on the executor's virtual clock, beside the closed forms:
  GPipe / 1F1B  (p - 1) / (M + p - 1)
  interleaved   (p - 1) / (v M + p - 1)
  modular, layer by layer  (p - 1) / (m M + p - 1), m = layers per stage
(Lamy-Poirier 2021; Narayanan et al. 2021).

  perf/parallel_report.py --deck inputs/scaling-small.toml
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

LAYOUTS = [
    ("dp2", {"parallel.dp": 2}),
    ("dp2 zero1", {"parallel.dp": 2, "parallel.zero": 1}),
    ("dp2 zero2", {"parallel.dp": 2, "parallel.zero": 2}),
    ("dp2 zero3", {"parallel.dp": 2, "parallel.zero": 3}),
    ("dp2 zero3 layered", {"parallel.dp": 2, "parallel.zero": 3, "parallel.layered": "true",
                           "parallel.schedule": "gpipe"}),
    ("tp2", {"parallel.tp": 2}),
    ("pp2 gpipe", {"parallel.pp": 2, "parallel.schedule": "gpipe"}),
    ("pp2 1f1b", {"parallel.pp": 2, "parallel.schedule": "1f1b"}),
    ("pp2 interleaved v2", {"parallel.pp": 2, "parallel.schedule": "interleaved", "parallel.virtual_stages": 2}),
    ("pp2 modular", {"parallel.pp": 2, "parallel.schedule": "modular"}),
    ("pp2 modular layered", {"parallel.pp": 2, "parallel.schedule": "modular", "parallel.layered": "true"}),
    ("pp4 1f1b", {"parallel.pp": 4, "parallel.schedule": "1f1b"}),
    ("pp4 modular layered", {"parallel.pp": 4, "parallel.schedule": "modular", "parallel.layered": "true"}),
]


def formula(sets, layers, M):
    p = int(sets.get("parallel.pp", 1))
    if p == 1:
        return 0.0
    s = sets.get("parallel.schedule", "1f1b")
    if s in ("gpipe", "1f1b"):
        return (p - 1) / (M + p - 1)
    if s == "interleaved":
        return (p - 1) / (int(sets["parallel.virtual_stages"]) * M + p - 1)
    m = layers // p  # modular: layers per stage, one layer per chunk
    return (p - 1) / (m * M + p - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deck", required=True)
    ap.add_argument("--lamina", default=os.path.join(os.path.dirname(__file__), "..", "build", "apps", "lamina", "lamina"))
    a = ap.parse_args()
    import tomllib
    with open(a.deck, "rb") as f:
        deck = tomllib.load(f)
    layers = deck["model"]["layers"]
    batch = deck["data"]["batch_size"]
    micro = deck["data"].get("micro_batch_size", batch)
    env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1", OPENBLAS_NUM_THREADS="1")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    print(f"{'layout':22} {'M':>3} {'dp bytes':>12} {'tp bytes':>12} {'pp bytes':>12} {'bubble':>8} {'formula':>8}")
    for name, sets in LAYOUTS:
        np_ = 1
        for k in ("parallel.dp", "parallel.tp", "parallel.pp"):
            np_ *= int(sets.get(k, 1))
        M = batch // (micro * int(sets.get("parallel.dp", 1)))
        with tempfile.TemporaryDirectory() as out:
            cmd = ["mpirun", "-np", str(np_), a.lamina, "train", a.deck, "--set", "train.steps=1",
                   "--set", "data.format=synthetic", "--set", f"output.dir={out}", "--set", "checkpoint.save_final=false",
                   "--set", "output.peak_tflops=1"]
            for k, v in sets.items():
                cmd += ["--set", f"{k}={v}"]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{name}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
                continue
            with open(os.path.join(out, "metrics.jsonl")) as f:
                m = json.loads(f.readline())
        c = m["comm_bytes"]
        print(f"{name:22} {M:>3} {c.get('dp', 0):>12} {c.get('tp', 0):>12} {c.get('pp', 0):>12} "
              f"{m['bubble_fraction']:>8.4f} {formula(sets, layers, M):>8.4f}", flush=True)


if __name__ == "__main__":
    main()
