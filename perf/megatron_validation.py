#!/usr/bin/python3
"""lamina's simulator against measurements no one here produced: Megatron-LM's weak
scaling on A100s (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", table 1: GPT models of 1.7B to 1T parameters, sequence
2048, vocabulary 51200, tensor-parallel 8 within a DGX A100 node, pipeline across nodes,
activation recomputation, mixed precision). For each row, `lamina plan` evaluates that
layout (tp, pp, dp, micro-batch 1, every block recomputed, parameters and optimizer on the
device, the tensor-parallel sums in bf16 as Megatron's; the pipeline schedule left to it) on inputs/machines/dgx-a100-80gb.toml, and the
predicted step is turned into TFLOP/s per GPU the paper's way (its equation 3, which counts
the recomputed forward): 96 B s l h^2 (1 + s / 6h + V / 16 l h). Where lamina cannot fit
that layout, the memory policies are left to the planner too (marked *).

  perf/megatron_validation.py [--build build] [--rows 4]
"""
import argparse
import json
import os
import subprocess
import tempfile

# params (B), heads, hidden, layers, tp, pp, GPUs, batch, TFLOP/s per GPU, % of peak
TABLE1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52),
]
S, V = 2048, 51200


def deck(heads, hidden, layers, batch):
    return f"""[model]
layers = {layers}
d_model = {hidden}
heads = {heads}
seq_len = {S}
vocab_size = {V}
[data]
format = "synthetic"
batch_size = {batch}
[train]
steps = 1
precision = "bf16"
[checkpoint]
save_final = false
"""


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(here, "..", "build"))
    ap.add_argument("--machine", default=os.path.join(here, "..", "inputs", "machines", "dgx-a100-80gb.toml"))
    ap.add_argument("--rows", type=int, default=len(TABLE1))
    args = ap.parse_args()
    lamina = os.path.join(args.build, "apps", "lamina", "lamina")
    print("| model | tp x pp x dp | Megatron TFLOP/s/GPU | lamina predicted | ratio | lamina schedule, micro-batches | lamina MFU |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for (params, heads, hidden, layers, tp, pp, gpus, batch, tflops, _) in TABLE1[: args.rows]:
            path = os.path.join(tmp, "row.toml")
            with open(path, "w") as f:
                f.write(deck(heads, hidden, layers, batch))
            dp = gpus // (tp * pp)
            fixed = [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}", "data.micro_batch_size=1",
                     "parallel.zero=0", "parallel.tp_sums=bf16", "parallel.sequence_parallel=false", "parallel.cp=1"]
            memory = ["memory.activations=recompute", "memory.params=device", "memory.optimizer=device"]
            mark = ""
            for sets in (fixed + memory, fixed):
                cmd = [lamina, "-q", "plan", path, "--ranks", str(gpus), "--machine", args.machine, "--top", "1"]
                for s in sets:
                    cmd += ["--set", s]
                out = subprocess.run(cmd, capture_output=True, text=True)
                j = json.loads(out.stdout.strip().splitlines()[-1])
                if j["feasible"]:
                    break
                mark = "*"
            if not j["feasible"]:
                print(f"| {params}B | {tp} x {pp} x {dp} | {tflops} | does not fit | | | |")
                continue
            l, h = layers, hidden
            flops = 96 * batch * S * l * h * h * (1 + S / (6 * h) + V / (16 * l * h))
            ours = flops / (j["step_s"] * gpus) / 1e12
            sched = f"{j['schedule']}{' v' + str(j['virtual_stages']) if j['schedule'] == 'interleaved' else ''}" \
                    f"{' layered' if j['layered'] else ''}, {j['micro_batches']}"
            print(f"| {params}B{mark} | {tp} x {pp} x {dp} | {tflops} | {ours:.0f} | {ours / tflops:.2f} | {sched} "
                  f"| {100 * j['mfu']:.1f}% |")


if __name__ == "__main__":
    main()
