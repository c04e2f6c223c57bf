"""
A run's settings, resolved once: defaults < the preset's entries for its task and model < flags, then every value
derived from them, fixed (nanoGPT's single config that shows a whole run). `resolve` returns the whole run (Run):
train.py, the sweeps and the diagnostics read that, and the run writes it beside its checkpoint (config.json);
`train.py ... --dry_run` prints it. `start` is train.py's: a new run, or a checkpoint's to resume.

- entries: the preset's entry of the task (or its "any task" entry, under the task's own `defaults`) and of the
  model: a built-in's by its name, a file's class named as a built-in's (a copied mamba.py) by that name, or the
  one --preset_model names; else the config's own defaults (said in the run's header line, never silently);
- derived once: the decay and curriculum horizons, the out dir, the tasks (each distinct task built once: the
  training task, each --eval_K length, the curriculum's stages), the model's whole config (the task's I/O fields, a
  block size that holds the longest sequence, the width --match_params asks for);
- refused in a line before anything is built: a value no run can take (check_train), a task from a file that
  breaks its contract or whose posterior fails the check against its own sampler (check_task);
- a resumed run is its checkpoint's settings, with only the RESUMABLE ones changed by flags; a checkpoint opens as
  a model again (load) only through the task and model it names, checked (load_checkpoint).
"""
from dataclasses import MISSING, dataclass, field, fields
import functools
import inspect
import math
import os
import re
import types
import typing

import torch

from checkpoints import fits, load_weights, read_checkpoint, set_aside_note
from commandline import Parser, is_spec, str2bool
from evaluation import during_seed
from oracles import Broken, check, failed
from presets import (CHOICES, HEADER_ROWS, MODELS, PRESETS, RESUMABLE, TRAIN, default_out_dir, fill_io, model_config,
                     model_spec, resolve_model)
from tasks import IO_FIELDS, TASKS, make_task, task_class

PICKS = ("task", "model", "preset", "preset_model")  # what a run is of: read first, they decide the other flags


@dataclass
class Run:
    """A run, every setting resolved: what its checkpoint records (config()) and what is built from it."""
    task: str  # --task: a built-in's name, or a file's PATH.py:Class with its path made absolute
    model: str  # --model, the same way
    preset: str
    entries: str  # the preset entries it took, for its header line
    train: dict  # the training settings, the derived ones fixed (out_dir, lr_decay_iters, curriculum_iters)
    task_opts: dict  # the task's options from the preset and the flags
    model_opts: dict  # the model's options from the preset and the flags
    model_config: dict  # the model's whole config: its options, the task's I/O fields, block size, matched width
    tasks: dict  # the tasks it evaluates: "default" (the one it trains on) and "K<n>" for each --eval_K
    curriculum: object  # Curriculum: the task of each training step
    Config: type = field(repr=False)
    Model: type = field(repr=False)
    n_params: int = 0  # the model's parameters
    files: dict = field(default_factory=dict)  # "task", "model": the file each comes from, where one does
    note: str = None  # the line the run says as it starts, where its curriculum outgrows it

    def __post_init__(self):  # what the run records of itself, fixed with it
        # ckpt.pt's and results.json's `config`
        self.record = dict(task=self.task, model=self.model, preset=self.preset, train=self.train,
                           task_opts=self.task_opts, model_opts=self.model_opts)
        # what --dry_run shows and config.json holds
        self.description = self.record | dict(entries=self.entries, model_config=self.model_config,
                                              n_params=self.n_params,
                                              tasks={k: t.options() for k, t in self.tasks.items()})


@functools.cache  # a task is built once however often its settings are read (the flags' help, the run, its model)
def built(spec, items):
    return make_task(spec, **dict(items))


def task_of(spec, opts):
    return built(spec, tuple(sorted(opts.items())))

# -----------------------------------------------------------------------------
# defaults < preset < flags


