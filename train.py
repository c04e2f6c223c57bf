"""
Train any model on any wind tunnel, score it against the exact posterior, save a checkpoint.

    python train.py --task recall --model transformer           # quick CPU defaults
    python train.py --task hmm --model transformer --preset paper   # the paper's sizes (GPU)
    python train.py --task bijection --resume                    # continue out/bijection_transformer
    python train.py --task bijection --overwrite                 # replace it with a new run
    python train.py --task bijection --eval_only                 # re-evaluate its checkpoint

Settings come from three layers: the defaults in TRAIN and in each task/model dataclass, then
the preset for the task (PRESETS), then the command line (`--key value` or `--key=value`).
Task options (e.g. --V, --K) and model options (e.g. --n_layer) are flags too; `--help` lists
those of the chosen --task and --model.

Recipe: AdamW, or with --optimizer muon torch.optim.Muon on the hidden weight matrices and AdamW
on the rest (the preset chooses per task and model); linear warmup then cosine decay, gradient
clipping; a fresh batch every step from a seeded generator, every scored position supervised.
When training on CUDA the batches are drawn on the GPU, 16 per sampler call (--data_device,
--data_chunk); the hot loop reads nothing back from the GPU except at log lines. Evaluation uses held-out
sequences from a fixed seed; hmm is also evaluated at K = 30 and 50 (length generalisation).
A run writes `ckpt.pt` and `results.json` (config, parameter count, every metric, per-position
model vs oracle entropy curves, history, wall time, device, seed, code version) to --out_dir.
Checkpoints hold only tensors and plain values and load with weights_only=True.

Data-parallel on several GPUs (or CPU processes): `torchrun --nproc_per_node=N train.py ...`.
--batch_size stays the global batch: every rank draws the same global batch from the same seed
and trains on its 1/N slice, DDP averages the gradients, so a run follows the single-process
run's trajectory. Rank 0 alone logs, evaluates and writes the checkpoint and results.json.
"""
import argparse
import builtins
from contextlib import nullcontext, suppress
from dataclasses import asdict, fields
import difflib
import errno
import glob
import inspect
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

from linear_attn import LinearAttention, LinearAttentionConfig
from lstm import LSTM, LSTMConfig
from mamba import Mamba, MambaConfig
from mlp import MLP, MLPConfig
from oracles import Metrics
from presets import PRESETS, match_width
from tasks import TASKS, make_task
from transformer import Transformer, TransformerConfig

MODELS = {"transformer": (TransformerConfig, Transformer), "mamba": (MambaConfig, Mamba),
          "lstm": (LSTMConfig, LSTM), "mlp": (MLPConfig, MLP),
          "linear_attn": (LinearAttentionConfig, LinearAttention)}
IO_FIELDS = ("vocab_size", "n_features", "n_classes", "answer_offset", "gaussian")  # set from the task

