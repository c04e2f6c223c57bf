"""
Speed and memory, one subcommand each (`python bench.py SUBCOMMAND --help`: its flags).

    python bench.py matmul                  # this CPU (ISA, bf16) and its fp32 matmul rate: what scales a wall time
    python bench.py train                   # training throughput of every model at the quick size, task hmm
    python bench.py train --task bijection --models transformer --sizes paper --json out/bench.json
    python bench.py train --device cuda --compile     # on a GPU, with torch.compile
    python bench.py scan                    # mamba.py's selective scan modes: time, peak memory, kernels
    python bench.py scan --L 256 1024 --device cuda
    python bench.py memory                  # linear_attn.memory, chunked against recurrent, for each rule
    python bench.py memory --rules oja --chunk_size 8 16 32 64    # choose a chunk length
    python bench.py gpu                     # the first run on a GPU or Mac: every device path, pass or fail, minutes
    python bench.py gpu --device cpu --dry_run    # the same plan at tiny sizes on a CPU: its code path, for tests

Every subcommand prints the CPU beside its times (machine(): name, AVX2 / AVX-512 / AMX, native bf16, fp32
matmul GFLOP/s on the threads used). Rule of thumb for another CPU (scaled_time), for models large enough to
run near that rate: time here ~= time there * rate there / rate here; small models are timed with `train`.
Time to the paper's level, which trains: `python reproduce.py time_to_target`. train, scan and memory measure
each row in a fresh process (`bench.py SUBCOMMAND --one ...`), so its peak memory is its own:
torch.cuda.max_memory_allocated on CUDA; on CPU, the growth of the resident set's high-water mark. Times are the
best of --reps runs after --warmup untimed ones. One section a subcommand below; its function's docstring says
what it measures. The clock, the CPU, `matmul` and `gpu` are hardware.py's: `gpu` checks rather than measures,
in one process: each cell passes, fails or is skipped, and the run fails if one cell does (its table, with peak
memory and tokens/s, goes to --json).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

if __name__ == "__main__":
    from commandline import before_torch
    before_torch("bench.py")

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

import batches
import checkpoints
from hardware import bench_gpu, bench_matmul, best_time, describe, machine, matmul_peak, parser, syncer, time_and_peak
from linear_attn import DEFAULT_CHUNK, RULES, memory
import mamba
from mamba import SCAN_MODES, selective_scan
from commandline import Parser, check_sizes, cli, fault
from oracles import Metrics
from tasks import TASKS
import presets
import runtime
import settings
import train

# -----------------------------------------------------------------------------
# shared: one measurement in a fresh process, and the kernel benchmarks' flags


def in_fresh_process(command, one, args, flags, extra=()):
    """`bench.py command --one *one` with args' values of flags, on args.threads threads: (its row, None),
    or (None, the last line of its error)."""
    cmd = [sys.executable, os.path.abspath(__file__), command, "--one", *one]
    cmd += [f"--{k}={getattr(args, k)}" for k in flags] + list(extra)
    run = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    if run.returncode != 0:
        return None, (run.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(run.stdout.strip().splitlines()[-1]), None


def parse_kernel_args(p, argv, sizes=()):
    """scan's and memory's arguments: p's flags (`sizes`: those that must be >= 1), and where and how often to
    time one forward + backward."""
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions; the best is reported (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed repetitions first (default 1)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.reps < 1 or args.warmup < 0:  # every command times best-of --reps
        p.error(f"--reps must be >= 1 and --warmup >= 0, got --reps {args.reps} --warmup {args.warmup}")
    check_sizes(p, args.threads, [args.seed], **{k: getattr(args, k) for k in sizes})
    if not args.one and args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("CUDA is not available here")
    args.setting = (f"{args.device}{f', {args.threads} threads' if args.device == 'cpu' else ''}, "
                    f"best of {args.reps} after {args.warmup} warm-up")  # the end of the header line
    return args


# -----------------------------------------------------------------------------
# train: training throughput of every model at its quick and paper sizes


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
# ops the flop counter does not count (CPU attention, mkldnn and cuDNN LSTMs) or miscounts (grouped conv backward)
EXTRA_FLOPS = {
    aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, **kw: sdpa_flop_count(q, k, v),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda g, q, k, v, *a, **kw: sdpa_backward_flop_count(g, q, k, v),
    aten.mkldnn_rnn_layer: lambda x, w0, w1, *a, **kw: rnn_flops(x, w0, w1),
    aten.mkldnn_rnn_layer_backward: lambda x, w0, w1, *a, **kw: 2 * rnn_flops(x, w0, w1),
    aten._cudnn_rnn: lambda x, w, *a, **kw: cudnn_rnn_flops(x, w),
    aten._cudnn_rnn_backward: lambda x, w, *a, **kw: 2 * cudnn_rnn_flops(x, w),
    aten.convolution_backward: lambda g, x, w, *a, **kw: 2 * conv_flops(g, w),
}


def scan_share(step, dev, reps):
    """(forward, backward) seconds per step spent inside the selective scans (mamba.SelectiveScan), timed
    by wrapping its two methods over `reps` steps; the rest of a Mamba step is projections, the conv,
    norms, the head and the optimizer."""
    spent, fn, sync = {"forward": 0.0, "backward": 0.0}, mamba.SelectiveScan, syncer(dev)

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


def measure_train(task_name, model_name, size, args):
    """One (model, size) in this process: the numbers of one row."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    given = ({"device": args.device, "data_chunk": args.data_chunk}
             | ({"batch_size": args.batch_size} if args.batch_size else {}))
    run = settings.run_of(task_name, model_name, size, given)
    dev = runtime.pick_device(args.device)
    (model, opt), task = train.build(run, dev), run.tasks["default"]
    B, T = run.train["batch_size"], task.seq_len
    use_bf16, ctx = runtime.autocast(args.dtype, dev)  # as train.py --dtype
    fwd = torch.compile(model) if args.compile else model
    g, chunk = batches.data_source(run.train, dev)
    batch = task.sample(B, g).to(dev, latent=False)  # as train.py: the oracle's float64 latents stay

    def step():
        with ctx:
            loss = task.loss(fwd(batch.x), batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), run.train["grad_clip"])
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
    total = t_data + t_step + t_oracle / run.train["log_interval"]
    return dict(task=task_name, model=model_name, size=size, params=model.num_params(), batch=B, seq_len=T,
                step_s=t_step, tokens_per_s=B * T / t_step, gflop_per_step=flops / 1e9, flops_per_s=flops / t_step,
                matmul_peak=peak, of_peak=flops / t_step / peak, peak_mb=peak_mb, data_s=t_data, oracle_s=t_oracle,
                data_share=t_data / total, oracle_share=t_oracle / run.train["log_interval"] / total,
                device=str(dev) + (" bf16" if use_bf16 else ""), threads=args.threads if dev.type == "cpu" else None,
                data_device=str(g.device), data_chunk=chunk, scan_fwd_s=scan_fwd, scan_bwd_s=scan_bwd)


