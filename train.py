"""
Train any model on any wind tunnel, score it against the exact posterior, save a checkpoint.

    python train.py --task recall --model transformer               # quick CPU defaults
    python train.py --task hmm --model transformer --preset paper   # the paper's sizes (GPU)
    python train.py --task bijection --resume                       # continue out/bijection_transformer
    python train.py --task bijection --overwrite                    # replace it with a new run
    python train.py --task bijection --eval_only                    # re-evaluate its checkpoint

Settings: defaults < the preset for the task and model < flags (presets.py; `--help` lists the flags of
the chosen --task and --model). Recipe: AdamW, or with --optimizer muon torch.optim.Muon on the hidden
weight matrices and AdamW on the rest; linear warmup then cosine decay (get_lr), gradient clipping; a
fresh batch every step from a seeded generator, every scored position supervised. Evaluation draws
held-out sequences from a fixed seed (hmm also at K = 30 and 50). A run writes ckpt.pt (tensors and plain
values, loads with weights_only=True) and results.json (config, every metric, per-position entropy
curves, history, wall time, device, code version) to --out_dir, each through a temporary file.

Data-parallel: `torchrun --nproc_per_node=N train.py ...`. --batch_size stays the global batch: every
rank draws it from the same seed and trains on its 1/N slice, so a run follows the single-process run;
rank 0 alone logs, evaluates and writes.

Reading order: build, get_lr, evaluate, then train_loop (the step loop, evaluation and checkpoint);
below it the batches and devices, the files, and the command line with its fault handling.
"""
import builtins
from contextlib import nullcontext, suppress
from dataclasses import asdict
import errno
import glob
import json
import math
import os
import re
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from oracles import Metrics
from presets import (IO_FIELDS, MODELS, build_config, check_train, match_width, parse_args, parse_curriculum,
                     parse_stop, resume_config)
from tasks import make_task

VERDICTS = ("go on", "reached", "diverged")  # after an evaluation: --stop_at reached, not finite

# -----------------------------------------------------------------------------
# model, optimizer, learning rate


def build(cfg, device):
    """Tasks (training + evaluation lengths), model and optimizer from a config."""
    train = cfg["train"]
    task = make_task(cfg["task"], **cfg["task_opts"])
    eval_tasks = {"default": task}
    for K in train["eval_K"]:
        if "K" not in cfg["task_opts"] | task.options():
            raise ValueError(f"--eval_K needs a task with a K option (hmm, regression), not {cfg['task']!r}")
        eval_tasks[f"K{K}"] = make_task(cfg["task"], **(cfg["task_opts"] | {"K": K}))
    if train["train_all_queries"] and cfg["task"] != "recall":
        raise ValueError(f"--train_all_queries is an option of --task recall, not {cfg['task']!r}")
    Config, Model = MODELS[cfg["model"]]
    io = {k: getattr(task, k) for k in IO_FIELDS}
    # training sequences (every key queried) can be longer than the evaluation's: the context fits both
    lengths = [t.seq_len for t in eval_tasks.values()] + ([task.all_queries().seq_len] if train["train_all_queries"] else [])
    longest = max(lengths)
    mc = {"block_size": longest} | cfg["model_opts"] | io
    if train["match_params"]:
        mc = match_width(cfg, Config, Model, mc, {"block_size": longest} | io)
    config = Config(**mc)
    if getattr(config, "block_size", longest) < longest:
        raise ValueError(f"sequences of length {longest} exceed the model's context block_size={config.block_size}")
    model = Model(config).to(device)
    return task, eval_tasks, model, make_optimizer(model, train, device), asdict(config)