TRAIN = {  # name: (default, help); presets and flags override
    "out_dir": ("", "where to write ckpt.pt and results.json (default out/<task>_<model>)"),
    "seed": (1337, "seed for the model init and the training batches"),
    "match_params": (0, "set the model's width so its parameter count is within 2%% of this: 0 = off, "
                        "-1 = the transformer's count for this task and preset"),
    "device": ("auto", "auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps"),
    "dtype": ("auto", "auto (bfloat16 autocast on a CUDA GPU that has it natively, else float32) | float32 | bfloat16"),
    "compile": (False, "torch.compile the model (falls back to eager if compilation fails)"),
    "max_iters": (2000, "training steps"),
    "lr_decay_iters": (0, "steps of the cosine decay, then the final rate (0 = --max_iters); a checkpoint keeps "
                          "it, so `--resume --max_iters N` runs on at the final rate"),
    "batch_size": (64, "sequences per step (fresh every step)"),
    "data_device": ("auto", "where training batches are drawn: auto (on the GPU when training on CUDA, else the CPU) "
                            "| cpu | device (the training device)"),
    "data_chunk": (0, "batches drawn per sampler call, which spreads its fixed cost (many small ops) over several "
                      "steps: 0 = auto (16 when drawing on a GPU, else 1)"),
    "optimizer": ("adamw", "adamw | muon (torch.optim.Muon on the hidden weight matrices, AdamW on the rest)"),
    "lr": (1e-3, "peak learning rate"),
    "min_lr_ratio": (0.1, "final learning rate as a fraction of --lr (cosine decay)"),
    "warmup_iters": (100, "linear warmup steps"),
    "weight_decay": (0.01, "AdamW weight decay on matrices and embeddings"),
    "beta1": (0.9, "AdamW beta1"),
    "beta2": (0.99, "AdamW beta2"),
    "grad_clip": (1.0, "clip the gradient norm to this (0 = off)"),
    "log_interval": (50, "steps between progress lines"),
    "eval_interval": (500, "steps between held-out evaluations and checkpoints"),
    "eval_samples": (2000, "held-out sequences in the final evaluation"),
    "eval_samples_during": (500, "held-out sequences in the evaluations during training"),
    "eval_seed": (424242, "seed of the held-out sequences, a different stream from the training batches"),
    "eval_K": ([], "also evaluate at these numbers of observations (tasks with a K option)"),
    "ckpt_schedule": ("last", "last: keep ckpt.pt only | eval: also a copy at every evaluation | log: also copies at log-spaced steps"),
    "stop_at": ("", "stop once a held-out evaluation reaches this, e.g. mae_curve<=0.01 or accuracy>=0.99"),
    "resume": (False, "continue the run in --out_dir from its ckpt.pt"),
    "overwrite": (False, "replace the run in --out_dir (its ckpt.pt, snapshots, results.json and eval.json)"),
    "eval_only": (False, "evaluate the checkpoint in --out_dir and write eval.json"),
}
CHOICES = {"device": None, "dtype": ("auto", "float32", "bfloat16"), "optimizer": ("adamw", "muon"),
           "ckpt_schedule": ("last", "eval", "log"), "data_device": ("auto", "cpu", "device")}
RESUMABLE = ("out_dir", "device", "dtype", "compile", "max_iters", "stop_at", "log_interval", "eval_interval",
             "eval_samples", "eval_samples_during", "eval_K", "ckpt_schedule")  # may change on --resume/--eval_only


# -----------------------------------------------------------------------------
# command line


class Parser(argparse.ArgumentParser):
    """One-line errors (exit code 2) with a did-you-mean hint, instead of the usage block."""
    elsewhere = {}  # flag -> the tasks/models that have it, for a flag of another task or model

    def error(self, message):
        m = re.search(r"unrecognized arguments: (\S+)", message)
        if m:
            flag = m.group(1).split("=")[0]
            known = [o for a in self._actions for o in a.option_strings]
            close = difflib.get_close_matches(flag, known, n=3)
            if flag in self.elsewhere:
                message += f" ({flag} is an option of {self.elsewhere[flag]} only)"
            else:
                message += f" (did you mean {' / '.join(close)}?)" if close else " (see --help for the valid flags)"
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(join_negative(sys.argv[1:] if args is None else args), namespace)


def join_negative(argv):
    """'--lr -1e-3' -> '--lr=-1e-3': argparse reads a negative number in exponent form as a flag."""
    out = []
    for a in argv:
        if out and re.fullmatch(r"--\w+", out[-1]) and re.fullmatch(r"-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?|-inf", a, re.I):
            out[-1] += "=" + a
        else:
            out.append(a)
    return out


def str2bool(s):
    if isinstance(s, bool) or s.lower() in ("1", "true", "yes"):
        return True if isinstance(s, str) else s
    if s.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def field_help(cls):
    """The one-line comment after each dataclass field, for --help."""
    src = inspect.getsource(cls)
    return dict(re.findall(r"^\s+(\w+): [^#\n]*#\s*(.*)$", src, re.M))


def add_flag(group, name, default, help, ftype=None):
    ftype = ftype or type(default)
    if ftype is bool:
        group.add_argument(f"--{name}", type=str2bool, nargs="?", const=True, default=None, help=f"{help} (default {default})")
    elif ftype is list:
        group.add_argument(f"--{name}", type=int, nargs="*", default=None, help=f"{help} (default {default})")
    else:
        group.add_argument(f"--{name}", type=ftype, default=None, choices=CHOICES.get(name), help=f"{help} (default {default})")


