"""
The hardware under the runs: what the machine is, how a step is timed on its device, and whether its GPU or Mac
paths work. bench.py's benchmarks and time_to_target.py stand on the first two; `bench.py matmul` and
`bench.py gpu` (bench.py's subcommands, dispatched from there) are the last two sections.

- the clock (time_and_peak): the best time of a step after warm-up, with the device's queued work waited for
  (CUDA and MPS run asynchronously), and the peak memory the step added: torch.cuda.max_memory_allocated on
  CUDA, the Metal driver's holding on MPS, the resident set's high-water mark on a CPU;
- the CPU (machine): its name, widest vector ISA, native bf16, and the fp32 matmul rate that carries a wall
  time to another CPU (scaled_time: time there ~= time here * rate here / rate there);
- `bench.py matmul` (bench_matmul): this CPU's fp32 and bf16 matmul rates and the rule of thumb;
- `bench.py gpu` (bench_gpu): a prepared check, pass or fail per cell, of the paths no CPU run confirms (bf16,
  torch.compile, the scan modes against the sequential loop, sync-free steps, NCCL, 16 GiB), in one process.
"""
from dataclasses import replace
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch

import batches
import checkpoints
from commandline import Parser, check_sizes
import evaluation
from mamba import SCAN_MODES, selective_scan
import optim
import presets
import runtime
import settings
import train


def parser(command, fn):
    """The flags parser of a bench.py subcommand (these two and bench.py's own); its description is the first
    paragraph of fn's docstring."""
    return Parser(prog=f"bench.py {command}", description=fn.__doc__.split("\n\n")[0].strip(),
                          allow_abbrev=False)


# -----------------------------------------------------------------------------
# the clock: a step's best time on its device, and the memory it added


def syncer(dev):
    """What waits for the device's queued work before a clock is read: CUDA and MPS run asynchronously."""
    return {"cuda": torch.cuda.synchronize, "mps": torch.mps.synchronize}.get(dev.type, lambda: None)