class Optimizers:
    """Several optimizers over disjoint parameters, stepped as one (--optimizer muon needs two)."""

    def __init__(self, *opts):
        self.opts = opts

    @property
    def param_groups(self):  # read anew: load_state_dict replaces an optimizer's group dicts
        return [g for o in self.opts for g in o.param_groups]

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)

    def step(self):
        for o in self.opts:
            o.step()

    def state_dict(self):
        return [o.state_dict() for o in self.opts]

    def load_state_dict(self, states):
        """Each optimizer's state, keeping its own kernel flags (fused on CUDA): a CPU run resumed on a GPU
        would otherwise run the checkpoint's unfused loop."""
        states = [states] if isinstance(states, dict) else states  # checkpoints from before --optimizer
        if len(states) != len(self.opts):
            raise ValueError(f"the checkpoint holds {len(states)} optimizer states, this run has {len(self.opts)}")
        for o, state in zip(self.opts, states):
            groups = [g | {k: new[k] for k in ("fused", "foreach", "capturable") if k in new}
                      for g, new in zip(state["param_groups"], o.param_groups)]
            o.load_state_dict(state | {"param_groups": groups})


def make_optimizer(model, train, device):
    """AdamW with decoupled weight decay on matrices and embeddings, or (--optimizer muon) Muon on the weight
    matrices of the linear maps inside the blocks (muon_params) and AdamW on everything else. Muon's update is
    rescaled to AdamW's RMS (Moonshot's rule), so both take the same --lr and schedule. Parameters marked
    `_no_weight_decay` (Mamba's A_log and D) are never decayed and never in Muon."""
    named = list(model.named_parameters())
    hidden = muon_params(model) if train["optimizer"] == "muon" else set()
    decays = lambda p: p.dim() >= 2 and not getattr(p, "_no_weight_decay", False)
    rest = [p for n, p in named if n not in hidden]
    groups = [dict(params=[p for p in rest if decays(p)], weight_decay=train["weight_decay"]),
              dict(params=[p for p in rest if not decays(p)], weight_decay=0.0)]
    betas = (train["beta1"], train["beta2"])
    try:  # the fused kernel on CUDA, the plain loop elsewhere
        adamw = torch.optim.AdamW(groups, lr=train["lr"], betas=betas, fused=device.type == "cuda")
    except (RuntimeError, TypeError):
        adamw = torch.optim.AdamW(groups, lr=train["lr"], betas=betas)
    if train["optimizer"] == "adamw":
        return Optimizers(adamw)
    if not hasattr(torch.optim, "Muon"):
        raise ValueError(f"--optimizer muon needs torch >= 2.9 (torch.optim.Muon); this is torch {torch.__version__}")
    muon = torch.optim.Muon([p for n, p in named if n in hidden], lr=train["lr"],
                            weight_decay=train["weight_decay"], adjust_lr_fn="match_rms_adamw")
    return Optimizers(adamw, muon)


def muon_params(model):
    """The names of the parameters Muon takes: the 2-D weights of the linear maps inside the blocks (nn.Linear,
    and nn.LSTM's input and recurrent matrices), under `blocks.` (transformer, Mamba, MLP, linear attention) or
    `layers.` (LSTM). Per model, Muon gets: transformer c_attn, c_proj, c_fc; Mamba in_proj, x_proj, dt_proj,
    out_proj; LSTM weight_ih, weight_hh; MLP c_fc, c_proj; linear attention c_attn, c_beta, c_proj, c_fc.
    AdamW keeps the embeddings, position tables, read-ins, heads, norms' gains, biases, convolutions,
    per-head scalars, and every parameter marked `_no_weight_decay` (Mamba's A_log and D), which an
    orthogonalised update would mix across state dimensions."""
    names = set()
    for mname, m in model.named_modules():
        if not mname.startswith(("blocks.", "layers.")) or not isinstance(m, (torch.nn.Linear, torch.nn.LSTM)):
            continue
        for pname, p in m.named_parameters(recurse=False):
            if p.dim() == 2 and pname.startswith(("weight",)) and not getattr(p, "_no_weight_decay", False):
                names.add(f"{mname}.{pname}")
    return names


def get_lr(it, train):
    """Linear warmup to --lr, cosine down to min_lr_ratio * lr at lr_decay_iters, then flat."""
    w, T = train["warmup_iters"], train["lr_decay_iters"] or train["max_iters"]
    if it < w:
        return train["lr"] * (it + 1) / (w + 1)
    decay = 0.5 * (1 + math.cos(math.pi * min(1.0, (it - w) / max(1, T - w))))
    return train["lr"] * (train["min_lr_ratio"] + (1 - train["min_lr_ratio"]) * decay)