def entries(task, model, preset, preset_model=None, given=None):
    """(train, task options, model options, which entries) of a run, then the flags `given` (a dict) in their
    places. The task's entry is the preset's entry for it, else its "any task" entry under the task's own
    defaults."""
    ps = PRESETS[preset]
    own = ps.get(task)
    task_entry = own if own is not None else ps.get("any task", {})
    TaskCls, (Config, Model) = task_class(task), resolve_model(model)
    names = {f.name for f in fields(Config)}
    # a built-in's own name's entry; --preset_model's; a file's class named as a built-in's (a copied mamba.py's
    # Mamba: a fork keeps its row); else none (its config's defaults, or "any model")
    if model in MODELS:
        name, why = model, ""
    elif preset_model:
        name, why = preset_model, f" (--preset_model {preset_model})"
    else:
        same = [m for m, (_, M) in MODELS.items() if M.__name__ == Model.__name__]
        name, why = (same[0], f" (its class is {same[0]}'s name)") if same else (None, "")
    if name in task_entry:
        model_opts = dict(task_entry[name])
    else:  # a model without an entry (a file's): the sizes of "any model" (tiny) that its config has
        model_opts = {k: v for k, v in task_entry.get("any model", {}).items() if k in names}
    # a model's own training settings (e.g. its optimizer) sit in its entry, over the task's
    defaults = {} if own is not None else TaskCls.defaults
    train = {k: d for k, (d, _) in TRAIN.items()} | task_entry.get("train", {}) | defaults | model_opts.pop("train", {})
    task_opts = dict(task_entry.get("task", {})) if own is not None else {}
    task_names = {f.name for f in fields(TaskCls)}
    for k, v in (given or {}).items():  # a flag is the task's option, else the model's, else a training setting
        if k not in PICKS + ("dry_run",):
            (task_opts if k in task_names else model_opts if k in names else train)[k] = v
    where = f"{preset}: {task if own is not None else 'any task'}, "
    took = (f"{name}{why}" if name in task_entry else f"{'any model' if model_opts else 'none'} (its config's defaults"
            f"{', tiny sizes' if model_opts else ''}; --preset_model NAME takes a built-in's)")
    return train, task_opts, model_opts, where + took


def with_header_rows(task, model_opts):
    """model_opts with a preset's n_pos=HEADER_ROWS made the task's header length + 1: a learned row for each
    header token, one shared by every later position (0, a row per position, for a task without a header), so
    that the rows and the window's header follow --n_states and --n_obs."""
    if model_opts.get("n_pos") != HEADER_ROWS:
        return model_opts
    return model_opts | {"n_pos": getattr(task, "header_len", -1) + 1}


def resolve(known, given):
    """A new run: defaults < preset < flags, every derived value fixed (settle)."""
    train, task_opts, model_opts, took = entries(known.task, known.model, known.preset, known.preset_model, given)
    return settle(dict(task=known.task, model=known.model, preset=known.preset, train=train, task_opts=task_opts,
                       model_opts=model_opts), took)


def run_of(task, model, preset, given=None):
    """resolve() for a script's run: a task, model and preset and the flags given as a dict (values, not strings)."""
    known = types.SimpleNamespace(task=task, model=model, preset=preset, preset_model=(given or {}).get("preset_model"))
    return resolve(known, dict(given or {}))


def settle(cfg, took, saved=None):
    """The Run of cfg, its derived values fixed; saved: a checkpoint's model config, which the model is rebuilt
    from (its width is not matched again, its table not resized)."""
    train = cfg["train"]
    train["out_dir"] = train["out_dir"] or default_out_dir(cfg["task"], cfg["model"])
    train["lr_decay_iters"] = train["lr_decay_iters"] or train["max_iters"]  # fixed now, so --resume keeps it
    train["curriculum_iters"] = train["curriculum_iters"] or train["max_iters"] // 2  # so is the curriculum's
    check_train(train)  # before anything is built from them
    tasks, layout, longest = lengths(cfg["task"], cfg["task_opts"], train)
    task = tasks["default"]
    cfg["model_opts"] = with_header_rows(task, cfg["model_opts"])
    reference = train["match_params"] == -1 and with_header_rows(task, entries(cfg["task"], "transformer",
                                                                               cfg["preset"])[2])
    curriculum = Curriculum(cfg["task"], cfg["task_opts"], train, layout)
    whole, n_params = model_config(cfg["model"], task, cfg["model_opts"], longest, train["match_params"], reference,
                                   saved)
    Config, Model = resolve_model(cfg["model"])
    files = {k: cfg[k].rpartition(":")[0] for k in ("task", "model") if is_spec(cfg[k])}
    return Run(cfg["task"], cfg["model"], cfg["preset"], took, train, cfg["task_opts"], cfg["model_opts"], whole,
               tasks, curriculum, Config, Model, n_params, files, curriculum.note(train))


