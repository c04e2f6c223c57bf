"""
Training throughput of every model at its quick and paper sizes: what one step costs and where
its time goes, on this device.

    python bench.py                                    # task hmm, every model, quick and paper sizes
    python bench.py --task bijection --models transformer --sizes paper
    python bench.py --device cuda --compile            # on a GPU, with torch.compile
    python bench.py --json out/bench.json              # also write the rows as JSON

Each (model, size) is measured in a fresh process, so its peak memory is its own. Columns:
- step: forward + backward + gradient clipping + AdamW on one batch already on the device, the
  train.py recipe and batch size (bf16 autocast and fused AdamW on CUDA); best of --reps steps
  after --warmup untimed ones. tokens/s = batch_size * seq_len / step.
- FLOP/s: the FLOPs of one forward + backward (torch.utils.flop_counter: every matmul; attention as
  the full T x T product, the usual convention; the LSTM's gate matmuls and the depthwise
  convolution, which the counter misses or miscounts, by formula) over the step time. `of peak`
  divides by the dense matmul FLOP/s measured in the same process (the best of square n x n
  matmuls in the training dtype), so the ratio means the same on any machine.
- peak MB: torch.cuda.max_memory_allocated on CUDA; on CPU, the growth of the resident set's
  high-water mark over the measured steps (model, gradients, optimizer state, activations).
- data: drawing one training batch as train.py does (task.sample, which includes the HMM's soft
  targets from the forward filter; on the GPU when training on CUDA, --data_chunk batches per call,
  timed per batch) and moving it to the device. oracle: the exact posterior and the metrics for
  one batch; train.py computes them at log steps only, so the share is amortised over
  --log_interval steps. Both shares are of (data + step + amortised oracle).
- scan fwd/bwd (Mamba): the milliseconds of a step spent in the selective scan's forward and backward
  (mamba.SelectiveScan, every layer), averaged over --reps steps; the rest of the step is the
  projections, the convolution, norms, head and optimizer.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from bench_scan import time_and_peak
import mamba
from oracles import Metrics
import train


def conv_flops(grad_out, w):
    return 2 * math.prod(grad_out) * math.prod(w[1:])  # each output: C_in/groups * kernel multiply-adds


def rnn_flops(x, *weights):
    # one mkldnn LSTM layer over (T, B, in): 2 flops per weight of W_ih and W_hh per token
    return 2 * x[0] * x[1] * (math.prod(weights[0]) + math.prod(weights[1]))


def cudnn_rnn_flops(x, weights):
    # cuDNN runs all layers and directions in one op: 2 flops per token per weight of each matrix (W_ih, W_hh,
    # a projection; the biases are the 1-D ones); every layer and direction reads all tokens, x[:-1]
    return 2 * math.prod(x[:-1]) * sum(math.prod(w) for w in weights if len(w) == 2)


aten = torch.ops.aten
EXTRA_FLOPS = {  # ops the flop counter does not count (CPU attention, mkldnn and cuDNN LSTMs) or miscounts (grouped conv backward)
    aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, **kw: sdpa_flop_count(q, k, v),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda g, q, k, v, *a, **kw: sdpa_backward_flop_count(g, q, k, v),
    aten.mkldnn_rnn_layer: lambda x, w0, w1, *a, **kw: rnn_flops(x, w0, w1),
    aten.mkldnn_rnn_layer_backward: lambda x, w0, w1, *a, **kw: 2 * rnn_flops(x, w0, w1),
    aten._cudnn_rnn: lambda x, w, *a, **kw: cudnn_rnn_flops(x, w),
    aten._cudnn_rnn_backward: lambda x, w, *a, **kw: 2 * cudnn_rnn_flops(x, w),
    aten.convolution_backward: lambda g, x, w, *a, **kw: 2 * conv_flops(g, w),
}


def best_time(fn, dev, warmup, reps):
    return time_and_peak(fn, dev, warmup, reps)[0]


def matmul_peak(dev, dtype, n, reps):
    """FLOP/s of the best dense n x n matmul: the reference for `of peak`."""
    a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
    return 2 * n ** 3 / best_time(lambda: a @ b, dev, 2, reps)


def scan_share(step, dev, reps):
    """(forward, backward) seconds per step spent inside the selective scans (mamba.SelectiveScan), timed
    by wrapping its two methods over `reps` steps; the rest of a Mamba step is projections, the conv,
    norms, the head and the optimizer."""
    spent, fn = {"forward": 0.0, "backward": 0.0}, mamba.SelectiveScan
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def timed(name, method):
        def wrapper(*a):
            sync()
            t0 = time.perf_counter()
            out = method(*a)
            sync()
            spent[name] += time.perf_counter() - t0
            return out
        return staticmethod(wrapper)

    saved = {k: fn.__dict__[k] for k in spent}
    try:
        for k in spent:
            setattr(fn, k, timed(k, getattr(fn, k)))
        for _ in range(reps):
            step()
    finally:
        for k, v in saved.items():
            setattr(fn, k, v)
    return spent["forward"] / reps, spent["backward"] / reps


def measure(task_name, model_name, size, args):
    """One (model, size) in this process: the numbers of one row."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    given = {"device": args.device, "data_chunk": args.data_chunk} | ({"batch_size": args.batch_size} if args.batch_size else {})
    cfg = train.build_config(task_name, model_name, size, given)
    dev = train.pick_device(args.device)
    task, _, model, opt, _ = train.build(cfg, dev)
    B, T = cfg["train"]["batch_size"], task.seq_len
    use_bf16, ctx = train.autocast(args.dtype, dev)  # as train.py --dtype
    fwd = torch.compile(model) if args.compile else model
    g, chunk = train.data_source(cfg["train"], dev)
    batch = task.sample(B, g).to(dev, latent=False)  # as train.py: the oracle's float64 latents stay

    def step():
        with ctx:
            loss = task.loss(fwd(batch.x), batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["train"]["grad_clip"])
        opt.step()

    t_step, peak_mb = time_and_peak(step, dev, args.warmup, args.reps)  # first: the peak is the steps' own
    scan_fwd, scan_bwd = scan_share(step, dev, args.reps) if model_name == "mamba" else (0.0, 0.0)
    with FlopCounterMode(display=False, custom_mapping=EXTRA_FLOPS) as counter:
        with ctx:
            task.loss(model(batch.x), batch).backward()
    flops = counter.get_total_flops()
    t_data = best_time(lambda: task.sample(B * chunk, g).to(dev, latent=False), dev, 1, args.reps) / chunk
    with torch.no_grad(), ctx:
        out = model(batch.x).float()
    cpu_batch = batch.to("cpu")
    t_oracle = best_time(lambda: Metrics().update(task, cpu_batch, out.cpu()), dev, 1, args.reps)
    peak = matmul_peak(dev, torch.bfloat16 if use_bf16 else torch.float32, args.peak_n, args.reps)
    total = t_data + t_step + t_oracle / cfg["train"]["log_interval"]
    return dict(task=task_name, model=model_name, size=size, params=model.num_params(), batch=B, seq_len=T,
                step_s=t_step, tokens_per_s=B * T / t_step, gflop_per_step=flops / 1e9, flops_per_s=flops / t_step,
                matmul_peak=peak, of_peak=flops / t_step / peak, peak_mb=peak_mb, data_s=t_data, oracle_s=t_oracle,
                data_share=t_data / total, oracle_share=t_oracle / cfg["train"]["log_interval"] / total,
                device=str(dev) + (" bf16" if use_bf16 else ""), threads=args.threads if dev.type == "cpu" else None,
                data_device=str(g.device), data_chunk=chunk, scan_fwd_s=scan_fwd, scan_bwd_s=scan_bwd)