def parse_args(argv):
    pre = Parser(prog="train.py", add_help=False, allow_abbrev=False)
    pre.add_argument("--task", choices=list(TASKS), help="(default recall)")
    pre.add_argument("--model", choices=list(MODELS), help="(default transformer)")
    pre.add_argument("--preset", choices=[p for p in PRESETS if p != "tiny"], help="(default quick)")
    known, _ = pre.parse_known_args(argv)
    known.explicit = {k: v for k, v in vars(known).items() if v is not None}  # checked against a checkpoint's
    for k, v in dict(task="recall", model="transformer", preset="quick").items():
        setattr(known, k, getattr(known, k) or v)
    p = Parser(prog="train.py", description=__doc__.split("\n\n")[0].strip(), parents=[pre], allow_abbrev=False,
               epilog="Task and model flags depend on --task and --model: see `--task hmm --help`.")
    owners = {}
    for kind, table in (("task", TASKS), ("model", {k: c for k, (c, _) in MODELS.items()})):
        for name, cls in table.items():
            for f in fields(cls):
                if f.name not in IO_FIELDS:
                    owners.setdefault(f"--{f.name}", []).append(f"--{kind} {name}")
    p.elsewhere = {k: ", ".join(v) for k, v in owners.items()}
    g = p.add_argument_group("training")
    for name, (default, help) in TRAIN.items():
        add_flag(g, name, default, help)
    for title, cls in ((f"task {known.task}", TASKS[known.task]), (f"model {known.model}", MODELS[known.model][0])):
        g, helps = p.add_argument_group(title), field_help(cls)
        for f in fields(cls):
            if f.name not in IO_FIELDS:
                add_flag(g, f.name, f.default, helps.get(f.name, ""), f.type)
    args = p.parse_args(argv)
    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("task", "model", "preset")}
    return known, given, p


def build_config(task, model, preset, given):
    """defaults < preset < flags, split into train / task / model dicts."""
    ps = PRESETS[preset].get(task, {})
    task_names = {f.name for f in fields(TASKS[task])}
    model_names = {f.name for f in fields(MODELS[model][0])}
    task_opts, model_opts = dict(ps.get("task", {})), dict(ps.get(model, {}))
    # a model's own training settings (e.g. its optimizer) sit in its preset entry, over the task's
    train = {k: d for k, (d, _) in TRAIN.items()} | ps.get("train", {}) | model_opts.pop("train", {})
    for k, v in given.items():
        (task_opts if k in task_names else model_opts if k in model_names else train)[k] = v
    train["out_dir"] = train["out_dir"] or os.path.join("out", f"{task}_{model}")
    train["lr_decay_iters"] = train["lr_decay_iters"] or train["max_iters"]  # fixed now, so --resume keeps it
    return dict(task=task, model=model, preset=preset, train=train, task_opts=task_opts, model_opts=model_opts)

# -----------------------------------------------------------------------------
# model, optimizer, checkpoints


def build(cfg, device):
    """Tasks (training + evaluation lengths), model and optimizer from a config."""
    train = cfg["train"]
    for k in ("batch_size", "log_interval", "eval_interval", "eval_samples", "eval_samples_during"):
        if train[k] < 1:
            raise ValueError(f"--{k} must be >= 1, got {train[k]}")
    if train["max_iters"] < 0 or train["data_chunk"] < 0:
        raise ValueError(f"--max_iters and --data_chunk must be >= 0, "
                         f"got {train['max_iters']} and {train['data_chunk']}")
    check_recipe(train)
    task = make_task(cfg["task"], **cfg["task_opts"])
    eval_tasks = {"default": task}
    for K in train["eval_K"]:
        if "K" not in cfg["task_opts"] | task.options():
            raise ValueError(f"--eval_K needs a task with a K option (hmm, regression), not {cfg['task']!r}")
        eval_tasks[f"K{K}"] = make_task(cfg["task"], **(cfg["task_opts"] | {"K": K}))
    Config, Model = MODELS[cfg["model"]]
    io = dict(vocab_size=task.vocab_size, n_features=task.n_features, n_classes=task.n_classes,
              answer_offset=task.answer_offset, gaussian=task.gaussian)
    longest = max(t.seq_len for t in eval_tasks.values())
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
        """Each optimizer's state from the checkpoint, keeping its own kernel (fused on CUDA, see make_optimizer):
        the checkpoint's flags would replace it, e.g. run a CPU-trained run's unfused loop on the GPU it resumes on."""
        states = [states] if isinstance(states, dict) else states  # checkpoints from before --optimizer
        if len(states) != len(self.opts):
            raise ValueError(f"the checkpoint holds {len(states)} optimizer states, this run has {len(self.opts)}")
        kernel = ("fused", "foreach", "capturable")
        for o, state in zip(self.opts, states):
            groups = [g | {k: new[k] for k in kernel if k in new}
                      for g, new in zip(state["param_groups"], o.param_groups)]
            o.load_state_dict(state | {"param_groups": groups})