# -----------------------------------------------------------------------------
# evaluation


@torch.no_grad()
def evaluate(model, task, n_samples, seed, device, ctx, batch_size=250):
    """Metrics on n_samples held-out sequences drawn from a fixed seed."""
    model.eval()
    g, m = torch.Generator().manual_seed(seed), Metrics()
    for i in range(0, n_samples, batch_size):
        batch = task.sample(min(batch_size, n_samples - i), g)
        with ctx:
            out = model(batch.x.to(device))
        m.update(task, batch, out.float())
    model.train()
    return m.result(task)


def summary(r):
    s = f"mae_curve {r['mae_curve']:.4f} | mae_token {r['mae_token']:.4f} | kl {r['kl']:.4f}"
    return s + (f" | acc {r['accuracy']:.4f} (bayes {r['oracle_accuracy']:.4f})" if "accuracy" in r else "")


# -----------------------------------------------------------------------------
# the training loop


def train_loop(cfg, device, rank, world, resume_state, eval_only, progress):
    train, master, T = cfg["train"], rank == 0, cfg["train"]["max_iters"]
    print = builtins.print if master else (lambda *a, **k: None)  # rank 0 speaks for the run
    torch.manual_seed(train["seed"])
    task, eval_tasks, model, opt, model_config = build(cfg, device)
    stop, (use_bf16, ctx) = parse_stop(train["stop_at"], task), autocast(train["dtype"], device)
    batches, it, elapsed, history = Batches(task, train, device, rank, world), 0, 0.0, []
    out_dir = prepare_out_dir(train, resume_state is not None, master)
    if resume_state is not None:
        it, elapsed, history = resume(resume_state, model, opt, batches, device, train, print)
    # buffers are constants (position tables, masks): nothing to broadcast, and rank 0 evaluates alone
    net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False) if world > 1 else model
    fwd = CompiledOrEager(net, train["compile"], print)
    eval_fwd = model if world > 1 else fwd  # the bare model: no gradient hooks, no collectives
    print(f"{cfg['task']} x {cfg['model']} | {model.num_params():,} params | device {device}{' bf16' if use_bf16 else ''} | out {out_dir}")
    snapshots = set(log_spaced(T)) if train["ckpt_schedule"] == "log" else set()
    ckpt_path, last_good = os.path.join(out_dir, "ckpt.pt"), lambda: progress["kept"] or "none was saved yet"
    t_start = t_log = time.time()
    it_log = it
    while it < T and not eval_only:
        lr = get_lr(it, train)
        for group in opt.param_groups:
            group["lr"] = lr
        batch, stage = batches.get(it)
        out, loss = step(fwd, stage, opt, batch, ctx)
        if train["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
        opt.step()
        it += 1
        progress["step"] = it
        at_log, at_eval = it % train["log_interval"] == 0 or it == T, it % train["eval_interval"] == 0 or it == T
        if at_log or at_eval:  # the only host sync between log lines; the same loss on every rank
            lossf = global_mean(loss, world)
        if at_log:
            if not math.isfinite(lossf):
                print(f"loss is {lossf} at step {it}: stopping; last good checkpoint: {last_good()}", file=sys.stderr)
                return 1
            m, dt = Metrics(), time.time() - t_log
            m.update(stage, batch.to("cpu"), out.float())
            print(f"step {it:>6}/{T} | loss {lossf:.4f} | mae {m.result(stage)['mae_token']:.4f} bits (batch) "
                  f"| {(it - it_log) * train['batch_size'] * stage.seq_len / dt / 1e3:.1f}k tok/s | lr {lr:.2e} "
                  f"| eta {fmt_time((T - it) * dt / (it - it_log))}")
            t_log, it_log = time.time(), it
        if not (at_eval or it in snapshots):
            continue
        verdict = "go on"  # rank 0's, which every rank follows
        if master:
            finite = all(torch.isfinite(p).all() for p in model.parameters())
            r = evaluate(eval_fwd, task, train["eval_samples_during"], train["eval_seed"], device, ctx) \
                if finite and at_eval else None
            if not finite or r is not None and not all(math.isfinite(v) for v in r.values() if isinstance(v, float)):
                print(f"{'parameters are' if r is None else 'held-out metrics are'} not finite at step {it}: "
                      f"stopping; last good checkpoint: {last_good()}", file=sys.stderr)
                verdict = "diverged"
            else:
                now = elapsed + time.time() - t_start
                state = dict(model=model.state_dict(), optimizer=opt.state_dict(), gen_state=batches.state(it),
                             **rng_state(device), iter=it, elapsed=now, history=history, config=cfg,
                             model_config=model_config)
                if at_eval:
                    history.append(dict(iter=it, loss=lossf, time=now, **{k: v for k, v in r.items() if not isinstance(v, list)}))
                    print(f"eval step {it}: {summary(r)}")
                    save_checkpoint(ckpt_path, state)
                    progress["kept"] = f"{ckpt_path} (step {it})"  # finite parameters and metrics: a good one
                    verdict = "reached" if stop is not None and stop(r) else verdict
                if train["ckpt_schedule"] == "eval" and at_eval or it in snapshots:
                    save_checkpoint(os.path.join(out_dir, f"ckpt_{it:07d}.pt"), state)
                t_log, it_log = time.time(), it  # progress rates exclude evaluation time
        verdict = rank0s(verdict, world, device)
        if verdict == "diverged":
            return 1
        if verdict == "reached":
            print(f"reached {train['stop_at']} at step {it}: stopping")
            break
    if master:
        final_eval(cfg, eval_tasks, eval_fwd, device, ctx, it, history, elapsed + time.time() - t_start,
                   model_config, eval_only, print)
    return 0


def step(fwd, task, opt, batch, ctx):
    """Forward and backward; the compiled backward graph is built, and may fail, at the first backward."""
    for attempt in (0, 1):
        try:
            with ctx:
                out = fwd(batch.x)
                loss = task.loss(out, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            return out, loss
        except Exception as e:
            if attempt or not fwd.fail(e):
                raise


def resume(state, model, opt, batches, device, train, print):
    """Model, optimizer, RNGs and batch generator from a checkpoint: (step, elapsed time, history)."""
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    set_rng_state(state, device)
    try:
        batches.gen.set_state(state["gen_state"])
    except (RuntimeError, ValueError):  # a generator state from another kind of device (a GPU run resumed on a CPU)
        print("the checkpoint's batch generator was on another device: reseeding, the batches will differ "
              "from an uninterrupted run's")
        batches.gen.manual_seed(train["seed"] + state["iter"])
    return state["iter"], state["elapsed"], state["history"]


def final_eval(cfg, eval_tasks, model, device, ctx, it, history, wall, model_config, eval_only, print):
    """The held-out metrics at every evaluated length, into results.json (eval.json for --eval_only)."""
    train, metrics = cfg["train"], {}
    for name, t in eval_tasks.items():
        metrics[name] = evaluate(model, t, train["eval_samples"], train["eval_seed"], device, ctx)
        print(f"final {name} ({train['eval_samples']} held-out sequences): {summary(metrics[name])}")
    results = dict(task=cfg["task"], model=cfg["model"], preset=cfg["preset"], config=cfg, model_config=model_config,
                   task_options=eval_tasks["default"].options(), n_params=model.num_params(), iters=it,
                   metrics=metrics, history=history, wall_time_s=wall, device=str(device), seed=train["seed"],
                   code_version=code_version(), torch_version=torch.__version__)
    path = os.path.join(train["out_dir"], "eval.json" if eval_only else "results.json")
    write_json(path, results)
    print(f"wrote {path} | wall time {fmt_time(wall)}")


def log_spaced(n):
    """Steps 1, 2, 3, 6, 10, 18, 32, 56, 100, ... (four per decade) up to n."""
    return sorted({round(10 ** (i / 4)) for i in range(int(4 * math.log10(max(n, 1))) + 1)})


# -----------------------------------------------------------------------------
# batches and devices: CPU, CUDA (bf16 autocast, fused AdamW, torch.compile, batches drawn on the GPU), MPS, torchrun


class Batches:
    """The global batch of step `it` is slice it % chunk of one draw of `chunk` batches; every rank draws
    the same and trains on its 1/world slice. state(it) is the generator state that redraws step it's batch."""

    def __init__(self, task, train, device, rank, world):
        self.gen, self.n = data_source(train, device)
        self.B, self.device, self.rank, self.world = train["batch_size"], device, rank, world
        stage = parse_curriculum(train["curriculum"], task, train) or (lambda it: task)
        self.stage = (lambda it: stage(it).all_queries()) if train["train_all_queries"] else stage
        self.chunk = self.chunk_state = None

    def get(self, it):
        """Step it's batch, and the task it was drawn from (under a curriculum, that step's stage)."""
        k, B = it % self.n, self.B
        if k == 0 or self.chunk is None:  # None: resumed mid-chunk, with the generator at the chunk's start
            self.chunk_state = self.gen.get_state()
            self.chunk_task = self.stage(it - k)
            self.chunk = self.chunk_task.sample(B * self.n, self.gen)
        batch = self.chunk.map(lambda t: t[k * B:(k + 1) * B]) if self.n > 1 else self.chunk
        if self.world > 1:
            per = B // self.world
            batch = batch.map(lambda t: t[self.rank * per:(self.rank + 1) * per])
        if batch.x.device.type == "cpu" and self.device.type == "cuda":  # from pinned memory the copy is asynchronous
            batch = batch.map(lambda t: t.pin_memory().to(self.device, non_blocking=True), latent=False)
        # the oracle's float64 latents stay on the CPU (MPS has no float64)
        return batch.to(self.device, latent=False), self.chunk_task

    def state(self, it):
        return self.gen.get_state() if it % self.n == 0 else self.chunk_state


def data_source(train, device):
    """(generator, chunk): batches are drawn on the generator's device, `chunk` per sampler call. On a GPU a
    draw is a few hundred tiny kernels whatever its size, so one call per 16 steps makes it cheap."""
    on_gpu = train["data_device"] == "device" or train["data_device"] == "auto" and device.type == "cuda"
    dev = device if on_gpu else torch.device("cpu")
    return torch.Generator(device=dev).manual_seed(train["seed"]), train["data_chunk"] or (16 if dev.type == "cuda" else 1)


def rng_state(device):
    """The global generators a resumed run continues: dropout draws from the device's (the batches have their own)."""
    return dict(torch_rng=torch.get_rng_state()) | (
        dict(cuda_rng=torch.cuda.get_rng_state(device)) if device.type == "cuda" else {})


def set_rng_state(state, device):
    torch.set_rng_state(state["torch_rng"])
    if device.type == "cuda" and "cuda_rng" in state:  # absent when the run was on a CPU before
        torch.cuda.set_rng_state(state["cuda_rng"], device)


class CompiledOrEager:
    """torch.compile(net), or net itself from the first time compiling fails, with one line saying so. Dynamo
    compiles again at each new mode, batch size and length, and builds the backward graph at the first
    backward, so a failure can come late: the forward's are caught here, the backward's via fail()."""

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
        self.print(f"torch.compile failed ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]}); running eager")
        self.fn = self.net
        return True

    def __call__(self, x):
        try:
            return self.fn(x)
        except Exception as e:
            if not self.fail(e):
                raise
            return self.fn(x)

    def __getattr__(self, name):  # eval(), train(), ...: net's
        return getattr(self.net, name)


def pick_device(name, local_rank=None):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available() or name == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} is not available here; use auto or cpu")
    if name == "cuda" and local_rank is not None:
        # one GPU per data-parallel process: every process checks, so none waits for a rank that cannot start
        n, procs = torch.cuda.device_count(), max(int(os.environ.get("LOCAL_WORLD_SIZE", 0)), local_rank + 1)
        if procs > n:
            raise ValueError(f"torchrun started {procs} processes on this machine but it has {n} "
                             f"GPU{'s' * (n != 1)}: use --nproc_per_node={n} or fewer")
        name = f"cuda:{local_rank}"
    if name.startswith("cuda:") and name[5:].isdigit() and int(name[5:]) >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} does not exist here: this machine has {torch.cuda.device_count()} GPUs")
    return torch.device(name)


