"""
The plumbing the scripts share, so that train.py holds only training: devices and autocast, data-parallel
set-up and teardown under torchrun, torch.compile with an eager fallback, a run's process and the one-line
reports of its faults. A run's files (checkpoints, files written whole, the folder's rules and lock) are
checkpoints.py's.

- devices: CUDA, then Apple MPS, then the CPU; bf16 autocast where the GPU has it natively (pick_device,
  autocast); under torchrun one GPU per process, NCCL on GPUs and gloo on CPUs (init_distributed), and rank 0
  speaks for the run (rank0s, and checkpoints.print0);
- torch.compile is a speed-up, never a requirement: the first failure, however late, means eager from then
  on, said in one line (CompiledOrEager);
- a new run refuses a folder that holds another, and rank 0 takes its lock for every rank (prepare_out_dir);
- a run's Ctrl-C, out of memory or full disk is one line saying what was kept, exit code 2 (guarded; the line is
  commandline.fault's); Proc is one process's share of a run: device, rank, the step reached and the checkpoints
  it keeps (checkpoints.Checkpoints);
- a request the machine's memory cannot hold is refused before it allocates, naming its flag (check_memory);
  one that only takes long says how long, once, when it will take more than a minute (say_eta).
"""
from contextlib import contextmanager, nullcontext
from datetime import timedelta
import importlib
import inspect
import os
import platform
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoints import (Checkpoints, check_out_dir, lock_out_dir, print0, run_files, run_tmp_files, set_aside,
                         settle_aside, unlock_out_dir)
from commandline import fault, is_oom

VERDICTS = ("go on", "reached", "diverged", "failed")  # rank 0's word: --stop_at reached, not finite, it failed
RENDEZVOUS_S = 300  # how long the processes of a torchrun run wait for each other to start

# -----------------------------------------------------------------------------
# devices: CPU, CUDA (bf16 autocast, torch.compile), MPS, torchrun


def env_int(name, default):
    """The environment variable `name` (torchrun's WORLD_SIZE, LOCAL_RANK, ...) as an integer >= 0."""
    value = os.environ.get(name, "").strip() or str(default)
    if not value.isdigit():
        raise ValueError(f"environment variable {name}={os.environ[name]!r} must be an integer >= 0 "
                         f"(torchrun sets it; unset it to run alone)")
    return int(value)


def pick_device(name, local_rank=None):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if (name.startswith("cuda") and not torch.cuda.is_available()
            or name == "mps" and not torch.backends.mps.is_available()):
        raise ValueError(f"device {name!r} is not available here; use auto or cpu")
    if name == "cuda" and local_rank is not None:
        # one GPU per data-parallel process: every process checks, so none waits for a rank that cannot start
        n, procs = torch.cuda.device_count(), max(env_int("LOCAL_WORLD_SIZE", 0), local_rank + 1)
        if procs > n:
            raise ValueError(f"torchrun started {procs} processes on this machine but it has {n} "
                             f"GPU{'s' * (n != 1)}: use --nproc_per_node={n} or fewer")
        name = f"cuda:{local_rank}"
    if name.startswith("cuda:") and name[5:].isdigit() and int(name[5:]) >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} does not exist here: this machine has {torch.cuda.device_count()} GPUs")
    return torch.device(name)


def cpu_flags():
    """(model name, set of ISA flags) from /proc/cpuinfo on Linux; elsewhere platform's name and no flags."""
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        return info.get("model name") or platform.processor(), set(info.get("flags", "").split())
    except OSError:
        return platform.processor() or platform.machine(), set()