def max_rss():
    """The resident set's high-water mark in bytes: getrusage gives kilobytes on Linux, bytes on macOS."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def time_and_peak(step, dev, warmup, reps):
    """Best time of step() over reps runs after warmup runs, and the peak memory it added (MB):
    torch.cuda.max_memory_allocated on CUDA; on MPS the most the Metal driver held after a step (its
    cache keeps what a step freed); on CPU the high-water resident set (which only grows)."""
    sync = syncer(dev)
    held = torch.mps.driver_allocated_memory if dev.type == "mps" else max_rss
    if dev.type == "cuda":
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        base = top = held()
    times = []
    for i in range(warmup + reps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        top = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else max(top, held())
    return min(times), (top - base) / 2**20


def best_time(fn, dev, warmup, reps):
    return time_and_peak(fn, dev, warmup, reps)[0]

# -----------------------------------------------------------------------------
# the CPU: what a wall time was measured on, and the rate that carries it to another CPU


def machine(threads, n=1024, reps=3):
    """What a wall time was measured on: the CPU's name, its widest vector ISA (AMX > AVX-512 > AVX2 > torch's
    own reading of it, e.g. NEON on an Arm Mac), whether it multiplies bf16 natively, and the fp32 n x n
    matmul rate (GFLOP/s, best of reps) on `threads` threads, the rate that scales a time to another CPU
    (scaled_time)."""
    name, flags = runtime.cpu_flags()
    isa = ("AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags
           else torch.backends.cpu.get_cpu_capability())
    bf16 = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rate = matmul_peak(torch.device("cpu"), torch.float32, n, reps)
    finally:
        torch.set_num_threads(saved)
    return dict(cpu=name, isa=isa, bf16=" ".join(bf16) or "no native bf16", threads=threads,
                matmul_gflops=gflops(rate))


def gflops(rate):  # FLOP/s -> GFLOP/s to 3 digits: a slow or contended matmul is 0.0312, not 0.0 (a divisor)
    return float(f"{rate / 1e9:.3g}")


def describe(m):
    """One line for a machine(): 'AMD EPYC, AVX2, no native bf16: 41.3 GFLOP/s fp32 matmul on 2 threads'."""
    return f"{m['cpu']}, {m['isa']}, {m['bf16']}: {m['matmul_gflops']} GFLOP/s fp32 matmul on {m['threads']} threads"


def scaled_time(time_ref, rate_ref, rate_here):
    """Rule of thumb: a CPU run's wall time scales inversely with the fp32 matmul rate (machine()) where its
    steps are mostly large matmuls (the paper sizes: 59-78% of the peak, results/speed.md), so time here ~=
    time_ref * rate_ref / rate_here. It does not carry the quick models' small matmuls: two CPUs of the same
    peak ran the quick recall transformer 3.3x apart (results/speed.md); time those with `bench.py train`."""
    return time_ref * rate_ref / rate_here


def matmul_peak(dev, dtype, n, reps):
    """FLOP/s of the best dense n x n matmul: the reference for `of peak`."""
    a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))
    return 2 * n ** 3 / best_time(lambda: a @ b, dev, 2, reps)


# -----------------------------------------------------------------------------
# matmul: this CPU, and the rate that carries a wall time to another CPU

REF_GFLOPS = 188  # fp32 matmul on 2 threads of results/speed.md's CPU (176-200 GFLOP/s), where its times were taken


def bench_matmul(argv):
    """This CPU and its matmul rates: what carries a wall time measured on one CPU to another.

    Prints machine(): the CPU's name, its vector ISA (AMX, AVX-512, AVX2), whether it multiplies bf16
    natively, and the best fp32 n x n matmul rate on --threads threads; the bf16 rate beside it; and the
    rule of thumb (scaled_time): a CPU run that took t on a CPU of fp32 rate R_ref takes about t * R_ref /
    R_here here. --ref_gflops is R_ref (default: results/speed.md's CPU, where the committed times were
    taken). --json also writes the figures.
    """
    p = parser("matmul", bench_matmul)
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    p.add_argument("--n", type=int, default=2048, help="matrix size (default 2048)")
    p.add_argument("--reps", type=int, default=5, help="timed matmuls; the best is reported (default 5)")
    p.add_argument("--ref_gflops", type=float, default=REF_GFLOPS,
                   help=f"fp32 GFLOP/s of the CPU the times to scale come from (default {REF_GFLOPS})")
    p.add_argument("--json", default="", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    if min(args.threads, args.n, args.reps) < 1 or not args.ref_gflops > 0:
        p.error("--threads, --n and --reps must be >= 1 and --ref_gflops > 0")
    check_sizes(p, args.threads)
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else 0
    if free and 3 * 4 * args.n ** 2 > free:  # a, b and a @ b in fp32
        p.error(f"--n {args.n}: three {args.n} x {args.n} matrices need {12 * args.n ** 2 / 2**30:.1f} GiB, "
                f"{free / 2**30:.1f} GiB is free here; use a smaller --n")
    if args.json:
        try:
            checkpoints.check_out_file(args.json, "--json")  # before the work, not after it
        except ValueError as e:
            p.error(str(e))
    m = machine(args.threads, args.n, args.reps)
    torch.set_num_threads(args.threads)
    m["bf16_matmul_gflops"] = gflops(matmul_peak(torch.device("cpu"), torch.bfloat16, args.n, args.reps))
    factor = scaled_time(1.0, args.ref_gflops, m["matmul_gflops"])
    print(f"CPU: {describe(m)}")
    print(f"bf16 matmul: {m['bf16_matmul_gflops']} GFLOP/s ({m['bf16_matmul_gflops'] / m['matmul_gflops']:.2f}x fp32)")
    print(f"rule of thumb: a CPU run timed at {args.ref_gflops:g} GFLOP/s takes ~{factor:.2f}x as long here "
          f"(1m00s there: ~{runtime.fmt_time(60 * factor)} here)")
    if args.json:
        checkpoints.write_json(args.json, m | dict(ref_gflops=args.ref_gflops, time_factor=factor))
        print(f"wrote {args.json}")
    return 0

# -----------------------------------------------------------------------------
# gpu: a prepared check of the device paths, a few minutes on one CUDA GPU (or a Mac)

BIG_CELLS = [("recall", "cpu_paper_task", "mamba"), ("recall", "cpu_paper_task", "transformer"),
             ("hmm", "paper", "mamba")]  # the largest activations of the presets: the 16 GB case
SYNC_CELLS = [(t, "transformer") for t in ("bijection", "hmm", "regression", "recall")] + \
             [("hmm", m) for m in presets.MODELS if m != "transformer"]


class Skip(Exception):
    """A cell this device cannot check; the message says why."""


def gpu_config(task, model, preset, args, **given):
    """A cell's run (settings.run_of); under --dry_run the tiny preset's (reproduce.py's tiny cells)."""
    return settings.run_of(task, model, "tiny" if args.dry_run else preset, given | dict(device=args.device))


def train_cell(args, dev, task_name, model_name, preset, compile=False, evaluate=False):
    """--steps training steps of train.py's recipe on one batch (bf16 autocast on CUDA, --compile's wrapper, which
    must not fall back to eager), timed; with evaluate, one held-out evaluation of 250 sequences after them. The
    loss and the metrics must be finite. Peak MB: what the steps and the evaluation added to the model."""
    torch.manual_seed(0)
    run = gpu_config(task_name, model_name, preset, args)
    (model, opt), task = train.build(run, dev), run.tasks["default"]
    use_bf16, ctx = runtime.autocast("auto", dev)
    fell_back = []
    fwd = runtime.CompiledOrEager(model, compile, fell_back.append)
    gen, _ = batches.data_source(run.train, dev, task)
    B = run.train["batch_size"]
    batch = task.sample(B, gen).to(dev, latent=False)
    losses = []

    def step():
        losses.append(optim.update(fwd, model, task, opt, batch, ctx, run.train["grad_clip"])[1].detach())

    t, peak = time_and_peak(step, dev, 1, args.steps)  # the warm-up step compiles
    if evaluate:
        n = run.train["eval_samples_during"] if args.dry_run else 250
        r = {}
        check = lambda: r.update(evaluation.evaluate(fwd, task, n, 0, dev, ctx, B))
        peak = max(peak, time_and_peak(check, dev, 0, 1)[1])
        if not all(math.isfinite(v) for v in r.values() if isinstance(v, float)):
            raise ValueError("the evaluation's metrics are not finite")
    if fell_back:
        raise ValueError(fell_back[0])
    if not torch.stack(losses).isfinite().all():
        raise ValueError("a loss is not finite")
    return dict(peak_mb=peak, tokens_per_s=B * task.seq_len / t,
                note=f"{model.num_params():,} params, B {B} x T {task.seq_len}, {'bf16' if use_bf16 else 'float32'}")


def lengths_cell(args, dev):
    """hmm's quick Mamba under train.py's --compile wrapper, trained at 5 sequence lengths in turn (as a curriculum,
    or the evaluation lengths, feed it), dynamo's recompile limit at 2: a graph per length would fail at the third
    and run eager."""
    torch.manual_seed(0)
    run = gpu_config("hmm", "mamba", "quick", args)
    (model, opt), task = train.build(run, dev), run.tasks["default"]
    _, ctx = runtime.autocast("auto", dev)
    gen, _ = batches.data_source(run.train, dev, task)
    fell_back = []
    fwd = runtime.CompiledOrEager(model, True, fell_back.append)
    from torch._dynamo.utils import counters  # here, not above: importing dynamo takes a second of every start
    counters.clear()
    Ks = range(task.K, task.K + 5)
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        for t in (replace(task, K=K) for K in Ks):
            batch = t.sample(8, gen).to(dev, latent=False)
            fwd.retry(lambda: optim.step(fwd, t, opt, batch, ctx))
    if fell_back:
        raise ValueError(fell_back[0])
    graphs = counters["stats"]["unique_graphs"]
    return dict(note=f"K = {Ks[0]}..{Ks[-1]}: {graphs} graphs compiled", graphs=graphs)


SCAN_NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")


def scan_inputs(b, d, n, l, dtype=torch.float64, seed=0, delta_scale=1.0, device="cpu"):
    """Random inputs of selective_scan with the model's signs: softplus(delta + delta_bias) > 0 and A < 0."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    x = dict(u=r(b, d, l), delta=delta_scale * r(b, d, l) - 1, A=-torch.exp(r(d, n)), B=r(b, n, l), C=r(b, n, l),
             D=r(d), z=r(b, d, l), delta_bias=r(d))
    return {k: v.to(dtype).to(device) for k, v in x.items()}  # MPS has no float64 to convert from


def run_scan(x, mode, seed=1, chunk=None):
    """y, last state and the gradients of every input under a random cotangent: what two modes must agree on."""
    x = {k: v.detach().clone().requires_grad_() for k, v in x.items()}
    y, last = selective_scan(**x, delta_softplus=True, return_last_state=True, mode=mode, chunk=chunk)
    g = torch.Generator().manual_seed(seed)
    gy, gl = (torch.randn(t.shape, generator=g).to(t.device, t.dtype) for t in (y, last))
    grads = torch.autograd.grad((y * gy).sum() + (last * gl).sum(), [x[k] for k in SCAN_NAMES])
    return dict(y=y, last=last, **{f"grad_{k}": v for k, v in zip(SCAN_NAMES, grads)})


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def scan_cell(dev, mode):
    """mamba.selective_scan in `mode` against the sequential loop on the device (the sequential loop against the
    CPU's): outputs, last state and every input's gradient, in float64 (float32 on MPS, which has no float64)."""
    dtype, tol = (torch.float32, 1e-5) if dev.type == "mps" else (torch.float64, 1e-12)
    x = scan_inputs(4, 16, 8, 130, dtype, device=dev)  # 130: no multiple of any chunk, so the last block is short
    got = run_scan(x, mode)
    want = run_scan({k: v.cpu() for k, v in x.items()}, mode) if mode == "sequential" else run_scan(x, "sequential")
    worst = max(rel_err(got[k].cpu(), want[k].cpu()) for k in want)
    if not worst <= tol:
        raise ValueError(f"relative error {worst:.1e} > {tol:.0e}")
    return dict(note=f"largest relative error {worst:.1e} ({str(dtype)[6:]}), against "
                     f"{'the CPU' if mode == 'sequential' else 'sequential'}")


def sync_free_step(run, dev):
    """A training step with CUDA's sync detector on: any read of a device value by the host raises. The first step
    sets up CUDA and the optimizer state, which may sync. On another device the steps run unchecked (Skip)."""
    (model, opt), task = train.build(run, dev), run.tasks["default"]
    gen, _ = batches.data_source(run.train, dev)
    _, ctx = runtime.autocast("auto", dev)

    fwd = runtime.CompiledOrEager(model, False)
    step = lambda b: optim.update(fwd, model, task, opt, b, ctx, run.train["grad_clip"])  # the training loop's step

    step(task.sample(8, gen))
    if dev.type != "cuda":
        step(task.sample(8, gen))
        raise Skip(f"CUDA's sync detector only; the steps ran on {dev.type}")
    torch.cuda.synchronize(dev)
    torch.cuda.set_sync_debug_mode("error")  # from here on a sync raises
    try:
        step(task.sample(8, gen))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {}


def nccl_cell(args, dev):
    """train.py under torchrun on 2 GPUs (NCCL): 20 steps of the task's quick preset, an evaluation, results.json."""
    n = torch.cuda.device_count() if dev.type == "cuda" else 0
    if n < 2:
        raise Skip(f"needs 2 CUDA GPUs, this machine has {n}")
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py"), "--task", args.task,
               "--device", "cuda", "--max_iters", "20", "--log_interval", "10", "--eval_interval", "20",
               "--eval_samples", "250", "--eval_samples_during", "250", "--out_dir", out]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if run.returncode != 0 or not os.path.exists(os.path.join(out, "results.json")):
            raise ValueError(f"exit {run.returncode}: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
    return dict(note="torchrun --nproc_per_node=2 train.py: 20 steps, results.json written")


def capped_cell(args, dev, task, preset, model):
    """train_cell with an evaluation, the process held to 16 GiB of the GPU (torch.cuda's memory fraction), as on
    a 16 GB card; on MPS and the CPU uncapped, the peak then checked against 16 GiB."""
    cap = 16 * 2**30
    index = (torch.cuda.current_device() if dev.index is None else dev.index) if dev.type == "cuda" else None
    if index is not None:  # the memory fraction takes a device index: "cuda" alone names none
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), index)
    try:
        row = train_cell(args, dev, task, model, preset, evaluate=True)
    finally:
        if index is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, index)
    if row["peak_mb"] > cap / 2**20:
        raise ValueError(f"peak {row['peak_mb']:.0f} MB > 16 GiB")
    return row | dict(note=row["note"] + (", capped at 16 GiB" if dev.type == "cuda" else ", uncapped"))