HEADER = (f"{'model':<12} {'size':<6} {'params':>9} {'B x T':>9} {'step ms':>8} {'tok/s':>8} {'GFLOP/s':>8} "
          f"{'of peak':>7} {'peak MB':>8} {'data':>6} {'oracle':>6} {'scan fwd/bwd ms':>15}")


def row(m):
    return (f"{m['model']:<12} {m['size']:<6} {m['params']:>9,} {m['batch']:>4} x {m['seq_len']:<3} "
            f"{1e3 * m['step_s']:8.1f} {m['tokens_per_s']:8.0f} {m['flops_per_s'] / 1e9:8.1f} {m['of_peak']:7.0%} "
            f"{m['peak_mb']:8.0f} {m['data_share']:6.1%} {m['oracle_share']:6.1%}"
            + (f" {1e3 * m['scan_fwd_s']:7.1f}/{1e3 * m['scan_bwd_s']:<7.1f}" if m.get("scan_fwd_s") else ""))


def main(argv=None):
    p = train.Parser(prog="bench.py", description=__doc__.split("\n\n")[0].strip(), allow_abbrev=False)
    p.add_argument("--task", default="hmm", choices=list(train.TASKS), help="the task whose sizes and batches to use (default hmm)")
    p.add_argument("--models", default=",".join(train.MODELS), help=f"comma-separated (default {','.join(train.MODELS)})")
    p.add_argument("--sizes", default="quick,paper", help="comma-separated presets (default quick,paper)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps (default auto)")
    p.add_argument("--dtype", default="auto", choices=list(train.CHOICES["dtype"]),
                   help="as train.py: auto (bf16 autocast on CUDA, else float32) | float32 | bfloat16")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    p.add_argument("--batch_size", type=int, default=0, help="sequences per step (default: the preset's)")
    p.add_argument("--data_chunk", type=int, default=0, help="batches per sampler call, as train.py (default 0 = auto)")
    p.add_argument("--reps", type=int, default=5, help="timed steps; the best is reported (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--peak_n", type=int, default=2048, help="matmul size of the peak reference (default 2048)")
    p.add_argument("--json", default="", help="also write the rows to this JSON file")
    p.add_argument("--one", nargs=2, metavar=("MODEL", "SIZE"), help=argparse.SUPPRESS)  # internal: one row
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    models, sizes = args.models.split(","), args.sizes.split(",")
    for kind, given, valid in (("model", models, train.MODELS), ("size", sizes, train.PRESETS)):
        bad = [x for x in given if x not in valid]
        if bad:
            p.error(f"unknown {kind} {bad[0]!r}; valid {kind}s: {', '.join(valid)}")
    if min(args.threads, args.reps, args.peak_n) < 1 or min(args.warmup, args.batch_size, args.data_chunk) < 0:
        p.error("--threads, --reps and --peak_n must be >= 1, --warmup, --batch_size and --data_chunk >= 0")
    try:
        train.check_device(args.device)
        train.pick_device(args.device)
        if args.json:  # before the work, not after it
            train.check_out_dir(os.path.dirname(args.json) or ".", "--json")
            if os.path.isdir(args.json):
                raise ValueError(f"--json {args.json}: is a folder; give a file name")
    except ValueError as e:
        p.error(str(e))
    if args.one:
        print(json.dumps(measure(args.task, *args.one, args)))
        return 0
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    print(f"training step on task {args.task}, device {args.device}{' (compiled)' if args.compile else ''}, "
          f"best of {args.reps} after {args.warmup} warm-up; shares of a step: data, oracle (amortised)")
    print(HEADER)
    rows = []
    for model in models:
        for size in sizes:
            cmd = [sys.executable, os.path.abspath(__file__), "--one", model, size]
            cmd += [f"--{k}={getattr(args, k)}" for k in ("task", "device", "dtype", "threads", "batch_size", "data_chunk",
                                                          "reps", "warmup", "peak_n")]
            cmd += ["--compile"] * args.compile
            run = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if run.returncode != 0:
                print(f"{model:<12} {size:<6} failed: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
                continue
            rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
            print(row(rows[-1]), flush=True)
    if rows:
        print(f"matmul peak (n={args.peak_n}): {min(r['matmul_peak'] for r in rows) / 1e9:.1f}"
              f"-{max(r['matmul_peak'] for r in rows) / 1e9:.1f} GFLOP/s across the runs")
    if not rows:
        p.exit(2, "bench.py: error: every row failed (see the reasons above)\n")
    if args.json:
        train.write_json(args.json, rows)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    train.cli(main, "bench.py", "nothing was written")