def make_optimizer(model, train, device):
    """AdamW with decoupled weight decay on matrices and embeddings, or (--optimizer muon) Muon on the
    2-D weights of the hidden layers and AdamW on embeddings, read-ins, heads, gains and biases. Muon's
    update is rescaled to AdamW's RMS (Moonshot's rule), so both take the same --lr and schedule."""
    named = list(model.named_parameters())
    hidden = lambda n, p: train["optimizer"] == "muon" and p.dim() == 2 and n.startswith(("blocks.", "layers."))
    decays = lambda p: p.dim() >= 2 and not getattr(p, "_no_weight_decay", False)
    rest = [p for n, p in named if not hidden(n, p)]
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
    muon = torch.optim.Muon([p for n, p in named if hidden(n, p)], lr=train["lr"],
                            weight_decay=train["weight_decay"], adjust_lr_fn="match_rms_adamw")
    return Optimizers(adamw, muon)


def check_recipe(train):
    """Optimiser settings that would train silently on nonsense (a negative rate, say) are refused."""
    rules = dict(lr=(lambda x: x > 0, "> 0"), min_lr_ratio=(lambda x: 0 <= x <= 1, "in [0, 1]"),
                 weight_decay=(lambda x: x >= 0, ">= 0"), beta1=(lambda x: 0 <= x < 1, "in [0, 1)"),
                 beta2=(lambda x: 0 <= x < 1, "in [0, 1)"), grad_clip=(lambda x: x >= 0, ">= 0 (0 = off)"),
                 warmup_iters=(lambda x: x >= 0, ">= 0"), lr_decay_iters=(lambda x: x >= 0, ">= 0 (0 = --max_iters)"))
    for k, (ok, want) in rules.items():
        if not math.isfinite(train[k]):
            raise ValueError(f"--{k} must be a finite number, got {train[k]}")
        if not ok(train[k]):
            raise ValueError(f"--{k} must be {want}, got {train[k]}")


def get_lr(it, train):
    """Linear warmup to --lr, cosine down to min_lr_ratio * lr at lr_decay_iters, then flat."""
    w, T = train["warmup_iters"], train["lr_decay_iters"] or train["max_iters"]
    if it < w:
        return train["lr"] * (it + 1) / (w + 1)
    decay = 0.5 * (1 + math.cos(math.pi * min(1.0, (it - w) / max(1, T - w))))
    return train["lr"] * (train["min_lr_ratio"] + (1 - train["min_lr_ratio"]) * decay)