# each check: (args, device) -> [(cell name, work)], work() -> the row's measures, or raises Skip or an error
GPU_CHECKS = {
    "train": lambda a, d: [(m, lambda m=m: train_cell(a, d, a.task, m, "paper")) for m in a.models],
    "compile": lambda a, d: [(m, lambda m=m: train_cell(a, d, a.task, m, "paper", compile=True)) for m in a.models]
    + [("mamba, 5 lengths", lambda: lengths_cell(a, d))],
    "scan": lambda a, d: [(mode, lambda mode=mode: scan_cell(d, mode)) for mode in SCAN_MODES],
    "sync": lambda a, d: [(f"{t} {m}", lambda t=t, m=m: sync_free_step(gpu_config(t, m, "quick", a), d))
                          for t, m in SYNC_CELLS],
    "nccl": lambda a, d: [("2 processes", lambda: nccl_cell(a, d))],
    "memory16": lambda a, d: [(f"{t} {p} {m}", lambda t=t, p=p, m=m: capped_cell(a, d, t, p, m))
                              for t, p, m in BIG_CELLS],
}
NOT_ON_MPS = {"compile": "torch.compile's MPS backend is a prototype: not checked"}


def gpu_cell(check, cell, work, dev):
    """One row of the table: work()'s measures and pass, or skip and why, or fail and the first line of why."""
    t0, m, status = time.perf_counter(), {}, "pass"
    try:
        if dev.type == "mps" and check in NOT_ON_MPS:
            raise Skip(NOT_ON_MPS[check])
        m = work()
    except Skip as e:
        status, m = "skip", dict(note=str(e))
    except Exception as e:
        status, m = "fail", dict(note=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")
    return dict(check=check, cell=cell, status=status, peak_mb=m.get("peak_mb"), tokens_per_s=m.get("tokens_per_s"),
                seconds=time.perf_counter() - t0, note=m.get("note", ""))


def bench_gpu(argv):
    """A prepared check of the paths no CPU run confirms, on one CUDA GPU in a few minutes (a Mac: what MPS has).

    Checks, each a list of cells: train, every model at the paper preset's size for --steps steps on --task under
    bf16 autocast (float32 where the GPU has no native bf16, and on MPS); compile, the same under train.py's
    --compile; scan, mamba.py's scan modes against the sequential loop on the device in float64; sync, a training
    step of every task and model with CUDA's sync detector on; nccl, train.py under torchrun on 2 GPUs (NCCL),
    skipped on one; memory16, the largest cells (BIG_CELLS) with an evaluation, the process capped at 16 GiB.
    Prints a table (status, peak MB, tokens/s, seconds, a note per cell) and writes it to --json; exit code 1 if
    any cell failed. Without a GPU or Mac it says so (exit 2); `--device cpu --dry_run` runs the same plan on the
    CPU at the tiny preset's sizes for 2 steps, so that the code path is tested without a GPU.
    """
    p = parser("gpu", bench_gpu)
    p.add_argument("--device", default="auto", help="auto | cuda | cuda:N | mps | cpu (with --dry_run) (default auto)")
    p.add_argument("--dry_run", action="store_true", help="tiny sizes and 2 steps: the plan's code path, e.g. on a CPU")
    p.add_argument("--checks", default=",".join(GPU_CHECKS), help=f"comma-separated (default {','.join(GPU_CHECKS)})")
    p.add_argument("--models", default=",".join(presets.MODELS), help="comma-separated, for train and compile "
                   f"(default {','.join(presets.MODELS)})")
    p.add_argument("--task", default="hmm", choices=list(presets.TINY_TASK),
                   help="the task of train, compile and nccl (default hmm)")
    p.add_argument("--steps", type=int, default=0, help="timed training steps per cell (default 5; 2 with --dry_run)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    p.add_argument("--json", default="out/bench_gpu.json", help="the table as JSON (default out/bench_gpu.json)")
    args = p.parse_args(argv)
    args.checks, args.models = args.checks.split(","), args.models.split(",")
    for kind, given, valid in (("check", args.checks, GPU_CHECKS), ("model", args.models, presets.MODELS)):
        bad = [x for x in given if x not in valid]
        if bad:
            p.error(f"unknown {kind} {bad[0]!r}; valid {kind}s: {', '.join(valid)}")
    if args.steps < 0 or args.threads < 1:
        p.error("--steps must be >= 0 and --threads >= 1")
    check_sizes(p, args.threads)
    args.steps = args.steps or (2 if args.dry_run else 5)
    try:
        settings.check_device(args.device)
        dev = runtime.pick_device(args.device)
        checkpoints.check_out_file(args.json, "--json")
    except ValueError as e:
        p.error(str(e))
    if dev.type == "cpu" and not args.dry_run:
        p.exit(2, f"{p.prog}: error: no CUDA GPU or Apple MPS here; `--device cpu --dry_run` runs the plan on the "
                  f"CPU at tiny sizes\n")
    torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
    print(f"device check on {dev} ({name}), torch {torch.__version__}{', dry run' if args.dry_run else ''}", flush=True)
    print(f"{'check':<9} {'cell':<34} {'status':<6} {'peak MB':>8} {'tok/s':>9} {'s':>6}  note")
    rows = []
    for check in args.checks:
        for cell, work in GPU_CHECKS[check](args, dev):
            rows.append(gpu_cell(check, cell, work, dev))
            r, num = rows[-1], lambda v, f: "-" if v is None else f"{v:{f}}"
            print(f"{check:<9} {cell:<34} {r['status']:<6} {num(r['peak_mb'], '8.0f'):>8} "
                  f"{num(r['tokens_per_s'], '9.0f'):>9} {r['seconds']:6.1f}  {r['note']}", flush=True)
    failed = [r for r in rows if r["status"] == "fail"]
    checkpoints.write_json(args.json, dict(device=str(dev), name=name, torch=torch.__version__, dry_run=args.dry_run,
                                       passed=not failed, rows=rows))
    print(f"{len(rows) - len(failed)} of {len(rows)} cells passed or skipped, {len(failed)} failed; wrote {args.json}")
    return 1 if failed else 0