def lengths(spec, task_opts, train):
    """(the tasks a run evaluates: "default" and "K<n>" for each --eval_K, the layout it trains on, the longest
    sequence of them, which the model's context must hold: every key queried can be longer than the evaluation's)."""
    task = task_of(spec, task_opts)
    tasks = {"default": task}
    for K in train["eval_K"]:
        if "K" not in task.options():
            raise ValueError(f"--eval_K needs a task with a K option (hmm, regression), not {spec!r}")
        tasks[f"K{K}"] = task_of(spec, task_opts | {"K": K})
    if train["train_all_queries"] and spec != "recall":
        raise ValueError(f"--train_all_queries is an option of --task recall, not {spec!r}")
    layout = task.all_queries() if train["train_all_queries"] else task
    return tasks, layout, max(t.seq_len for t in [*tasks.values(), layout])

# -----------------------------------------------------------------------------
# a resumed run: its checkpoint's settings


def resumed(state, known, given, out_dir):
    """--resume / --eval_only: the checkpoint's run, with only the RESUMABLE settings changed by flags."""
    missing = [k for k in ("optimizer", "gen_state", "torch_rng", "elapsed", "history") if k not in state]
    if missing:
        raise ValueError(f"{os.path.join(out_dir, 'ckpt.pt')} has no {' or '.join(missing)}: train.py cannot "
                         f"{'resume' if given.get('resume') else 'evaluate'} it (a checkpoint it did not write?)")
    cfg = state["config"]
    for k, v in known.explicit.items():
        if cfg.get(k, v) != v:
            raise ValueError(f"--{k} {v} differs from the checkpoint's ({cfg.get(k)}) in {out_dir}; "
                             f"drop --{k}, or pass the --out_dir of a {v} run")
    cfg["train"] = {k: d for k, (d, _) in TRAIN.items()} | cfg["train"]  # settings added since: defaults
    for k, v in given.items():
        if k in ("resume", "eval_only") + PICKS:
            continue
        if k not in RESUMABLE and v != {**cfg["train"], **cfg["task_opts"], **cfg["model_opts"]}.get(k, v):
            raise ValueError(f"--{k} cannot change when resuming or evaluating a checkpoint; "
                             f"changeable: {', '.join(RESUMABLE)}")
        if k in RESUMABLE:
            cfg["train"][k] = v
    cfg["train"]["out_dir"] = out_dir
    if given.get("resume") and cfg["train"]["max_iters"] < state["iter"]:  # nothing to train: it would only evaluate
        raise ValueError(f"--max_iters {cfg['train']['max_iters']}: the checkpoint in {out_dir} is at step "
                         f"{state['iter']} already; pass a larger --max_iters to train on, or --eval_only to "
                         f"evaluate it")
    return settle(cfg, "the checkpoint's", saved=state["model_config"])


def start(known, given):
    """(the Run a command line asks for, the checkpoint it continues or None): a new run, or --resume and
    --eval_only's checkpoint in --out_dir with its flags."""
    if not (given.get("resume") or given.get("eval_only")):
        return resolve(known, given), None
    out_dir = given.get("out_dir") or default_out_dir(known.task, known.model)
    state = load_checkpoint(os.path.join(out_dir, "ckpt.pt"))
    return resumed(state, known, given, out_dir), state

# -----------------------------------------------------------------------------
# the values a run may take