HEADER = (f"{'model':<12} {'size':<6} {'params':>9} {'B x T':>9} {'step ms':>8} {'tok/s':>8} {'GFLOP/s':>8} "
          f"{'of peak':>7} {'peak MB':>8} {'data':>6} {'oracle':>6} {'scan fwd/bwd ms':>15}")


def row(m):
    return (f"{m['model']:<12} {m['size']:<6} {m['params']:>9,} {m['batch']:>4} x {m['seq_len']:<3} "
            f"{1e3 * m['step_s']:8.1f} {m['tokens_per_s']:8.0f} {m['flops_per_s'] / 1e9:8.1f} {m['of_peak']:7.0%} "
            f"{m['peak_mb']:8.0f} {m['data_share']:6.1%} {m['oracle_share']:6.1%}"
            + (f" {1e3 * m['scan_fwd_s']:7.1f}/{1e3 * m['scan_bwd_s']:<7.1f}" if m.get("scan_fwd_s") else ""))


def train_args(argv):
    """bench_train's flags, checked before any work: (args, the models, the sizes, the parser)."""
    p = parser("train", bench_train)
    p.add_argument("--task", default="hmm", choices=list(TASKS),
                   help="the task whose sizes and batches to use (default hmm)")
    p.add_argument("--models", default=",".join(presets.MODELS),
                   help=f"comma-separated (default {','.join(presets.MODELS)})")
    p.add_argument("--sizes", default="quick", help="comma-separated presets (default quick; quick,paper adds the "
                   "paper's sizes: seconds a step on a CPU)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps (default auto)")
    p.add_argument("--dtype", default="auto", choices=list(presets.CHOICES["dtype"]),
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
    args = p.parse_args(argv)
    models, sizes = args.models.split(","), args.sizes.split(",")
    for kind, given, valid in (("model", models, presets.MODELS), ("size", sizes, list(presets.PRESETS))):
        bad = [x for x in given if x not in valid]
        if bad:
            p.error(f"unknown {kind} {bad[0]!r}; valid {kind}s: {', '.join(valid)}")
    if min(args.threads, args.reps, args.peak_n) < 1 or min(args.warmup, args.batch_size, args.data_chunk) < 0:
        p.error("--threads, --reps and --peak_n must be >= 1, --warmup, --batch_size and --data_chunk >= 0")
    check_sizes(p, args.threads)
    try:
        settings.check_device(args.device)
        runtime.pick_device(args.device)
        if args.json:  # before the work, not after it
            checkpoints.check_out_file(args.json, "--json")
    except ValueError as e:
        p.error(str(e))
    return args, models, sizes, p


def bench_train(argv):
    """Training throughput of every model at its quick size (--sizes quick,paper: the paper's too): what one step
    costs and where its time goes, on this device.

    Columns:
    - step: forward + backward + gradient clipping + AdamW on one batch already on the device, the
      train.py recipe and batch size (bf16 autocast and fused AdamW on CUDA). tokens/s = batch_size *
      seq_len / step.
    - FLOP/s: the FLOPs of one forward + backward (torch.utils.flop_counter: every matmul; attention as
      the full T x T product, the usual convention; the LSTM's gate matmuls and the depthwise
      convolution, which the counter misses or miscounts, by formula) over the step time. `of peak`
      divides by the dense matmul FLOP/s measured in the same process (the best of square n x n
      matmuls in the training dtype), so the ratio means the same on any machine.
    - peak MB: over the measured steps (model, gradients, optimizer state, activations).
    - data: drawing one training batch as train.py does (task.sample, which includes the HMM's soft
      targets from the forward filter; on the GPU when training on CUDA, --data_chunk batches per call,
      timed per batch) and moving it to the device. oracle: the exact posterior and the metrics for
      one batch; train.py computes them at log steps only, so the share is amortised over
      --log_interval steps. Both shares are of (data + step + amortised oracle).
    - scan fwd/bwd (Mamba): the milliseconds of a step spent in the selective scan's forward and backward
      (mamba.SelectiveScan, every layer), averaged over --reps steps; the rest of the step is the
      projections, the convolution, norms, head and optimizer.
    """
    args, models, sizes, p = train_args(argv)
    if args.one:
        print(json.dumps(measure_train(args.task, *args.one, args)))
        return 0
    print(f"training step on task {args.task}, device {args.device}{' (compiled)' if args.compile else ''}, "
          f"best of {args.reps} after {args.warmup} warm-up; shares of a step: data, oracle (amortised)")
    n = len(models) * len(sizes)
    print(f"to run: {n} row{'s' * (n > 1)}, {', '.join(models)} at the {' and '.join(sizes)} "
          f"size{'s' * (len(sizes) > 1)}, "
          f"{args.warmup + args.reps} steps each in a process of its own", flush=True)
    cpu = machine(args.threads)
    print(f"CPU: {describe(cpu)}", flush=True)
    print(HEADER)
    rows = []
    for model in models:
        for size in sizes:
            m, failed = in_fresh_process("train", (model, size), args,
                                         ("task", "device", "dtype", "threads", "batch_size",
                                          "data_chunk", "reps", "warmup", "peak_n"),
                                         ["--compile"] * args.compile)
            if failed:
                print(f"{model:<12} {size:<6} failed: {failed}")
                continue
            rows.append(m | dict(machine=cpu))
            print(row(m), flush=True)
    if rows:
        print(f"matmul peak (n={args.peak_n}): {min(r['matmul_peak'] for r in rows) / 1e9:.1f}"
              f"-{max(r['matmul_peak'] for r in rows) / 1e9:.1f} GFLOP/s across the runs")
    if not rows:
        p.exit(2, f"{p.prog}: error: every row failed (see the reasons above)\n")
    if args.json:
        checkpoints.write_json(args.json, rows)
        print(f"wrote {args.json}")
    return 0

# -----------------------------------------------------------------------------
# scan: the selective scan modes of mamba.py


class CountKernels(TorchDispatchMode):

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += not func.is_view
        return func(*args, **(kwargs or {}))


def measure_scan(mode, L, args):
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

    small = {k: (v[..., :8] if k in ("u", "delta", "B", "C", "z") else v).detach().requires_grad_()
             for k, v in inputs.items()}
    y = selective_scan(**small, delta_softplus=True, mode=mode)
    # lazy initialisation (cuBLAS's workspace, which the backward's matmuls create) stays out of the baseline
    y.backward(torch.ones_like(y))
    t, peak_mb = time_and_peak(step, dev, args.warmup, args.reps)
    with CountKernels() as counter:
        step()
    return dict(time=t, peak_mb=peak_mb, kernels=counter.n)


def bench_scan(argv):
    """The selective scan modes of mamba.py: forward + backward time, peak memory and kernel count,
    each also as a ratio to the sequential loop.

    Peak memory is what the scan added to the inputs. `kernels` counts the non-view ATen ops dispatched
    in one forward + backward. On a GPU, a scan made of many small ops is bound by launch latency (a few
    microseconds each), so this count is what the chunked mode saves there. The inputs are realistic:
    A = -(1..N) (the official init), delta = softplus(. - 2) > 0.
    """
    p = parser("scan", bench_scan)
    p.add_argument("--B", type=int, default=16, help="batch size (default 16)")
    p.add_argument("--D", type=int, default=384, help="channels d_inner (default 384)")
    p.add_argument("--N", type=int, default=16, help="state size (default 16)")
    p.add_argument("--L", type=int, nargs="+", default=[64, 256, 1024], help="sequence lengths (default 64 256 1024)")
    p.add_argument("--modes", nargs="+", default=list(SCAN_MODES), choices=SCAN_MODES, help="scan modes to compare")
    p.add_argument("--one", nargs=2, metavar=("MODE", "L"), help=argparse.SUPPRESS)  # internal: one measurement
    args = parse_kernel_args(p, argv, ("B", "D", "N", "L"))
    if args.one:
        print(json.dumps(measure_scan(args.one[0], int(args.one[1]), args)))
        return 0
    print(f"selective scan, forward + backward: B={args.B} D={args.D} N={args.N}, {args.setting}")
    print(f"CPU: {describe(machine(args.threads))}", flush=True)
    print(f"{'L':>6}  {'mode':<11} {'time s':>8} {'x seq':>6} {'peak MB':>9} {'x seq':>6} {'kernels':>8} {'x seq':>6}")
    n_ok = 0
    for L in args.L:
        rows = {}
        for mode in args.modes:
            m, failed = in_fresh_process("scan", (mode, str(L)), args,
                                         ("B", "D", "N", "device", "threads", "reps", "warmup", "seed"))
            if failed:
                print(f"{L:>6}  {mode:<11} failed: {failed}")
                continue
            rows[mode] = m
            n_ok += 1
            ref = rows.get("sequential")
            ratio = lambda k: f"{m[k] / ref[k]:6.2f}" if ref and ref[k] > 0 else f"{'-':>6}"
            print(f"{L:>6}  {mode:<11} {m['time']:8.3f} {ratio('time')} {m['peak_mb']:9.0f} {ratio('peak_mb')} "
                  f"{m['kernels']:8d} {ratio('kernels')}", flush=True)
    if not n_ok:
        p.exit(2, f"{p.prog}: error: every measurement failed (see the reasons above)\n")
    return 0

# -----------------------------------------------------------------------------
# memory: the two forms of linear_attn.memory


def measure_memory(rule, mode, chunk, T, args):
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

    # lazy initialisation stays out of the baseline
    step({k: v[:, :, :8].detach().requires_grad_() for k, v in inputs.items()})
    t, peak_mb = time_and_peak(lambda: step(inputs), dev, args.warmup, args.reps)
    return dict(time=t, peak_mb=peak_mb)


def bench_memory(argv):
    """The two forms of linear_attn.memory: forward + backward time and peak memory of the chunked
    form against the recurrent loop, for each rule.

    Peak memory is what the memory added to the inputs. The inputs are what the model feeds the memory:
    L2-normalised keys and values, beta = sigmoid(noise), gradients for q, k, v and beta.
    """
    p = parser("memory", bench_memory)
    p.add_argument("--B", type=int, default=4, help="batch size (default 4)")
    p.add_argument("--H", type=int, default=4, help="heads (default 4)")
    p.add_argument("--d_k", type=int, default=32, help="key dimension (default 32)")
    p.add_argument("--d_v", type=int, default=32, help="value dimension (default 32)")
    p.add_argument("--T", type=int, nargs="+", default=[256, 1024, 4096],
                   help="sequence lengths (default 256 1024 4096)")
    p.add_argument("--rules", nargs="+", default=list(RULES), choices=RULES, help="rules to compare (default all)")
    p.add_argument("--chunk_size", type=int, nargs="+", default=[0],
                   help="chunk lengths to try; 0 = per rule (default 0)")
    p.add_argument("--decay", type=float, default=1.0, help="hebbian decay (default 1)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"), help="default float32")
    p.add_argument("--one", nargs=4, metavar=("RULE", "MODE", "CHUNK", "T"), help=argparse.SUPPRESS)  # internal
    args = parse_kernel_args(p, argv, ("B", "H", "d_k", "d_v", "T"))
    if min(args.chunk_size) < 0:
        p.error(f"--chunk_size must be >= 0 (0: the rule's own), got {' '.join(map(str, args.chunk_size))}")
    if not 0 < args.decay <= 1:  # nan fails this too
        p.error(f"--decay must be in (0, 1] (1: no decay), got {args.decay}")
    if args.one:
        rule, mode, chunk, T = args.one
        print(json.dumps(measure_memory(rule, mode, int(chunk) or None, int(T), args)))
        return 0
    print(f"linear_attn.memory, forward + backward: B={args.B} H={args.H} d_k={args.d_k} d_v={args.d_v} {args.dtype}, "
          f"{args.setting}")
    print(f"CPU: {describe(machine(args.threads))}", flush=True)
    print(f"{'rule':<8} {'T':>5}  {'mode':<9} {'chunk':>5} {'time s':>8} {'x rec':>6} {'peak MB':>8}")
    n_ok = 0
    for rule in args.rules:
        for T in args.T:
            ref = None
            for mode, chunk in [("recurrent", 0)] + [("chunked", c) for c in args.chunk_size]:
                m, failed = in_fresh_process("memory", (rule, mode, str(chunk), str(T)), args,
                                             ("B", "H", "d_k", "d_v", "decay", "device", "dtype", "threads", "reps",
                                              "warmup", "seed"))
                shown = "-" if mode == "recurrent" else chunk or DEFAULT_CHUNK[rule]
                if failed:
                    print(f"{rule:<8} {T:>5}  {mode:<9} {shown:>5} failed: {failed}")
                    continue
                n_ok += 1
                ref = m if mode == "recurrent" else ref
                ratio = f"{m['time'] / ref['time']:6.2f}" if ref else f"{'-':>6}"
                print(f"{rule:<8} {T:>5}  {mode:<9} {shown:>5} {m['time']:8.3f} {ratio} {m['peak_mb']:8.0f}",
                      flush=True)
    if not n_ok:
        p.exit(2, f"{p.prog}: error: every measurement failed (see the reasons above)\n")
    return 0

# -----------------------------------------------------------------------------

COMMANDS = {"matmul": bench_matmul, "train": bench_train, "scan": bench_scan, "memory": bench_memory,
            "gpu": bench_gpu}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(prog="bench.py", description=__doc__.split("\n\n")[0].strip(), allow_abbrev=False)
    p.add_argument("subcommand", choices=list(COMMANDS), help="matmul: this CPU and its matmul rates | train: "
                   "training throughput of every model | scan: mamba.py's scan modes | memory: linear_attn.memory's "
                   "two forms | gpu: a prepared check of a GPU or Mac")
    if argv[:1] == ["time_to_target"]:
        p.error("time_to_target is now `python reproduce.py time_to_target`, with the same flags")
    p.parse_args(argv[:1])  # --help, or a missing or unknown subcommand: the subcommand's own flags follow it
    try:
        return COMMANDS[argv[0]](argv[1:])
    except OSError as e:  # --json on a full or read-only disk, after the measurements
        print(f"bench.py: error: {fault(e)}; the table above is the run's (nothing else was kept)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    cli(main, "bench.py", "nothing was written")