def load_checkpoint(path):
    if not os.path.exists(path):
        raise ValueError(f"no checkpoint at {path} (train first, or pass the run's --out_dir)")
    # one message for every failure: torch's own would suggest weights_only=False, which runs the file's code
    bad = ValueError(f"{path}: not a readable train.py checkpoint (truncated or corrupt?)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # truncated, not a torch file, or something that would need to run code
        raise bad from None
    if not (isinstance(state, dict) and {"config", "model", "model_config", "iter"} <= set(state)):
        raise bad
    return state


def write_file(path, write):
    """write(tmp) to a temporary name beside path, then rename it over path: a crash, Ctrl-C or full disk
    mid-write leaves the previous file whole and no partial file behind."""
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


def save_checkpoint(path, state):
    write_file(path, lambda tmp: torch.save(state, tmp))


def check_out_dir(path, flag="--out_dir"):
    """Before any work: say in one line why files cannot be written under path (creates nothing)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):  # the folder that would hold the new ones
        p = os.path.dirname(p)
    if not os.path.isdir(p):
        raise ValueError(f"{flag} {path}: cannot write there ({p} is a file)")
    if not os.access(p, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: cannot write there ({p} is not writable)")


def check_device(name):
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", name):
        raise ValueError(f"--device {name!r}: expected auto, cpu, cuda, cuda:N or mps")


def run_files(out_dir):
    """What a run writes to its folder: another run there would mix with it."""
    names = [os.path.join(out_dir, f) for f in ("ckpt.pt", "results.json", "eval.json")]
    return [p for p in names if os.path.exists(p)] + sorted(glob.glob(os.path.join(out_dir, "ckpt_*.pt")))


def code_version():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=here, capture_output=True, text=True, timeout=5).stdout.strip()
        rev = run("rev-parse", "--short", "HEAD")
        return (rev + ("-dirty" if run("status", "--porcelain", "--untracked-files=no") else "")) if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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
    """(bf16 or not, the context the forward passes run in): bf16 autocast on CUDA unless asked otherwise.
    auto takes bf16 only where the GPU has it natively (Ampere on): T4 and V100 emulate it, slower than float32."""
    use_bf16 = dtype == "bfloat16" or (dtype == "auto" and device.type == "cuda"
                                       and torch.cuda.is_bf16_supported(including_emulation=False))
    return use_bf16, torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()


def data_source(train, device):
    """(generator, chunk): the training batches are drawn on the generator's device, `chunk` batches
    per sampler call. On a GPU a draw is a few hundred tiny kernels whatever the batch size, so one
    call per 16 steps makes it a small share of a step, and nothing crosses from the host."""
    on_gpu = train["data_device"] == "device" or train["data_device"] == "auto" and device.type == "cuda"
    dev = device if on_gpu else torch.device("cpu")
    return torch.Generator(device=dev).manual_seed(train["seed"]), train["data_chunk"] or (16 if dev.type == "cuda" else 1)


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


def log_spaced(n):
    """Steps 1, 2, 3, 6, 10, 18, 32, 56, 100, ... (four per decade) up to n."""
    return sorted({round(10 ** (i / 4)) for i in range(int(4 * math.log10(max(n, 1))) + 1)})


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
    compiles again at each new mode (training, evaluation), batch size and length, and builds the backward
    graph only at the first backward, so a failure can come long after the first call: the forward's are
    caught here, the backward's by the training step, through fail()."""

    def __init__(self, net, compile, print=print):
        self.net, self.fn, self.print = net, net, print
        if compile:
            # a fresh cache per run: in a sweep in one process (reproduce.py, bench.py time_to_target) the runs
            # before would use up dynamo's recompile limit, and the later runs would run eager without a word
            torch._dynamo.reset()
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
        except Exception as e:  # no compiler toolchain, an unsupported op, ...
            if not self.fail(e):
                raise
            return self.fn(x)

    def __getattr__(self, name):  # eval(), train(), ...: net's
        return getattr(self.net, name)


def global_mean(x, world):
    """x averaged over the data-parallel processes, as a float (the global batch's loss); every rank calls it."""
    x = x.detach().clone()  # all_reduce works in place
    if world > 1:
        dist.all_reduce(x)
    return x.item() / world

# -----------------------------------------------------------------------------
# evaluation and training


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


def parse_stop(spec, task):
    """'metric<=x' or 'metric>=x' -> a test of an evaluation's metrics; '' -> None."""
    if not spec:
        return None
    m = re.fullmatch(r"(mae_curve|mae_token|kl|accuracy)(<=|>=)([0-9.eE+-]+)", spec.replace(" ", ""))
    try:
        x = float(m.group(3)) if m else None
    except ValueError:
        x = None
    if x is None:
        raise ValueError(f"--stop_at {spec!r}: expected METRIC<=X or METRIC>=X with METRIC one of "
                         "mae_curve, mae_token, kl, accuracy")
    name, op = m.group(1), m.group(2)
    if name == "accuracy" and task.gaussian:
        raise ValueError(f"--stop_at {spec!r}: {task.name} has no accuracy; use mae_curve, mae_token or kl")
    return lambda r: name in r and (r[name] <= x if op == "<=" else r[name] >= x)


def summary(r):
    s = f"mae_curve {r['mae_curve']:.4f} | mae_token {r['mae_token']:.4f} | kl {r['kl']:.4f}"
    return s + (f" | acc {r['accuracy']:.4f} (bayes {r['oracle_accuracy']:.4f})" if "accuracy" in r else "")


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


def is_oom(e):
    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or \
        isinstance(e, RuntimeError) and re.search(r"out of memory|can't allocate memory", str(e)) is not None


def run(cfg, resume_state=None, eval_only=False):
    train = cfg["train"]
    check_device(train["device"])
    device = pick_device(train["device"], int(os.environ.get("LOCAL_RANK", 0)) if "WORLD_SIZE" in os.environ else None)
    rank, world = init_distributed(train, device)
    out_dir = new = os.path.abspath(train["out_dir"])
    while not os.path.exists(os.path.dirname(new)):  # the outermost folder this run will create
        new = os.path.dirname(new)
    # what a fault leaves behind, kept up to date by the loop for the one line that reports it
    kept = f"{os.path.join(train['out_dir'], 'ckpt.pt')} (step {resume_state['iter']})" if resume_state else None
    progress = dict(step=resume_state["iter"] if resume_state else 0, created=None if os.path.exists(new) else new,
                    kept=kept)
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
        kept = f"kept {progress['kept']}" if progress["kept"] else "no checkpoint was saved"
        p = out_dir  # a run that left nothing leaves no empty folders either
        while progress["created"] and p.startswith(progress["created"]) and os.path.isdir(p) and not os.listdir(p):
            os.rmdir(p)
            p = os.path.dirname(p)
        if rank == 0:
            builtins.print(f"train.py: error: {what} at step {progress['step']}; {kept}", file=sys.stderr)
        if isinstance(e, KeyboardInterrupt):  # a caller's sweep stops too; cli() makes it exit code 2
            e.reported_to = sys.stderr  # a sweep that sent it to a log file still says it on the console
            raise
        return 2
    finally:
        if world > 1:
            dist.destroy_process_group()


def train_loop(cfg, device, rank, world, resume_state, eval_only, progress):
    train, master = cfg["train"], rank == 0
    print = builtins.print if master else (lambda *a, **k: None)  # rank 0 speaks for the run
    torch.manual_seed(train["seed"])
    task, eval_tasks, model, opt, model_config = build(cfg, device)
    stop = parse_stop(train["stop_at"], task)
    use_bf16, ctx = autocast(train["dtype"], device)
    out_dir = train["out_dir"]
    check_out_dir(out_dir)
    if resume_state is None and not train["overwrite"] and os.path.isdir(out_dir) and run_files(out_dir):
        raise ValueError(f"{out_dir} already holds a run: --resume to continue it, --overwrite to replace it "
                         f"(and its snapshots), or another --out_dir")
    os.makedirs(out_dir, exist_ok=True)
    for tmp in glob.glob(os.path.join(out_dir, "*.tmp")) if master else []:
        os.remove(tmp)  # left by a write that was killed (kill -9): the file it was replacing is whole
    if train["overwrite"] and resume_state is None and master:  # asked for: the old run's files go, snapshots too
        for f in ["ckpt.pt", "results.json", "eval.json"] + [os.path.basename(p) for p in run_files(out_dir)]:
            with suppress(FileNotFoundError):
                os.remove(os.path.join(out_dir, f))
    it, elapsed, history = 0, 0.0, []
    gen, n_chunk = data_source(train, device)
    chunk = chunk_state = None  # the batches drawn together, and the generator state before them
    if resume_state is not None:
        model.load_state_dict(resume_state["model"])
        opt.load_state_dict(resume_state["optimizer"])
        set_rng_state(resume_state, device)
        it, elapsed, history = resume_state["iter"], resume_state["elapsed"], resume_state["history"]
        try:
            gen.set_state(resume_state["gen_state"])
        except (RuntimeError, ValueError):  # a generator state from another kind of device (e.g. a GPU run resumed on a CPU)
            print("the checkpoint's batch generator was on another device: reseeding, the batches will differ "
                  "from an uninterrupted run's")
            gen.manual_seed(train["seed"] + it)
    # buffers are constants (position tables, masks): nothing to broadcast, and rank 0 evaluates alone
    net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False) if world > 1 else model
    fwd = CompiledOrEager(net, train["compile"], print)
    eval_fwd = model if world > 1 else fwd  # the bare model: no gradient hooks, no collectives
    n_params = model.num_params()
    print(f"{cfg['task']} x {cfg['model']} | {n_params:,} params | device {device}{' bf16' if use_bf16 else ''} | out {out_dir}")

    def next_batch():
        """The global batch of step `it`: slice it % n_chunk of the chunk being used."""
        nonlocal chunk, chunk_state
        k, B = it % n_chunk, train["batch_size"]
        if k == 0 or chunk is None:  # None: resumed mid-chunk, with gen back at the chunk's start
            chunk_state = gen.get_state()
            chunk = task.sample(B * n_chunk, gen)
        return chunk.map(lambda t: t[k * B:(k + 1) * B]) if n_chunk > 1 else chunk

    def step(batch):  # forward and backward
        with ctx:
            out = fwd(batch.x)
            loss = task.loss(out, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        return out, loss

    def state():  # the generator state saved is the one that redraws the next step's batch
        gen_state = gen.get_state() if it % n_chunk == 0 else chunk_state
        return dict(model=model.state_dict(), optimizer=opt.state_dict(), gen_state=gen_state,
                    **rng_state(device), iter=it, elapsed=elapsed + time.time() - t_start,
                    history=history, config=cfg, model_config=model_config)

    t_start = time.time()
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    last_good = lambda: progress["kept"] or "none was saved yet"
    snapshots = set(log_spaced(train["max_iters"])) if train["ckpt_schedule"] == "log" else set()
    t_log, it_log = time.time(), it
    while it < train["max_iters"] and not eval_only:
        # warmup, then cosine from lr down to min_lr_ratio * lr
        T, lr = train["max_iters"], get_lr(it, train)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = next_batch()  # every rank draws the same global batch...
        if world > 1:  # ...and trains on its slice
            per = train["batch_size"] // world
            batch = batch.map(lambda t: t[rank * per:(rank + 1) * per])
        if batch.x.device.type == "cpu" and device.type == "cuda":
            # from pinned memory the copy to a GPU is asynchronous; from pageable memory it would wait for the GPU
            batch = batch.map(lambda t: t.pin_memory().to(device, non_blocking=True), latent=False)
        batch = batch.to(device, latent=False)  # the oracle's float64 latents stay on the CPU: MPS has no float64
        try:
            out, loss = step(batch)
        except Exception as e:  # the compiled backward graph is only built, and may fail, at the first backward
            if not fwd.fail(e):
                raise
            out, loss = step(batch)
        if train["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
        opt.step()
        it += 1
        progress["step"] = it
        at_log = it % train["log_interval"] == 0 or it == T
        at_eval = it % train["eval_interval"] == 0 or it == T
        if at_log or at_eval:  # the only host sync between log lines
            lossf = global_mean(loss, world)  # the same on every rank, so all stop together on a NaN
        if at_log:
            if not math.isfinite(lossf):
                print(f"loss is {lossf} at step {it}: stopping; last good checkpoint: {last_good()}", file=sys.stderr)
                return 1
            m = Metrics()
            m.update(task, batch.to("cpu"), out.float())
            dt = time.time() - t_log
            tok_s = (it - it_log) * train["batch_size"] * task.seq_len / dt
            eta = (T - it) * dt / (it - it_log)
            print(f"step {it:>6}/{T} | loss {lossf:.4f} | mae {m.result(task)['mae_token']:.4f} bits (batch) "
                  f"| {tok_s / 1e3:.1f}k tok/s | lr {lr:.2e} | eta {fmt_time(eta)}")
            t_log, it_log = time.time(), it
        if not (at_eval or it in snapshots):
            continue
        verdict = 0  # rank 0's: 0 go on, 1 the --stop_at target is reached, 2 parameters or metrics are not finite
        finite = master and all(torch.isfinite(p).all() for p in model.parameters())
        r = evaluate(eval_fwd, task, train["eval_samples_during"], train["eval_seed"], device, ctx) \
            if finite and at_eval else None
        if master and not (finite and (r is None or all(math.isfinite(v) for v in r.values() if isinstance(v, float)))):
            what = "parameters are" if r is None else "held-out metrics are"
            print(f"{what} not finite at step {it}: stopping; last good checkpoint: {last_good()}", file=sys.stderr)
            verdict = 2
        elif master:
            if at_eval:
                history.append(dict(iter=it, loss=lossf, time=elapsed + time.time() - t_start,
                                    **{k: v for k, v in r.items() if not isinstance(v, list)}))
                print(f"eval step {it}: {summary(r)}")
                save_checkpoint(ckpt_path, state())
                progress["kept"] = f"{ckpt_path} (step {it})"  # finite parameters and metrics: a good one
                verdict = int(stop is not None and stop(r))
            if train["ckpt_schedule"] == "eval" and at_eval or it in snapshots:
                save_checkpoint(os.path.join(out_dir, f"ckpt_{it:07d}.pt"), state())
            t_log, it_log = time.time(), it  # progress rates exclude evaluation time
        if world > 1:  # every rank follows rank 0's verdict
            flag = torch.tensor([verdict], device=device)
            dist.broadcast(flag, 0)
            verdict = int(flag.item())
        if verdict == 2:
            return 1
        if verdict == 1:
            print(f"reached {train['stop_at']} at step {it}: stopping")
            break

    if not master:
        return 0
    wall = elapsed + time.time() - t_start
    metrics = {}
    for name, t in eval_tasks.items():
        metrics[name] = evaluate(eval_fwd, t, train["eval_samples"], train["eval_seed"], device, ctx)
        print(f"final {name} ({train['eval_samples']} held-out sequences): {summary(metrics[name])}")
    results = dict(task=cfg["task"], model=cfg["model"], preset=cfg["preset"], config=cfg, model_config=model_config,
                   task_options=task.options(), n_params=n_params, iters=it, metrics=metrics, history=history,
                   wall_time_s=wall, device=str(device), seed=train["seed"], code_version=code_version(),
                   torch_version=torch.__version__)
    name = "eval.json" if eval_only else "results.json"
    write_json(os.path.join(out_dir, name), results)
    print(f"wrote {os.path.join(out_dir, name)} | wall time {fmt_time(wall)}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    known, given, parser = parse_args(argv)
    try:
        resume_state = None
        if given.get("resume") or given.get("eval_only"):
            if given.get("overwrite"):
                raise ValueError("--overwrite starts a new run; it cannot go with --resume or --eval_only")
            out_dir = given.get("out_dir") or os.path.join("out", f"{known.task}_{known.model}")
            resume_state = load_checkpoint(os.path.join(out_dir, "ckpt.pt"))
            cfg = resume_state["config"]
            for k, v in known.explicit.items():
                if cfg.get(k) != v:
                    raise ValueError(f"--{k} {v} differs from the checkpoint's ({cfg.get(k)}) in {out_dir}; "
                                     f"drop --{k}, or pass the --out_dir of a {v} run")
            cfg["train"] = {k: d for k, (d, _) in TRAIN.items()} | cfg["train"]  # settings added since: defaults
            cfg["train"]["lr_decay_iters"] = cfg["train"]["lr_decay_iters"] or cfg["train"]["max_iters"]  # its own
            mc = resume_state["model_config"]
            if "block_size" in mc and mc.get("pos", "learned") == "learned":  # the trained position table fixes it
                cfg["model_opts"]["block_size"] = mc["block_size"]
            else:  # no position table: any length
                cfg["model_opts"].pop("block_size", None)
            for k, v in given.items():
                if k in ("resume", "eval_only"):
                    continue
                if k not in RESUMABLE and v != {**cfg["train"], **cfg["task_opts"], **cfg["model_opts"]}.get(k, v):
                    raise ValueError(f"--{k} cannot change when resuming or evaluating a checkpoint; "
                                     f"changeable: {', '.join(RESUMABLE)}")
                if k in RESUMABLE:
                    cfg["train"][k] = v
            cfg["train"]["out_dir"] = out_dir
            return run(cfg, resume_state, eval_only=bool(given.get("eval_only")))
        return run(build_config(known.task, known.model, known.preset, given))
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