def check_train(train):
    """Settings that would crash deep inside torch, or train silently on nonsense (a negative rate), are refused."""
    rules = dict(max_iters=(lambda x: x >= 0, ">= 0"),
                 lr=(lambda x: 0 < x <= 1e30, "in (0, 1e30] (beyond, AdamW's step leaves float32)"),
                 min_lr_ratio=(lambda x: 0 <= x <= 1, "in [0, 1]"), weight_decay=(lambda x: x >= 0, ">= 0"),
                 beta1=(lambda x: 0 <= x < 1, "in [0, 1)"), beta2=(lambda x: 0 <= x < 1, "in [0, 1)"),
                 grad_clip=(lambda x: x >= 0, ">= 0 (0 = off)"), warmup_iters=(lambda x: x >= 0, ">= 0"),
                 lr_decay_iters=(lambda x: x >= 0, ">= 0 (0 = --max_iters)"),
                 data_chunk=(lambda x: x >= 0, ">= 0 (0 = auto)"),
                 curriculum_iters=(lambda x: x >= 0, ">= 0 (0 = half of --max_iters)"),
                 curriculum_hold=(lambda x: x >= 0, ">= 0"), patience=(lambda x: x >= 0, ">= 0 (0 = off)"),
                 eval_batch_size=(lambda x: x >= 0, ">= 0 (0 = auto)"))
    rules |= {k: (lambda x: x >= 1, ">= 1") for k in
              ("batch_size", "log_interval", "eval_interval", "eval_samples", "eval_samples_during")}
    for k, (ok, want) in rules.items():
        if not math.isfinite(train[k]):
            raise ValueError(f"--{k} must be a finite number, got {train[k]}")
        if not ok(train[k]):
            raise ValueError(f"--{k} must be {want}, got {train[k]}")
    for k in ("seed", "eval_seed"):  # torch's generators take seeds below 2**64; a run adds steps to them
        if not 0 <= train[k] < 2 ** 63:
            raise ValueError(f"--{k} must be an integer in [0, 2**63), got {train[k]}")
    if not -1 <= train["eval_seed_during"] < 2 ** 63 or during_seed(train) == train["eval_seed"]:
        raise ValueError(f"--eval_seed_during must be -1 (--eval_seed + 1) or a seed other than --eval_seed "
                         f"({train['eval_seed']}) in [0, 2**63), got {train['eval_seed_during']}")
    check_device(train["device"])


def check_device(name):
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", name):
        raise ValueError(f"--device {name!r}: expected auto, cpu, cuda, cuda:N or mps")


def check_task(run, n_seq=1000, pairs=8):
    """A new run's task from a file: its contract and a short form of its posterior's check against its own sampler
    (oracles.check, n_seq sequences), refused in one line where either fails; the built-ins' pass it (a test)."""
    if "task" not in run.files or os.environ.get("RANK", "0") != "0":
        return
    try:
        why = failed(check(run.tasks["default"], n_seq=n_seq, pairs=pairs, say=lambda line: None))
    except Broken as e:
        raise ValueError(f"--task {run.task} breaks the task contract (README, \"Bring your own task\"): {e}") from None
    if why:
        raise ValueError(f"--task {run.task}: its posterior fails the check: {why}; `python oracles.py check "
                         f"{run.task}` runs the whole check")
    print(f"posterior check of {run.tasks['default'].name} ({n_seq:,} sequences of its sampler, oracles.check): holds")


# -----------------------------------------------------------------------------
# a curriculum: a task option grown while training (--curriculum NAME=START, Garg et al. 2022)