def autocast(dtype, device):
    """(bf16 or not, the forward passes' context): bf16 autocast on CUDA unless asked otherwise. auto takes
    bf16 only where the GPU has it natively (Ampere on): T4 and V100 emulate it, slower than float32."""
    use_bf16 = dtype == "bfloat16" or (dtype == "auto" and device.type == "cuda"
                                       and torch.cuda.is_bf16_supported(including_emulation=False))
    return use_bf16, torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()


def init_distributed(train, device):
    """(rank, world size): (0, 1) alone, else joins the torchrun process group (NCCL on GPUs, gloo on CPUs)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world == 1:
        return 0, 1
    if train["batch_size"] % world:
        raise ValueError(f"--batch_size {train['batch_size']} (the global batch) must be a multiple of the "
                         f"{world} data-parallel processes")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), world


def rank0s(verdict, world, device):
    """Rank 0's verdict after an evaluation (go on, reached, diverged), on every rank."""
    if world == 1:
        return verdict
    t = torch.tensor([VERDICTS.index(verdict)], device=device)
    dist.broadcast(t, 0)
    return VERDICTS[int(t.item())]


def global_mean(x, world):
    """x averaged over the data-parallel processes, as a float (the global batch's loss); every rank calls it."""
    x = x.detach().clone()  # all_reduce works in place
    if world > 1:
        dist.all_reduce(x)
    return x.item() / world