def native_bf16(device):
    """Whether the device multiplies bf16 natively: a GPU from Ampere on, a CPU with AVX-512 BF16 or AMX (Linux's
    flags); elsewhere (AVX2-only x86, a Mac, an unknown CPU) bf16 is emulated, far slower than float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu" and bool(cpu_flags()[1] & {"avx512_bf16", "amx_bf16"})


def autocast(dtype, device):
    """(bf16 or not, the forward passes' context): bf16 autocast on CUDA unless asked otherwise. auto takes
    bf16 only where the GPU has it natively (Ampere on): T4 and V100 emulate it, slower than float32."""
    use_bf16 = dtype == "bfloat16" or (dtype == "auto" and device.type == "cuda"
                                       and torch.cuda.is_bf16_supported(including_emulation=False))
    return use_bf16, torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()




def init_distributed(train, device):
    """(rank, world size): (0, 1) alone, else joins the torchrun process group (NCCL on GPUs, gloo on CPUs)."""
    world, rank = env_int("WORLD_SIZE", 1), env_int("RANK", 0)
    if rank >= world:  # WORLD_SIZE=0 too
        raise ValueError(f"environment variables RANK={rank} and WORLD_SIZE={world}: a run has WORLD_SIZE >= 1 "
                         f"processes, ranked from 0 (torchrun sets both; unset them to run alone)")
    if world == 1:
        return 0, 1
    if train["batch_size"] % world:
        raise ValueError(f"--batch_size {train['batch_size']} (the global batch) must be a multiple of the "
                         f"{world} data-parallel processes")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # dynamo imported before the group's threads start, not after (the optimizer imports it): imported after,
        # 4 of 16 two-process runs here aborted at their exit ("terminate called without an active exception")
        importlib.import_module("torch._dynamo")
        store = rendezvous(rank, world)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=world)
    return dist.get_rank(), world


def rendezvous(rank, world):
    """The store every rank meets at, MASTER_ADDR:MASTER_PORT, hosted by rank 0 (or torchrun's agent). torch's own
    waits 30 minutes in C++, deaf to Ctrl-C and SIGTERM; each wait here is Python's, RENDEZVOUS_S at most."""
    port, addr = env_int("MASTER_PORT", 0), os.environ.get("MASTER_ADDR", "")
    if not (addr and 0 < port < 2 ** 16):
        raise ValueError(f"WORLD_SIZE={world} needs MASTER_ADDR and a MASTER_PORT in [1, 65535]: start the run "
                         f"with torchrun, which sets them, or unset WORLD_SIZE to run alone")
    where, deadline = f"MASTER_ADDR:MASTER_PORT {addr}:{port}", time.time() + RENDEZVOUS_S
    host = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"  # else torchrun's agent hosts it
    while time.time() < deadline:  # the host looked up, and its port tried unless hosting it, from Python: torch's
        try:                       # store client retries both in C++, deaf to signals, its log filling with warnings
            socket.getaddrinfo(addr, port) if host else socket.create_connection((addr, port), timeout=1).close()
            break
        except socket.gaierror:
            raise ValueError(f"{where}: MASTER_ADDR names no host") from None
        except OSError:
            time.sleep(0.2)  # Ctrl-C and SIGTERM are heard here
    try:  # waited for in Python: a port held by a server of another kind would hold the handshake forever
        store = waited(lambda: dist.TCPStore(addr, port, world, host, wait_for_workers=False, multi_tenant=True,
                                             timeout=timedelta(seconds=max(deadline - time.time(), 1))), deadline)
    except (RuntimeError, OSError) as e:  # the port taken, the host gone, or (TimeoutError) no answer
        raise ValueError(f"rank {rank} could not {'host' if host else 'reach'} the rendezvous at {where} "
                         f"({str(e).splitlines()[0][:100]})") from None
    store.set_timeout(timedelta(seconds=RENDEZVOUS_S))  # for the process group's own exchanges through it
    key = f"windtunnel_joined_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"  # a restart counts afresh
    joined = store.add(key, 1)
    while joined < world and time.time() < deadline:
        time.sleep(0.1)  # Ctrl-C and SIGTERM are heard here
        joined = store.add(key, 0)
    if joined < world:
        raise ValueError(f"{joined} of WORLD_SIZE={world} processes joined at {where} in {RENDEZVOUS_S} s: start "
                         f"every rank (torchrun --nproc_per_node {world} train.py ...), or unset WORLD_SIZE")
    return store


def waited(work, deadline):
    """work() in a thread, waited for here, where Ctrl-C and SIGTERM are heard (a call blocked in C++ is deaf to
    them); TimeoutError past the deadline (a time.time()), the thread left behind."""
    out = []

    def run():
        try:
            out.append(work())
        except Exception as e:
            out.append(e)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(max(deadline - time.time(), 0))
    if not out or isinstance(out[0], Exception):
        raise out[0] if out else TimeoutError("no answer")
    return out[0]


def data_parallel(model, device, world):
    """model, or under torchrun model in DDP (gradients averaged over the processes). Buffers are constants
    (position tables, masks), and rank 0 evaluates alone: never synced (torch 2.13 renamed broadcast_buffers)."""
    if world == 1:
        return model
    sync = next(k for k in ("forward_sync_buffers", "broadcast_buffers") if k in inspect.signature(DDP).parameters)
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **{sync: False})


def rank0s(value, choices, world, device):
    """Rank 0's value, one of choices (a verdict of VERDICTS after an evaluation; whether it took the run's
    folder), on every rank."""
    if world == 1:
        return value
    t = torch.tensor([choices.index(value)], device=device)
    dist.broadcast(t, 0)
    return choices[int(t.item())]


def global_mean(x, world):
    """x averaged over the data-parallel processes, as a float (the global batch's loss); every rank calls it."""
    x = x.detach().clone()  # all_reduce works in place
    if world > 1:
        dist.all_reduce(x)
    return x.item() / world


class CompiledOrEager:
    """torch.compile(net), or net itself from the first time compiling fails, with one line saying so. Dynamo
    compiles again at each new mode, batch size and length, and builds the backward graph at the first
    backward, so a failure can come late: the forward's are caught here, the backward's via retry()."""

    def __init__(self, net, compile, print=print):
        self.net, self.fn, self.print = net, net, print
        if compile:
            torch._dynamo.reset()  # a fresh recompile budget per run, or the later runs of a sweep run eager unsaid
            try:
                self.fn = torch.compile(net)
            except Exception as e:  # e.g. a Python version torch.compile does not support yet
                self.fail(e)

    def fail(self, e):
        """Run eager from now on; False when already eager, the error then being no compiler's."""
        if self.fn is self.net or isinstance(e, torch.OutOfMemoryError):
            return False
        e = getattr(e, "inner_exception", e)  # the backend's own error, inside dynamo's BackendCompilerFailed
        first = (str(e).splitlines() or [""])[0][:150]
        self.print(f"torch.compile failed ({type(e).__name__}: {first}); running eager")
        self.fn = self.net
        return True

    def retry(self, work):
        """work(), and once more eager if it failed compiled (a training step: forward, loss and backward)."""
        try:
            return work()
        except Exception as e:
            if not self.fail(e):
                raise
            return work()

    def __call__(self, x):
        return self.retry(lambda: self.fn(x))

    def __getattr__(self, name):  # eval(), train(), ...: net's
        return getattr(self.net, name)




# -----------------------------------------------------------------------------
# what the scripts' output shares: times, figures


def fmt_time(s):
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m" if s >= 3600 else f"{int(s // 60)}m{int(s % 60):02d}s"


def pyplot():
    """matplotlib.pyplot on the Agg backend (files, no window), or None without matplotlib: figures are optional."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt

# -----------------------------------------------------------------------------
# one run's process, its folder, and what a fault leaves behind


class Proc:
    """One process's share of a run: its device, rank (rank 0 logs, evaluates and writes) and the number of
    processes, the step it reached, and the checkpoints it keeps (ckpts: checkpoints.Checkpoints)."""

    def __init__(self, device, rank, world, train, resumed_at=None):
        self.device, self.rank, self.world, self.master = device, rank, world, rank == 0
        self.ckpts, self.step = Checkpoints(train, resumed_at), resumed_at or 0
        self.lock = None  # rank 0's lock on out_dir
        self.solo = False  # rank 0 works alone while the others wait for its word (alone, verdict)
        # sequences per forward pass at evaluation: --eval_batch_size; auto: on a GPU or Mac, whose memory is the
        # limit, this process's share of a training batch; on a CPU the whole draw of 250, as before the option
        auto = 250 if torch.device(device).type == "cpu" else max(1, train["batch_size"] // world)
        self.eval_batch = train.get("eval_batch_size") or auto

    def alone(self):
        """True on rank 0, which from here works alone (evaluates, writes) while the other ranks wait for its
        word (verdict); a failure meanwhile is told to them (guarded), so that they stop now, not at a timeout."""
        self.solo = self.master and self.world > 1
        return self.master

    def verdict(self, v):
        """Rank 0's word v (one of VERDICTS) on every rank."""
        self.solo = False
        return rank0s(v, VERDICTS, self.world, self.device)

    def diverged(self, what, it):
        """Say why the run stops at step it (what is not finite) and which checkpoint is the last good one; 1."""
        back = " (the run it was to replace is put back)" if self.ckpts.settle(keep_new=False) else ""
        print0(f"{what} at step {it}: stopping; last good checkpoint: {self.ckpts.kept or 'none was saved yet'}"
               f"{back}", file=sys.stderr)
        return 1


def prepare_out_dir(train, resumed, proc):
    """Lock the run's folder (rank 0, whose answer every rank follows), then check that it may start there;
    --overwrite sets the old run aside."""
    out_dir, master, refused = train["out_dir"], proc.master, None
    check_out_dir(out_dir)
    if master:
        os.makedirs(out_dir, exist_ok=True)
        try:
            proc.lock = lock_out_dir(out_dir)
        except ValueError as e:
            refused = e
        if not refused and settle_aside(out_dir, keep_new=os.path.exists(os.path.join(out_dir, "ckpt.pt"))):
            print0(f"{out_dir}: put back the run that an --overwrite run killed before its first checkpoint "
                   f"had set aside")
    if not rank0s(refused is None, (False, True), proc.world, proc.device):  # the other ranks stop too, not wait for it
        raise refused or ValueError(f"rank 0 could not take {out_dir} (its line says why): rank {proc.rank} stops")
    if not resumed and not train["overwrite"] and os.path.isdir(out_dir) and run_files(out_dir):
        raise ValueError(f"{out_dir} already holds a run: --resume to continue it, --overwrite to replace it "
                         f"(and its snapshots), or another --out_dir")
    os.makedirs(out_dir, exist_ok=True)
    if master:  # left by a killed write
        for f in run_tmp_files(out_dir):
            os.remove(f)
        if train["overwrite"] and not resumed and run_files(out_dir):
            set_aside(out_dir)
            proc.ckpts.aside = True
    return out_dir


def guarded(loop, train, resumed_at=None, prog="train.py"):
    """loop(proc) on this process's device (under torchrun: its rank's GPU, in the process group), with Ctrl-C,
    out of memory and a full disk reported in one line saying what was kept (exit code 2); a run that left
    nothing leaves no empty folders either. resumed_at: the step of the checkpoint it continues."""
    device = pick_device(train["device"], env_int("LOCAL_RANK", 0) if "WORLD_SIZE" in os.environ else None)
    rank, world = init_distributed(train, device)
    out_dir = new = os.path.abspath(train["out_dir"])
    while not os.path.exists(os.path.dirname(new)):  # the outermost folder this run will create
        new = os.path.dirname(new)
    created = None if os.path.exists(new) else new
    proc = Proc(device, rank, world, train, resumed_at)
    try:
        code = loop(proc)
        proc.ckpts.settle(keep_new=code == 0)  # finished (--max_iters 0 saves no checkpoint), or diverged
        # rank 0 evaluates and writes alone at the end: no rank tears the group down before it is done (or failed)
        if world > 1 and code != 2 and proc.verdict("go on") == "failed":
            return 2
        return code
    except BaseException as e:
        if proc.solo:  # the other ranks wait for rank 0's word: that it failed (its own line says why)
            proc.verdict("failed")
        back = proc.ckpts.settle(keep_new=False)  # ended before its first checkpoint: the run it replaces stays
        if not isinstance(e, (KeyboardInterrupt, OSError)) and not is_oom(e):
            raise
        if proc.ckpts.kept:
            kept = f"kept {proc.ckpts.kept}"
        else:
            kept = "no checkpoint was saved" + ("; the run it was to replace is put back" if back else "")
        print0(f"{prog}: error: {fault(e)} at step {proc.step}; {kept}", file=sys.stderr)
        if isinstance(e, KeyboardInterrupt):  # a caller's sweep stops too; cli() makes it exit code 2
            e.reported_to = sys.stderr  # a sweep that sent it to a log file still says it on the console
            raise
        return 2
    finally:
        if proc.lock:
            unlock_out_dir(proc.lock)
        p = out_dir  # a run that left nothing leaves no empty folders either
        while created and p.startswith(created) and os.path.isdir(p) and not os.listdir(p):
            os.rmdir(p)
            p = os.path.dirname(p)
        if world > 1:
            dist.destroy_process_group()


@contextmanager
def oom_hint(hint):
    """An out-of-memory inside says hint in the run's one-line report (guarded) instead of the training's."""
    try:
        yield
    except Exception as e:
        if is_oom(e):
            e.hint = hint
        raise

# requests the machine's memory cannot hold: refused in a line before they allocate, not ended by the kernel


def machine_memory(device):  # bytes: the GPU's memory, else the machine's (0: unknown, then nothing is refused)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0


def token_bytes(mc, backward, itemsize=4):
    """At least the bytes a token holds in a forward pass (backward: and what its backward keeps): half of the 17
    d_model floats a layer that a transformer's training step measured (bijection, 4,000 sequences: 26 KB a token),
    so only what cannot fit is refused; without a d_model, the outputs and the batch's ids, targets and mask."""
    width, layers = mc.get("d_model") or 0, mc.get("n_layer") or 1
    outs = mc.get("n_classes") or mc.get("vocab_size") or 2
    return itemsize * ((8 if backward else 2) * width * layers + 2 * outs) + 24


def check_memory(flag, need, device, fix):
    """Refuse `flag` if its estimated need (bytes) exceeds the memory of the machine (the GPU's on CUDA)."""
    have = machine_memory(device)
    if have and need > have:
        gpu = "GPU " if device.type == "cuda" else ""
        raise ValueError(f"{flag}: needs at least {need / 2**30:,.1f} GiB (an estimate), more than this machine's "
                         f"{have / 2**30:.1f} GiB of {gpu}memory; {fix}")


def check_run_memory(run, device):
    """train.py's requests, before it allocates: a training step (a process's --batch_size) and an evaluation pass."""
    train, opts = run.train, " ".join(f"--{k} {v}" for k, v in run.task_opts.items())
    mc, eval_tasks, train_len = run.model_config, run.tasks, run.curriculum.layout.seq_len
    per_pass = min(train["eval_batch_size"] or 250, 250, max(train["eval_samples"], train["eval_samples_during"]))
    check_memory(f"--batch_size {train['batch_size']} of {train_len}-token sequences" + f" ({opts})" * bool(opts),
                 train["batch_size"] // max(env_int("WORLD_SIZE", 1), 1) * train_len * token_bytes(mc, True),
                 device, "use a smaller --batch_size" + (" or shorter sequences" if opts else ""))
    name, task = max(eval_tasks.items(), key=lambda kv: kv[1].seq_len)
    flag = f"--eval_K {name[1:]}" if name != "default" else f"evaluating {train_len}-token sequences"
    check_memory(f"{flag} ({task.seq_len} tokens a sequence, {per_pass} a pass)",
                 per_pass * task.seq_len * token_bytes(mc, False), device,
                 "use a smaller --eval_K" if name != "default" else "use a smaller --eval_batch_size")


def say_eta(flag, value, done, total, t0, after=60):
    """One line, naming the flag, when the rest of a long request (done of total units since t0) will take more
    than `after` seconds: its memory is bounded, its time is not."""
    left = (time.time() - t0) * (total - done) / max(done, 1)
    if left > after:
        print0(f"{flag} {value}: about {f'{left / 3600:,.1f} h' if left >= 3600 else f'{left / 60:.0f} min'} more "
               f"at this speed")