class Curriculum:
    """The task of each training step: the layout it trains on, or under --curriculum NAME=START the option at
    START for --curriculum_hold steps, then grown one integer stage at a time, in equal steps, to the task's own
    value at --curriculum_iters. Every stage is built and checked at once (the task refuses it, or it changes the
    model's inputs or outputs)."""

    def __init__(self, spec, task_opts, train, layout):
        self.layout, self.start = layout, None
        if not train["curriculum"]:
            if train["curriculum_hold"]:
                raise ValueError(f"--curriculum_hold {train['curriculum_hold']} needs a --curriculum to hold")
            return
        task, c = task_of(spec, task_opts), train["curriculum"]
        m = re.fullmatch(r"(\w+)=(\d+)", c.replace(" ", ""))
        options = [f.name for f in fields(task) if type(getattr(task, f.name)) is int]
        if m is None or m.group(1) not in options:
            raise ValueError(f"--curriculum {c!r}: expected NAME=START with NAME an integer option of {task.name}: "
                             f"{', '.join(options)}")
        name, start, end = m.group(1), int(m.group(2)), getattr(task, m.group(1))
        if not 1 <= start <= end:
            raise ValueError(f"--curriculum {c!r}: START must be in [1, {end}] ({task.name}'s {name})")
        # a stage: the task at that value (every key queried: the layout grown with it, n_queries following n_pairs)
        stage = (lambda v: task.all_queries(**{name: v})) if train["train_all_queries"] else \
            (lambda v: task_of(spec, task_opts | {name: v}))
        io, self.stages = (lambda t: [getattr(t, k, None) for k in IO_FIELDS]), {end: layout}
        for value in range(start, end):
            try:
                self.stages[value] = stage(value)
            except ValueError as e:
                which = "its first stage" if value == start else f"the stage {name}={value}"
                raise ValueError(f"--curriculum {c!r}: the task refuses {which}: {e}") from None
            if io(self.stages[value]) != io(task):
                raise ValueError(f"--curriculum {c!r}: {name} changes the model's inputs or outputs; grow an option "
                                 f"that only changes the sequences")
        self.name, self.start, self.end = name, start, end
        self.iters, self.hold = train["curriculum_iters"], train["curriculum_hold"]
        if self.hold >= self.iters:
            raise ValueError(f"--curriculum_hold {self.hold} must be below --curriculum_iters ({self.iters}), the "
                             f"step from which {name} is the task's own")

    def __call__(self, it):
        """The task of training step it: after the hold, end - start + 1 stages of equal length."""
        if self.start is None or it >= self.iters:
            return self.layout
        grown = (self.end - self.start + 1) * max(it - self.hold, 0) // (self.iters - self.hold)
        return self.stages[self.start + grown]

    def tokens(self, a, b):
        """The tokens a sequence holds summed over steps a..b - 1 (the ETA's unit), at each stage's length: in
        closed form over the stages, not step by step (--max_iters 10**23)."""
        if self.start is None or a >= self.iters:
            return (b - a) * self.layout.seq_len
        cuts = [a] + [s for s in self.bounds() if a < s < b] + [b]
        return sum((y - x) * self(x).seq_len for x, y in zip(cuts, cuts[1:]))

    def bounds(self):  # the first step of each stage, and the step from which the task is its own
        n, span = self.end - self.start + 1, self.iters - self.hold
        return sorted({self.hold + -(-k * span // n) for k in range(1, n)} | {self.iters})

    def note(self, train):
        """The line a run says as it starts whose curriculum is still growing when it ends: it never trains on the
        task's own size. None where it reaches it, where nothing trains (--max_iters 0), and where
        --lr_decay_iters reaches the curriculum's end (a run to be resumed further)."""
        T = train["max_iters"]
        if self.start is None or not 0 < T < self.iters or train["lr_decay_iters"] >= self.iters:
            return None
        return (f"train.py: note: --curriculum {train['curriculum']} grows {self.name} until step {self.iters} "
                f"(--curriculum_iters), past the run's {T} steps (--max_iters): the run ends before the task is its "
                f"own size; lower --curriculum_iters, or set --lr_decay_iters to the steps you will --resume to")

# -----------------------------------------------------------------------------
# train.py's command line: a flag for every setting, its help ending with the value this run takes


def parse_args(argv, doc=""):
    """(--task/--model/--preset/--preset_model, the flags given, the parser). doc: the docstring whose first
    paragraph --help shows; each flag's help ends with its value for the chosen task, model and preset."""
    pre = Parser(prog="train.py", add_help=False, allow_abbrev=False)
    pre.add_argument("--task", help=f"{' | '.join(TASKS)} | PATH.py:Class | module:Class (default recall)")
    pre.add_argument("--model", help=f"{' | '.join(MODELS)} | PATH.py:Class | module:Class (default transformer)")
    pre.add_argument("--preset", choices=list(PRESETS), help="(default quick)")
    pre.add_argument("--preset_model", choices=list(MODELS), help="take this built-in model's preset entries (a "
                     "model from a file whose class has a built-in's name takes that one's; else its config's "
                     "defaults)")
    pre.add_argument("--dry_run", action="store_true", help="print the whole resolved run (every setting, the model's "
                     "config, its parameters) and exit")
    known, _ = pre.parse_known_args(argv)
    for flag, spec_of in (("task", task_spec), ("model", model_spec)):
        try:
            setattr(known, flag, getattr(known, flag) and spec_of(getattr(known, flag)))
        except ValueError as e:
            pre.error(f"--{flag} {e}")
    known.explicit = {k: v for k, v in vars(known).items() if v is not None and k in ("task", "model", "preset")}
    for k, v in dict(task="recall", model="transformer", preset="quick").items():
        setattr(known, k, getattr(known, k) or v)
    if known.task not in PRESETS[known.preset] and any(known.task in p for p in PRESETS.values()):  # authors: bijection
        pre.error(f"--preset {known.preset} has no --task {known.task}; it has "
                  f"{', '.join(t for t in PRESETS[known.preset] if t != 'any task')}")
    p = Parser(prog="train.py", description=doc.strip().split("\n\n")[0], parents=[pre], allow_abbrev=False,
               epilog="Task and model flags depend on --task and --model: see `--task hmm --help`.")
    TaskCls, (Config, _) = task_class(known.task), resolve_model(known.model)
    p.elsewhere = elsewhere()
    train, task_opts, model_opts, _ = entries(known.task, known.model, known.preset, known.preset_model)
    try:  # the values this run takes without flags: the task's (derived ones too), the model's context
        tasks, _, longest = lengths(known.task, task_opts, train)
        task_opts, model_opts = tasks["default"].options(), with_header_rows(tasks["default"], model_opts)
        model_opts.setdefault("block_size", longest)
    except (ValueError, TypeError):  # the task refuses its options (flags may mend that: resolve says why)
        pass
    train["out_dir"] = train["out_dir"] or default_out_dir(known.task, known.model)
    clash(p, known, Config, TaskCls)
    g = p.add_argument_group("training")
    for name, (_, help) in TRAIN.items():
        add_flag(g, name, train[name], help)
    for title, cls, opts in ((f"task {known.task}", TaskCls, task_opts), (f"model {known.model}", Config, model_opts)):
        g, helps = p.add_argument_group(title), field_help(cls)
        for f in fields(cls):
            if f.name not in IO_FIELDS:
                has = f.default is not MISSING or f.default_factory is not MISSING or f.name in opts
                add_flag(g, f.name, opts.get(f.name, f.default), helps.get(f.name, ""), f.type, required=not has)
    args = p.parse_args(argv)
    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("task", "model", "preset", "dry_run")}
    given |= {"dry_run": True} if args.dry_run else {}
    if given.get("overwrite") and (given.get("resume") or given.get("eval_only")):
        p.error("--overwrite starts a new run; it cannot go with --resume or --eval_only")
    return known, given, p


def task_spec(spec):
    """--task as a run records it, checked: a file's path made absolute, so that --resume finds it from anywhere."""
    task_class(spec)
    where, _, name = spec.rpartition(":")
    return f"{os.path.abspath(where)}:{name}" if is_spec(spec) and where.endswith(".py") else spec


def elsewhere():
    """--flag -> the built-in tasks and models that have it, for the hint on a flag of another task or model."""
    owners = {}
    for kind, table in (("task", TASKS), ("model", {k: c for k, (c, _) in MODELS.items()})):
        for name, cls in table.items():
            for f in fields(cls):
                if f.name not in IO_FIELDS:
                    owners.setdefault(f"--{f.name}", []).append(f"--{kind} {name}")
    return {k: ", ".join(v) for k, v in owners.items()}


def clash(p, known, Config, TaskCls):
    """A config field of one's own that is also a flag (a training setting, a pick, or a task option) is refused
    naming both: one flag cannot set two things."""
    taken = {**{k: "a training setting" for k in TRAIN}, **{k: "a flag of train.py" for k in PICKS + ("dry_run",)},
             **{f.name: f"an option of --task {known.task}" for f in fields(TaskCls)}}
    for cls, what in ((TaskCls, f"--task {known.task}"), (Config, f"--model {known.model}")):
        for f in fields(cls):
            other = taken.get(f.name) if cls is Config or f.name in TRAIN or f.name in PICKS else None
            if f.name not in IO_FIELDS and other:
                p.error(f"{what}: its config field {f.name!r} is also {other} (--{f.name}); rename the field")


@functools.cache  # inspect parses the class's whole file
def field_help(cls):
    """The one-line comment after each dataclass field, for --help ({} for a class without a source file)."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    return dict(re.findall(r"^\s+(\w+): [^#\n]*#\s*(.*)$", src, re.M))


def add_flag(group, name, default, help, ftype=None, required=False):
    """--name; its help ends with the value a run takes without the flag (here, for this task, model and preset)."""
    kind = flag_type(ftype, default)
    shown = "none" if default in ("", [], None) else default
    help = f"{help} (required: the config gives no default)" if required else f"{help} (default {shown})"
    if kind is bool:
        group.add_argument(f"--{name}", type=str2bool, nargs="?", const=True, default=None, help=help,
                           required=required)
    elif kind in (list, "list"):
        group.add_argument(f"--{name}", type=int, nargs="*", default=None, help=help, required=required)
    else:
        group.add_argument(f"--{name}", type=kind, default=None, choices=CHOICES.get(name), help=help,
                           required=required)


def flag_type(ftype, default):
    """The type a flag parses its value as: the field's annotation (list[int] | None: a list; int | None: int), else
    the default's type."""
    if isinstance(ftype, str):  # from __future__ import annotations: the annotation as written
        ftype = {"int": int, "float": float, "str": str, "bool": bool}.get(ftype.split("|")[0].strip(), None)
    args = [a for a in typing.get_args(ftype) if a is not type(None)] if typing.get_origin(ftype) in (
        typing.Union, types.UnionType) else [ftype]
    base = args[0] if args else None
    if typing.get_origin(base) is list or base is list or isinstance(default, list):
        return "list"
    if isinstance(base, type) and base in (int, float, str, bool):
        return base
    return type(default) if default not in (None, MISSING) else str

# -----------------------------------------------------------------------------
# a checkpoint as a model again: through the task and the model it names, checked


def load_checkpoint(path):
    """A train.py checkpoint, checked as far as its weights (load_weights): its config builds its task and its
    model's config, the task's inputs and outputs are the model's, its step is a step. Anything else, however the
    file came to be (truncated, edited, another program's, a model file moved since), is one ValueError naming it."""
    state = read_checkpoint(path, set_aside_note(os.path.dirname(path)) or "(train first, or pass the run's --out_dir)")
    bad = f"{path}: not a readable train.py checkpoint"
    try:
        cfg, mc = state["config"], state["model_config"]
        for d in (mc, cfg.get("model_opts", {})):  # checkpoints from before d_model
            if "n_embd" in d:
                d["d_model"] = d.pop("n_embd")
            d.pop("init_std", None)
        for spec, what in ((cfg["model"], "model"), (cfg["task"], "task")):
            where = spec.rpartition(":")[0] if is_spec(spec) else ""
            if where.endswith(".py") and not os.path.isfile(where):
                raise FileNotFoundError(f"the {what} file {where} it was trained from is gone; put it back there")
        Config, task = resolve_model(cfg["model"])[0], make_task(cfg["task"], **cfg["task_opts"])
        Config(**mc)  # a field its model does not have: TypeError
        odd = [k for k, ok in fits(state, Config, IO_FIELDS).items() if not ok]
        if odd:
            raise TypeError(f"its {odd[0]} is not what train.py writes")
        wrong = [(k, v) for k, v in fill_io(cfg["model"], task, {}).items() if mc.get(k, v) != v]  # train.py's
        if wrong:
            raise ValueError(f"its model's {wrong[0][0]} is {mc[wrong[0][0]]}, its task's {wrong[0][1]}")
    except FileNotFoundError as e:
        raise ValueError(f"{path}: {e}") from None
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"{bad} ({type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''})") from None
    return state


def build_model(state, trained=True, path="the checkpoint"):
    """The checkpoint's model, or (trained=False) the run's initialisation, in float64 eval mode."""
    if not trained:  # train.py seeds the global RNG with --seed, then builds the model
        torch.manual_seed(state["config"]["train"]["seed"])
    Config, Model = resolve_model(state["config"]["model"])  # a built-in name, or the class's file
    model = Model(Config(**state["model_config"]))
    if trained:
        load_weights(model, state, path)
    return model.double().eval()


def load(path):
    """(model, task, state) from a run's out_dir or a checkpoint file."""
    path = os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path
    state = load_checkpoint(path)
    try:
        return build_model(state, path=path), make_task(state["config"]["task"], **state["config"]["task_opts"]), state
    except (KeyError, TypeError, RuntimeError) as e:
        why = str(e).splitlines()[0][:80] if str(e) else ""
        raise ValueError(f"{path} is not a train.py checkpoint ({type(e).__name__}: {why})") from None


def run_record(run):
    """What a run's folder says of its run where it has no results.json: its checkpoint's config and seed, or {}
    (a folder of copied diagnostics)."""
    if not os.path.exists(path := os.path.join(run, "ckpt.pt")):
        return {}
    config = load_checkpoint(path)["config"]
    return dict(config=config, seed=config["train"]["seed"])