# -----------------------------------------------------------------------------
# files and checkpoints: every write goes through a temporary name, so a crash mid-write leaves the old file whole


def save_checkpoint(path, state):
    write_file(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path):
    if not os.path.exists(path):
        raise ValueError(f"no checkpoint at {path} (train first, or pass the run's --out_dir)")
    # one message for every failure: torch's own would suggest weights_only=False, which runs the file's code
    bad = ValueError(f"{path}: not a readable train.py checkpoint (truncated or corrupt?)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        raise bad from None
    if not (isinstance(state, dict) and {"config", "model", "model_config", "iter"} <= set(state)):
        raise bad
    for d in (state["model_config"], state["config"].get("model_opts", {})):  # checkpoints from before d_model
        if "n_embd" in d:
            d["d_model"] = d.pop("n_embd")
        d.pop("init_std", None)
    return state


def write_file(path, write):
    """write(tmp) beside path, then rename it over path; a failure removes tmp and names path."""
    tmp = path + ".tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        with suppress(OSError):
            os.remove(tmp)
        if isinstance(e, RuntimeError) and "writ" in str(e):  # torch.save's writer on a full disk
            e = OSError(errno.EIO, str(e).splitlines()[0])
        if isinstance(e, OSError) and not e.filename:  # the one-line report names the file
            raise OSError(e.errno, e.strerror, path) from None
        raise


def write_text(path, text):
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    write_file(path, write)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=1))


