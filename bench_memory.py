"""
Benchmark the two forms of linear_attn.memory: forward + backward time and peak memory of the
chunked form against the recurrent loop, for each rule.

    python bench_memory.py                              # B=4, H=4, d_k=d_v=32, T in {256, 1024, 4096}, CPU, 2 threads
    python bench_memory.py --threads 1 --reps 1         # a quicker look on one thread
    python bench_memory.py --device cuda --T 1024 4096  # on a GPU
    python bench_memory.py --rules oja --chunk_size 8 16 32 64   # choose a chunk length

Each (rule, mode, chunk, T) runs in a fresh process so its peak memory is its own: the high-water
resident set on CPU, torch.cuda.max_memory_allocated on CUDA, minus what the inputs already held.
The inputs are what the model feeds the memory: L2-normalised keys and values, beta = sigmoid(noise),
gradients for q, k, v and beta.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from bench_scan import time_and_peak
from linear_attn import DEFAULT_CHUNK, RULES, memory


def measure(rule, mode, chunk, T, args):
    """Best time and extra peak memory of one forward + backward, in this process."""
    torch.set_num_threads(args.threads)
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(args.seed)
    B, H, dk, dv = args.B, args.H, args.d_k, args.d_v
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype).to(dev)
    inputs = dict(q=r(B, H, T, dk), k=F.normalize(r(B, H, T, dk), dim=-1), v=F.normalize(r(B, H, T, dv), dim=-1),
                  beta=torch.sigmoid(r(B, H, T)))
    for t in inputs.values():
        t.requires_grad_()
    decay = args.decay if rule == "hebbian" else None

    def step(x):  # without the value checks, as the model calls it: they make the host wait for a GPU
        o, S = memory(x["q"], x["k"], x["v"], rule, x["beta"], decay, mode, chunk_size=chunk, check_values=False)
        (o.sum() + S.sum()).backward()
        for t in x.values():
            t.grad = None

    step({k: v[:, :, :8].detach().requires_grad_() for k, v in inputs.items()})  # lazy initialisation stays out of the baseline
    t, peak_mb = time_and_peak(lambda: step(inputs), dev, args.warmup, args.reps)
    return dict(time=t, peak_mb=peak_mb)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--B", type=int, default=4, help="batch size (default 4)")
    p.add_argument("--H", type=int, default=4, help="heads (default 4)")
    p.add_argument("--d_k", type=int, default=32, help="key dimension (default 32)")
    p.add_argument("--d_v", type=int, default=32, help="value dimension (default 32)")
    p.add_argument("--T", type=int, nargs="+", default=[256, 1024, 4096], help="sequence lengths (default 256 1024 4096)")
    p.add_argument("--rules", nargs="+", default=list(RULES), choices=RULES, help="rules to compare (default all)")
    p.add_argument("--chunk_size", type=int, nargs="+", default=[0], help="chunk lengths to try; 0 = per rule (default 0)")
    p.add_argument("--decay", type=float, default=1.0, help="hebbian decay (default 1)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"), help="default float32")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions; the best is reported (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed repetitions first (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--one", nargs=4, metavar=("RULE", "MODE", "CHUNK", "T"), help=argparse.SUPPRESS)  # internal
    args = p.parse_args()
    if args.one:
        rule, mode, chunk, T = args.one
        print(json.dumps(measure(rule, mode, int(chunk) or None, int(T), args)))
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("CUDA is not available here")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    print(f"linear_attn.memory, forward + backward: B={args.B} H={args.H} d_k={args.d_k} d_v={args.d_v} {args.dtype}, "
          f"{args.device}{f', {args.threads} threads' if args.device == 'cpu' else ''}, best of {args.reps} after {args.warmup} warm-up")
    print(f"{'rule':<8} {'T':>5}  {'mode':<9} {'chunk':>5} {'time s':>8} {'x rec':>6} {'peak MB':>8}")
    n_ok = 0
    for rule in args.rules:
        for T in args.T:
            ref = None
            runs = [("recurrent", 0)] + [("chunked", c) for c in args.chunk_size]
            for mode, chunk in runs:
                cmd = [sys.executable, os.path.abspath(__file__), "--one", rule, mode, str(chunk), str(T)]
                cmd += [f"--{k}={getattr(args, k)}" for k in ("B", "H", "d_k", "d_v", "decay", "device", "dtype",
                                                                "threads", "reps", "warmup", "seed")]
                run = subprocess.run(cmd, capture_output=True, text=True, env=env)
                shown = "-" if mode == "recurrent" else chunk or DEFAULT_CHUNK[rule]
                if run.returncode != 0:
                    print(f"{rule:<8} {T:>5}  {mode:<9} {shown:>5} failed: {run.stderr.strip().splitlines()[-1:]}")
                    continue
                m = json.loads(run.stdout.strip().splitlines()[-1])
                n_ok += 1
                ref = m if mode == "recurrent" else ref
                ratio = f"{m['time'] / ref['time']:6.2f}" if ref else f"{'-':>6}"
                print(f"{rule:<8} {T:>5}  {mode:<9} {shown:>5} {m['time']:8.3f} {ratio} {m['peak_mb']:8.0f}", flush=True)
    if not n_ok:
        p.exit(2, f"{p.prog}: error: every measurement failed (see the reasons above)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
