"""
Benchmark the selective scan modes of mamba.py: forward + backward time, peak memory and kernel count,
each also as a ratio to the sequential loop.

    python bench_scan.py                               # B=16, D=384, N=16, L in {64, 256, 1024}, CPU, 2 threads
    python bench_scan.py --L 256 1024 --device cuda    # on a GPU
    python bench_scan.py --B 4 --L 64 --reps 1         # a quick look

Each (mode, L) runs in a fresh process, so its peak memory is its own: the high-water resident set
on CPU, torch.cuda.max_memory_allocated on CUDA, minus what the inputs already held. `kernels`
counts the non-view ATen ops dispatched in one forward + backward. On a GPU, a scan made of many
small ops is bound by launch latency (a few microseconds each), so this count is what the chunked
mode saves there. The inputs are realistic: A = -(1..N) (the official init), Δ = softplus(. - 2) > 0.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mamba import SCAN_MODES, selective_scan


class CountKernels(TorchDispatchMode):

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += not func.is_view
        return func(*args, **(kwargs or {}))


def time_and_peak(step, dev, warmup, reps):
    """Best time of step() over reps runs after warmup runs, and the peak memory it added (MB): the
    high-water resident set on CPU (which only grows), torch.cuda.max_memory_allocated on CUDA."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes on Linux
    times = []
    for i in range(warmup + reps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) - base
    return min(times), peak / 2**20


def measure(mode, L, args):
    """Time, extra peak memory and kernel count of one forward + backward, in this process."""
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    g = torch.Generator().manual_seed(args.seed)
    B, D, N = args.B, args.D, args.N
    r = lambda *s: torch.randn(*s, generator=g).to(dev).requires_grad_()
    inputs = dict(u=r(B, D, L), delta=r(B, D, L), B=r(B, N, L), C=r(B, N, L), z=r(B, D, L), D=r(D),
                  delta_bias=(torch.full((D,), -2.0, device=dev)).requires_grad_(),
                  A=(-torch.arange(1, N + 1, dtype=torch.float32)).repeat(D, 1).to(dev).requires_grad_())

    def step():
        y = selective_scan(**inputs, delta_softplus=True, mode=mode)
        y.backward(torch.ones_like(y))
        for t in inputs.values():
            t.grad = None

    small = {k: (v[..., :8] if k in ("u", "delta", "B", "C", "z") else v).detach().requires_grad_() for k, v in inputs.items()}
    y = selective_scan(**small, delta_softplus=True, mode=mode)
    # lazy initialisation (cuBLAS's workspace, which the backward's matmuls create) stays out of the baseline
    y.backward(torch.ones_like(y))
    t, peak_mb = time_and_peak(step, dev, args.warmup, args.reps)
    with CountKernels() as counter:
        step()
    return dict(time=t, peak_mb=peak_mb, kernels=counter.n)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--B", type=int, default=16, help="batch size (default 16)")
    p.add_argument("--D", type=int, default=384, help="channels d_inner (default 384)")
    p.add_argument("--N", type=int, default=16, help="state size (default 16)")
    p.add_argument("--L", type=int, nargs="+", default=[64, 256, 1024], help="sequence lengths (default 64 256 1024)")
    p.add_argument("--modes", nargs="+", default=list(SCAN_MODES), choices=SCAN_MODES, help="scan modes to compare")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions; the best is reported (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed repetitions first (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--one", nargs=2, metavar=("MODE", "L"), help=argparse.SUPPRESS)  # internal: one measurement
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args)))
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("CUDA is not available here")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    print(f"selective scan, forward + backward: B={args.B} D={args.D} N={args.N}, {args.device}"
          f"{f', {args.threads} threads' if args.device == 'cpu' else ''}, best of {args.reps} after {args.warmup} warm-up")
    print(f"{'L':>6}  {'mode':<11} {'time s':>8} {'x seq':>6} {'peak MB':>9} {'x seq':>6} {'kernels':>8} {'x seq':>6}")
    n_ok = 0
    for L in args.L:
        rows = {}
        for mode in args.modes:
            cmd = [sys.executable, os.path.abspath(__file__), "--one", mode, str(L)]
            cmd += [f"--{k}={getattr(args, k)}" for k in ("B", "D", "N", "device", "threads", "reps", "warmup", "seed")]
            run = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if run.returncode != 0:
                print(f"{L:>6}  {mode:<11} failed: {run.stderr.strip().splitlines()[-1:]}")
                continue
            rows[mode] = m = json.loads(run.stdout.strip().splitlines()[-1])
            n_ok += 1
            ref = rows.get("sequential")
            ratio = lambda k: f"{m[k] / ref[k]:6.2f}" if ref and ref[k] > 0 else f"{'-':>6}"
            print(f"{L:>6}  {mode:<11} {m['time']:8.3f} {ratio('time')} {m['peak_mb']:9.0f} {ratio('peak_mb')} "
                  f"{m['kernels']:8d} {ratio('kernels')}", flush=True)
    if not n_ok:
        p.exit(2, f"{p.prog}: error: every measurement failed (see the reasons above)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