def check_out_dir(path, flag="--out_dir"):
    """Before any work: say in one line why files cannot be written under path (creates nothing)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):  # the folder that would hold the new ones
        p = os.path.dirname(p)
    if not os.path.isdir(p) or not os.access(p, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: cannot write there ({p} is {'a file' if os.path.isfile(p) else 'not writable'})")


def run_files(out_dir):
    """What a run writes to its folder: another run there would mix with it."""
    names = [os.path.join(out_dir, f) for f in ("ckpt.pt", "results.json", "eval.json")]
    return [p for p in names if os.path.exists(p)] + sorted(glob.glob(os.path.join(out_dir, "ckpt_*.pt")))


def prepare_out_dir(train, resumed, master):
    out_dir = train["out_dir"]
    check_out_dir(out_dir)
    if not resumed and not train["overwrite"] and os.path.isdir(out_dir) and run_files(out_dir):
        raise ValueError(f"{out_dir} already holds a run: --resume to continue it, --overwrite to replace it "
                         f"(and its snapshots), or another --out_dir")
    os.makedirs(out_dir, exist_ok=True)
    if master:  # .tmp files are left by a killed write; --overwrite removes the old run's files, snapshots too
        for f in glob.glob(os.path.join(out_dir, "*.tmp")) + (run_files(out_dir) if train["overwrite"] and not resumed else []):
            os.remove(f)
    return out_dir


def code_version():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        git = lambda *a: subprocess.run(["git", *a], cwd=here, capture_output=True, text=True, timeout=5).stdout.strip()
        rev = git("rev-parse", "--short", "HEAD")
        return (rev + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")) if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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
# one run from the command line, and what a fault leaves behind


def run(cfg, resume_state=None, eval_only=False):
    """train_loop, with Ctrl-C, out of memory and a full disk reported in one line saying what was kept."""
    train = cfg["train"]
    check_train(train)
    device = pick_device(train["device"], int(os.environ.get("LOCAL_RANK", 0)) if "WORLD_SIZE" in os.environ else None)
    rank, world = init_distributed(train, device)
    out_dir = new = os.path.abspath(train["out_dir"])
    while not os.path.exists(os.path.dirname(new)):  # the outermost folder this run will create
        new = os.path.dirname(new)
    kept = f"{os.path.join(train['out_dir'], 'ckpt.pt')} (step {resume_state['iter']})" if resume_state else None
    progress = dict(step=resume_state["iter"] if resume_state else 0, kept=kept)  # kept up to date by the loop
    created = None if os.path.exists(new) else new
    try:
        code = train_loop(cfg, device, rank, world, resume_state, eval_only, progress)
        if world > 1:  # rank 0 evaluates and writes alone at the end: no rank tears the group down before it is done
            dist.barrier()
        return code
    except BaseException as e:
        if not isinstance(e, (KeyboardInterrupt, OSError)) and not is_oom(e):
            raise
        what = ("interrupted" if isinstance(e, KeyboardInterrupt) else
                "out of memory (try a smaller --batch_size or model)" if is_oom(e) else
                f"{e.filename}: {e.strerror}" if e.filename else str(e))
        p = out_dir  # a run that left nothing leaves no empty folders either
        while created and p.startswith(created) and os.path.isdir(p) and not os.listdir(p):
            os.rmdir(p)
            p = os.path.dirname(p)
        if rank == 0:
            kept = f"kept {progress['kept']}" if progress["kept"] else "no checkpoint was saved"
            builtins.print(f"train.py: error: {what} at step {progress['step']}; {kept}", file=sys.stderr)
        if isinstance(e, KeyboardInterrupt):  # a caller's sweep stops too; cli() makes it exit code 2
            e.reported_to = sys.stderr  # a sweep that sent it to a log file still says it on the console
            raise
        return 2
    finally:
        if world > 1:
            dist.destroy_process_group()


def is_oom(e):
    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or \
        isinstance(e, RuntimeError) and re.search(r"out of memory|can't allocate memory", str(e)) is not None


def main(argv=None):
    known, given, parser = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if not (given.get("resume") or given.get("eval_only")):
            return run(build_config(known.task, known.model, known.preset, given))
        if given.get("overwrite"):
            raise ValueError("--overwrite starts a new run; it cannot go with --resume or --eval_only")
        out_dir = given.get("out_dir") or os.path.join("out", f"{known.task}_{known.model}")
        state = load_checkpoint(os.path.join(out_dir, "ckpt.pt"))
        return run(resume_config(state, known, given, out_dir), state, eval_only=bool(given.get("eval_only")))
    except ValueError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")


def cli(main, prog, kept):
    """A script's main() from the shell: Ctrl-C ends it with one line (what was kept) and exit code 2."""
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        if getattr(e, "reported_to", None) is not sys.stderr:
            print(f"{prog}: error: interrupted; {kept}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli(main, "train.py", "nothing was written (training had not started)")
