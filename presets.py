"""
Settings: the training defaults (TRAIN), the presets per task and model, and the command line that layers them
(defaults < preset < flags; --model: a name in MODELS or a class from any file, resolve_model), for every script.

Presets: `quick` (the default, sized for a 2-core CPU), `paper` (the paper's sizes and schedules, for a GPU),
`cpu_paper_task` (quick, but recall at the paper's size, grown to it by a curriculum) and `authors` (the bijection
under the recipe and model of the authors' released dense run). Each entry holds `train`
(training-loop settings), `task` (task options) and one dict per model (its options, and under `train` its own
training settings, e.g. its optimizer). The paper sizes follow the paper (arXiv 2512.22471) and the authors'
released code; the quick sizes were chosen by measurement on a 2-core CPU (results/table.md: what they reach, how
long each takes). `mlp_pos` holds the options of the MLP's other reading (`--model mlp --per_position`), a row of
its own in reproduce.py. `match_width` matches a model's capacity to a parameter budget (train.py --match_params).
"""
import argparse
from dataclasses import fields, is_dataclass
import difflib
import functools
import importlib.util
import inspect
import math
import os
import re
import sys
import traceback

import torch

from linear_attn import LinearAttention, LinearAttentionConfig
from lstm import LSTM, LSTMConfig
from mamba import Mamba, MambaConfig
from mlp import MLP, MLPConfig
from tasks import IO_FIELDS, TASKS, check_curriculum, curriculum_note, make_task
from transformer import Transformer, TransformerConfig

MODELS = {"transformer": (TransformerConfig, Transformer), "mamba": (MambaConfig, Mamba),
          "lstm": (LSTMConfig, LSTM), "mlp": (MLPConfig, MLP),
          "linear_attn": (LinearAttentionConfig, LinearAttention)}

TRAIN = {  # name: (default, help); presets and flags override
    "out_dir": ("", "where to write ckpt.pt and results.json (empty: out/<task>_<model>)"),
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
                            "| cpu | device (the training device; on MPS, which has no float64, hmm and regression "
                            "draw on the CPU)"),
    "data_chunk": (0, "batches drawn per sampler call, which spreads its fixed cost (many small ops) over several "
                      "steps: 0 = auto (16 when drawing on a GPU, else 1)"),
    "curriculum": ("", "grow an integer task option while training, NAME=START: from START up to the task's value in "
                       "equal steps over --curriculum_iters (Garg et al. 2022), e.g. n_pairs=8 or d_active=2"),
    "curriculum_iters": (0, "steps over which --curriculum grows (0 = half of --max_iters)"),
    "curriculum_hold": (0, "steps at --curriculum's START before it grows (e.g. until a circuit that needs many "
                           "steps at a small task has formed); it then grows over the rest of --curriculum_iters"),
    "train_all_queries": (False, "recall: training sequences query every stored key, in random order, right after "
                                 "the filler (Zoology's MQAR layout), so each trains n_pairs answers; evaluation "
                                 "keeps the task's own queries"),
    "optimizer": ("adamw", "adamw | muon (torch.optim.Muon on the hidden weight matrices, AdamW on the rest)"),
    "lr": (1e-3, "peak learning rate"),
    "min_lr_ratio": (0.1, "final learning rate as a fraction of --lr (cosine decay)"),
    "lr_schedule": ("nanogpt", "nanogpt: step it's rate, (it + 1) / (warmup + 1) of --lr in the warmup | authors: "
                               "their scripts' (jlens), s = it + 1: s / warmup of --lr, then the cosine from s = warmup"),
    "warmup_iters": (100, "linear warmup steps"),
    "weight_decay": (0.01, "AdamW weight decay (on --weight_decay_on)"),
    "weight_decay_on": ("matrices", "matrices: matrices and embeddings | all: every parameter, gains and biases too "
                                    "(the authors' AdamW)"),
    "beta1": (0.9, "AdamW beta1"),
    "beta2": (0.99, "AdamW beta2"),
    "grad_clip": (1.0, "clip the gradient norm to this (0 = off)"),
    "log_interval": (50, "steps between progress lines"),
    "eval_interval": (500, "steps between held-out evaluations and checkpoints"),
    "eval_samples": (2000, "held-out sequences in the final evaluation"),
    "eval_samples_during": (500, "held-out sequences in the evaluations during training"),
    "eval_batch_size": (0, "sequences per forward pass at evaluation, which sets its memory, not its sequences (drawn "
                           "250 at a time whatever this is): 0 = auto, on a GPU or Mac the sequences one process "
                           "trains on per step (--batch_size over the torchrun processes), on a CPU 250"),
    "eval_seed": (424242, "seed of the final evaluation's held-out sequences, a different stream from the training "
                          "batches"),
    "eval_seed_during": (-1, "seed of the held-out sequences of the evaluations during training, which --stop_at "
                             "reads, so that a run never stops on the final evaluation's sequences: "
                             "-1 = --eval_seed + 1"),
    "eval_K": ([], "also evaluate at these numbers of observations (tasks with a K option)"),
    "ckpt_schedule": ("last", "last: keep ckpt.pt only | eval: also a copy at every evaluation "
                              "| log: also copies at log-spaced steps | dense: at the authors' dense steps (100, "
                              "200, .. 1,000, 1,500, .. 5,000, 6,000, .. 10,000, then every 5,000)"),
    "stop_at": ("", "stop once a held-out evaluation reaches this, e.g. mae_curve<=0.01 or accuracy>=0.99"),
    "patience": (0, "stop once this many held-out evaluations in a row have not bettered the best KL before them by "
                    "1%% (a model that has stopped learning; 0 = off)"),
    "resume": (False, "continue the run in --out_dir from its ckpt.pt"),
    "overwrite": (False, "replace the run in --out_dir (its ckpt.pt, snapshots, results.json and eval.json)"),
    "eval_only": (False, "evaluate the checkpoint in --out_dir and write eval.json"),
}
CHOICES = {"device": None, "dtype": ("auto", "float32", "bfloat16"), "optimizer": ("adamw", "muon"),
           "ckpt_schedule": ("last", "eval", "log", "dense"), "data_device": ("auto", "cpu", "device"),
           "lr_schedule": ("nanogpt", "authors"), "weight_decay_on": ("matrices", "all")}
RESUME_STATE = ("optimizer", "gen_state", "torch_rng", "elapsed", "history")  # what a checkpoint gives a resumed run
HEADER_ROWS = "header + 1"  # a preset's n_pos: a row per header token, then one shared (with_header_rows)
RESUMABLE = ("out_dir", "device", "dtype", "compile", "max_iters", "stop_at", "patience", "log_interval",
             "eval_interval", "eval_samples", "eval_samples_during", "eval_K", "ckpt_schedule",
             "eval_batch_size")  # may change on --resume/--eval_only


def TARGET(spec):
    """A cell that stops at its target (--stop_at) or its schedule's end, not on a plateau (--patience)."""
    return dict(stop_at=spec, patience=0)


# quick: each cell stops at its target or, without one, once its held-out KL stops improving (--patience 4). A target
# is the paper's figure in the authors' convention (bijection mean-curve, hmm per token, recall accuracy) where the
# paper's model succeeds, or the cell's figure of the longer schedules before these rules where the quick model does
# not reach the paper's (the bijection) or the paper has none (regression); results/table.md: where each stopped.
PRESETS = {
    "quick": {  # sized for a 2-core CPU; LSTM and MLP widths match the transformer's parameter count within 1%
        "bijection": dict(train=dict(max_iters=6000, batch_size=64, lr=2e-3, warmup_iters=100, eval_interval=250,
                                     patience=4),
                          # the transformer: Muon, at half the batch and twice the rate (results/time_to_target.md)
                          transformer=dict(n_layer=3, n_head=4, d_model=128,
                                           train=dict(optimizer="muon", batch_size=32, lr=4e-3,
                                                      **TARGET("mae_curve<=0.0077"))),
                          # Mamba: Muon reaches 0.0137 at step 3,750 where AdamW had 0.0150 at 6,000 (results/table.md)
                          mamba=dict(n_layer=2, d_model=128,
                                     train=dict(optimizer="muon", **TARGET("mae_curve<=0.0150"))),
                          lstm=dict(n_layer=2, d_model=192, train=TARGET("mae_curve<=0.0103")),
                          mlp=dict(n_layer=6, d_model=197), mlp_pos=dict(n_layer=6, d_model=220, per_position=True)),
        # hmm transformer: Muon leaves the plateau AdamW sits on; a learned row per header token (which cell of T
        # or E it is) and one shared row for the observations, ALiBi giving their order, so K = 30 and 50 meet no
        # untrained position; a 16-token window besides the header, so its share of attention does not dilute past
        # the trained K. hmm Mamba: the same header rows, and the authors' LayerNorm on y (results/mamba.md)
        "hmm": dict(train=dict(max_iters=4000, batch_size=64, lr=2e-3, warmup_iters=100, eval_K=[30, 50],
                               eval_interval=250, patience=4),
                    transformer=dict(n_layer=4, n_head=4, d_model=96, pos="learned_alibi", n_pos=HEADER_ROWS, window=16,
                                     train=dict(optimizer="muon", **TARGET("mae_token<=0.049"))),
                    mamba=dict(n_layer=3, d_model=64, pos="learned", n_pos=HEADER_ROWS, y_norm=True,
                               train=TARGET("mae_token<=0.024")),
                    lstm=dict(n_layer=2, d_model=166, pos="none"),
                    mlp=dict(n_layer=6, d_model=113), mlp_pos=dict(n_layer=6, d_model=185, per_position=True)),
        # regression: the inputs vary in 2 of the 8 dimensions at first, all 8 from step 1,000 (Garg et al.); the
        # transformer trains 7,000 steps with 6 layers at its parameter count, where depth helped (results/regression.md)
        "regression": dict(train=dict(max_iters=4000, batch_size=64, lr=2e-3, warmup_iters=100, eval_interval=250,
                                      patience=4, curriculum="d_active=2", curriculum_iters=1000),
                           transformer=dict(n_layer=6, n_head=4, d_model=104,
                                            train=dict(optimizer="muon", max_iters=7000,
                                                       **TARGET("mae_curve<=0.0191"))),
                           mamba=dict(n_layer=2, d_model=128), lstm=dict(n_layer=2, d_model=222),
                           mlp=dict(n_layer=6, d_model=235), mlp_pos=dict(n_layer=6, d_model=255, per_position=True)),
        # recall: fewer pairs than the paper so it trains in minutes. ALiBi's recency bias (16 heads, the
        # steepest attending to the last token or two) lets the two-step induction circuit (value <- its
        # key, query -> value) form within a few hundred steps; with a learned position table, or with
        # 4-8 ALiBi heads for some seeds, training sat on the "any stored value" plateau (loss ln N) for thousands
        "recall": dict(task=dict(n_pairs=8, n_queries=8, key_vocab=32, value_vocab=32, filler=4),
                       train=dict(max_iters=1500, batch_size=64, lr=2e-3, warmup_iters=100, eval_interval=100,
                                  patience=4),
                       # the transformer stops at 99.9% on a check every 50 steps; its short schedule gets there in
                       # fewer steps than lr 2e-3 over 1,500 did (results/time_to_target.md)
                       transformer=dict(n_layer=2, n_head=16, d_model=128, pos="alibi",
                                        train=dict(optimizer="muon", **TARGET("accuracy>=0.999"), eval_interval=50,
                                                   lr=6e-3, warmup_iters=50, max_iters=300)),
                       # Mamba binds with 32 state dimensions per channel and Muon; with 16 it did not (results/mamba.md)
                       mamba=dict(n_layer=2, d_model=128, d_state=32,
                                  train=dict(optimizer="muon", **TARGET("accuracy>=0.978"))),
                       lstm=dict(n_layer=2, d_model=154),
                       mlp=dict(n_layer=4, d_model=156), mlp_pos=dict(n_layer=4, d_model=215, per_position=True)),
    },
    "paper": {  # the paper's sizes and schedules, for a GPU
        "bijection": dict(train=dict(max_iters=100_000, batch_size=128, lr=3e-4, warmup_iters=2000, weight_decay=0.1,
                                     beta2=0.95, eval_interval=5000, log_interval=500),
                          transformer=dict(n_layer=6, n_head=6, d_model=192, norm="rmsnorm", bias=False),  # 2.67M
                          mamba=dict(n_layer=6, d_model=192, pos="learned"),  # as the authors' (1.53M; theirs 1.44M)
                          lstm=dict(n_layer=6, d_model=192, dropout=0.1),  # the authors' LSTM, 1.79M
                          mlp=dict(n_layer=9, d_model=366),  # 18 linear layers, 2.67M
                          mlp_pos=dict(n_layer=9, d_model=382, per_position=True)),  # 2.67M
        "hmm": dict(train=dict(max_iters=80_000, batch_size=64, lr=3e-4, warmup_iters=1000, weight_decay=0.01,
                               eval_interval=5000, log_interval=500, eval_K=[30, 50]),
                    transformer=dict(n_layer=9, n_head=8, d_model=256),  # 7.18M (the paper's "2.68M" cannot be)
                    mamba=dict(n_layer=9, d_model=256),  # 3.97M (the authors' 3.77M)
                    lstm=dict(n_layer=9, d_model=256, pos="none", dropout=0.1),  # the authors' LSTM, 4.77M
                    mlp=dict(n_layer=9, d_model=559),  # 7.17M
                    mlp_pos=dict(n_layer=9, d_model=623, per_position=True)),  # 7.18M
        "regression": dict(train=dict(max_iters=50_000, batch_size=128, lr=3e-4, warmup_iters=2000,
                                      eval_interval=5000, log_interval=500),
                           transformer=dict(n_layer=6, n_head=6, d_model=192), mamba=dict(n_layer=6, d_model=192),
                           lstm=dict(n_layer=6, d_model=192, dropout=0.1), mlp=dict(n_layer=9, d_model=370),
                           mlp_pos=dict(n_layer=9, d_model=383, per_position=True)),
        "recall": dict(train=dict(max_iters=50_000, batch_size=128, lr=3e-4, warmup_iters=2000,
                                  eval_interval=5000, log_interval=500),
                       transformer=dict(n_layer=6, n_head=6, d_model=192), mamba=dict(n_layer=6, d_model=192),
                       lstm=dict(n_layer=6, d_model=192, dropout=0.1), mlp=dict(n_layer=9, d_model=261),
                       mlp_pos=dict(n_layer=9, d_model=373, per_position=True)),
    },
}

# the quick preset with the paper's recall task (64 pairs of 256 keys and values, 32 filler, 3 queries); the store
# grows from 8 pairs to 64 over 2,000 steps, short sequences first; the run stops at 99% held out. Mamba starts as
# linear attention (mimetic), trains on every stored key and holds the store at 8 pairs for 750 steps: bound to
# every key there, it keeps them as the store grows (grown from the start, it stalled); the seed decides whether a
# run binds in the hold, lr 4e-3 more often than 2e-3. It stops at step 2,000, at the full store, on the first half
# of a 4,000-step decay (`--resume --max_iters 4000` runs the rest, hours on a CPU). Runs: results/recall_paper.md.
PRESETS["cpu_paper_task"] = dict(PRESETS["quick"], recall=dict(
    PRESETS["quick"]["recall"], task=dict(n_pairs=64, n_queries=3, key_vocab=256, value_vocab=256, filler=32),
    train=dict(PRESETS["quick"]["recall"]["train"], max_iters=4000, curriculum="n_pairs=8", curriculum_iters=2000,
               stop_at="accuracy>=0.99", patience=0),
    transformer=dict(PRESETS["quick"]["recall"]["transformer"], train=dict(optimizer="muon")),  # the stop rule above
    mamba=dict(PRESETS["quick"]["recall"]["mamba"], mimetic=True,
               train=dict(optimizer="muon", lr=4e-3, train_all_queries=True, curriculum_hold=750, max_iters=2000,
                          lr_decay_iters=4000))))

# the authors' recipe for the bijection (jlens train_dense_checkpoints.py, the "same hyperparameters" as their analysed
# production run): AdamW 3e-4, betas (0.9, 0.999), decay 0.1 on every parameter, clip 1.0; 2,000 warm-up steps, a
# cosine to 0 at 50,000, their rate at each step; batch 256, seed 42, float32; their dense checkpoints. Their model
# (SepVocabTinyGPT): RMSNorm, attention without biases, an MLP with them, PyTorch's own init, the head tied over the
# whole 40-token vocabulary (a 40-way cross-entropy), a position table of 2L rows: 2,677,440 parameters. Other models
# keep their paper sizes under this recipe. Runs: results/geometry_authors.md.
PRESETS["authors"] = dict(bijection=dict(
    PRESETS["paper"]["bijection"],
    train=dict(max_iters=50_000, batch_size=256, lr=3e-4, warmup_iters=2000, min_lr_ratio=0.0, lr_schedule="authors",
               weight_decay=0.1, weight_decay_on="all", beta1=0.9, beta2=0.999, grad_clip=1.0, seed=42,
               dtype="float32", ckpt_schedule="dense", eval_interval=500, log_interval=100),
    transformer=dict(n_layer=6, n_head=6, d_model=192, norm="rmsnorm", bias=False, mlp_bias=True, init="torch",
                     head_vocab=True, block_size=38)))

# tiny: the quick cells for a few steps at toy sizes, for tests (reproduce.py and train.py --preset tiny): each task's
# training settings and options, and of SIZES those a model's config has (a model from a file too: `any`)
SIZES = dict(n_layer=1, n_head=2, d_state=4, d_flat=4, d_model=16)
TINY_TRAIN = dict(max_iters=4, batch_size=8, log_interval=2, eval_interval=4, eval_samples=20, eval_samples_during=10,
                  device="cpu", curriculum="")
TINY_TASK = dict(bijection=dict(V=6), hmm=dict(K=4, n_states=3, n_obs=3), regression=dict(K=4, d=2),
                 recall=dict(n_pairs=4, n_queries=2, key_vocab=8, value_vocab=8, filler=2))


def shrunk(quick, train, task):
    """A quick task entry at tiny sizes, its training settings (each model's own too) and task options overridden."""
    def small(name, opts):
        names = {f.name for f in fields(MODELS["mlp" if name == "mlp_pos" else name][0])}
        return opts | {k: v for k, v in SIZES.items() if k in names} | ({"train": opts["train"] | train}
                                                                        if "train" in opts else {})
    return dict(quick, train=quick["train"] | train, task=quick.get("task", {}) | task, any=SIZES,
                **{m: small(m, opts) for m, opts in quick.items() if m not in ("train", "task")})


PRESETS["tiny"] = {task: shrunk(PRESETS["quick"][task], TINY_TRAIN | ({"eval_K": [6]} if task == "hmm" else {}), opts)
                   for task, opts in TINY_TASK.items()}


# -----------------------------------------------------------------------------
# command line


def resolve_model(spec):
    """(Config, Model) of --model, its config the @dataclass <Class>Config in its file; a bad spec: a one-line error."""
    if spec in MODELS:
        return MODELS[spec]
    where, _, name = spec.rpartition(":")
    if not (where and name.isidentifier()):
        raise ValueError(f"{spec}: not a model; give one of {', '.join(MODELS)}, PATH.py:Class or module:Class")
    try:
        module = load_module(os.path.abspath(where) if where.endswith(".py") else where)
    except (FileNotFoundError, ModuleNotFoundError) as e:  # the file or module, or a module that the file imports
        what = f"file {e.filename}" if isinstance(e, OSError) else f"module named {e.name}"
        how = (f" (put its folder on PYTHONPATH, or give its file: {where.replace('.', '/')}.py:{name})"
               if isinstance(e, ModuleNotFoundError) and (where + ".").startswith(e.name + ".") else "")
        raise ValueError(f"{spec}: no {what}{how}") from None
    except (Exception, SystemExit) as e:  # the file's own code fails on import (a syntax error too): its error, line
        at = (e.filename, e.lineno) if isinstance(e, SyntaxError) else traceback.extract_tb(e.__traceback__)[-1][:2]
        raise ValueError(f"{spec}: importing it raised {type(e).__name__}: {(str(e) or '?').splitlines()[0]} at "
                         f"{at[0]}:{at[1]}") from None
    Model, Config = getattr(module, name, None), getattr(module, name + "Config", None)
    for ok, what in ((isinstance(Model, type), f"{where} has no class {name}"),
                     (isinstance(Model, type) and issubclass(Model, torch.nn.Module), f"{name} is not an nn.Module"),
                     (callable(getattr(Model, "num_params", None)), f"{name} has no num_params() method"),
                     (is_dataclass(Config), f"no config: add a @dataclass named {name}Config to {where}")):
        if not ok:
            raise ValueError(f"{spec}: {what}")
    return Config, Model


@functools.cache  # a model file (where: its absolute path) is loaded once: every caller gets the same classes
def load_module(where):
    if not where.endswith(".py"):
        return importlib.import_module(where)
    name = "model_file_" + re.sub(r"\W", "_", where)  # a name of its own: a file called tasks.py shadows nothing
    module = sys.modules[name] = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, where))
    module.__spec__.loader.exec_module(module)  # registered first: dataclasses and inspect look for it there
    return module


def model_spec(spec):
    """--model as a run records it, checked: a file's path made absolute, so that --resume finds it from anywhere."""
    where, _, name = spec.rpartition(":")
    return resolve_model(spec) and (f"{os.path.abspath(where)}:{name}" if where.endswith(".py") else spec)


def model_name(spec):  # in folders (out/<task>_<name>, reproduce.py's cells) and tables: a file's model by its class
    return spec.rpartition(":")[2]


class Parser(argparse.ArgumentParser):
    """One-line errors (exit code 2) with a did-you-mean hint, instead of the usage block."""
    elsewhere = {}  # flag -> the tasks/models that have it, for a flag of another task or model

    def error(self, message):
        m = re.search(r"unrecognized arguments: (\S+)", message)
        if m:
            flag = m.group(1).split("=")[0]
            known = [o for a in self._actions for o in a.option_strings]
            close = difflib.get_close_matches(flag, known, n=3)
            message += (f" ({flag} is an option of {self.elsewhere[flag]} only)" if flag in self.elsewhere else
                        f" (did you mean {' / '.join(close)}?)" if close else " (see --help for the valid flags)")
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


@functools.cache  # inspect parses the class's whole file
def field_help(cls):
    """The one-line comment after each dataclass field, for --help ({} for a class without a source file)."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    return dict(re.findall(r"^\s+(\w+): [^#\n]*#\s*(.*)$", src, re.M))


def add_flag(group, name, default, help, ftype=None):
    """--name; its help ends with the value a run takes without the flag (here, for this task, model and preset)."""
    ftype, shown = (ftype if callable(ftype) else None) or type(default), "none" if default in ("", []) else default
    help = f"{help} (default {shown})"
    if ftype is bool:
        group.add_argument(f"--{name}", type=str2bool, nargs="?", const=True, default=None, help=help)
    elif ftype is list:
        group.add_argument(f"--{name}", type=int, nargs="*", default=None, help=help)
    else:
        group.add_argument(f"--{name}", type=ftype, default=None, choices=CHOICES.get(name), help=help)


def parse_args(argv, doc=""):
    """train.py's command line: (--task/--model/--preset, the flags given, the parser). doc: the docstring whose
    first paragraph --help shows; each flag's help ends with its value for the chosen task, model and preset."""
    pre = Parser(prog="train.py", add_help=False, allow_abbrev=False)
    pre.add_argument("--task", choices=list(TASKS), help="(default recall)")
    pre.add_argument("--model", help=f"{' | '.join(MODELS)} | PATH.py:Class | module:Class (default transformer)")
    pre.add_argument("--preset", choices=list(PRESETS), help="(default quick)")
    known, _ = pre.parse_known_args(argv)
    try:
        known.model = known.model and model_spec(known.model)
    except ValueError as e:
        pre.error(f"--model {e}")
    known.explicit = {k: v for k, v in vars(known).items() if v is not None}  # checked against a checkpoint's
    for k, v in dict(task="recall", model="transformer", preset="quick").items():
        setattr(known, k, getattr(known, k) or v)
    if known.task not in PRESETS[known.preset] and any(known.task in p for p in PRESETS.values()):  # authors: bijection
        pre.error(f"--preset {known.preset} has no --task {known.task}; it has {', '.join(PRESETS[known.preset])}")
    p = Parser(prog="train.py", description=doc.strip().split("\n\n")[0], parents=[pre], allow_abbrev=False,
               epilog="Task and model flags depend on --task and --model: see `--task hmm --help`.")
    owners = {}
    for kind, table in (("task", TASKS), ("model", {k: c for k, (c, _) in MODELS.items()})):
        for name, cls in table.items():
            for f in fields(cls):
                if f.name not in IO_FIELDS:
                    owners.setdefault(f"--{f.name}", []).append(f"--{kind} {name}")
    p.elsewhere = {k: ", ".join(v) for k, v in owners.items()}
    train, task_opts, model_opts = layered(known.task, known.model, known.preset)
    train["out_dir"] = train["out_dir"] or os.path.join("out", f"{known.task}_{model_name(known.model)}")
    task_opts, longest = task_values(known.task, task_opts, train)
    model_opts = with_header_rows(known.task, task_opts, model_opts)
    if longest and "block_size" not in model_opts:  # train.py's build() gives it the longest sequence
        model_opts["block_size"] = longest
    g = p.add_argument_group("training")
    for name, (_, help) in TRAIN.items():
        add_flag(g, name, train[name], help)
    for title, cls, opts in ((f"task {known.task}", TASKS[known.task], task_opts),
                             (f"model {known.model}", resolve_model(known.model)[0], model_opts)):
        g, helps = p.add_argument_group(title), field_help(cls)
        for f in fields(cls):
            if f.name not in IO_FIELDS:
                add_flag(g, f.name, opts.get(f.name, f.default), helps.get(f.name, ""), f.type)
    args = p.parse_args(argv)
    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("task", "model", "preset")}
    if given.get("overwrite") and (given.get("resume") or given.get("eval_only")):
        p.error("--overwrite starts a new run; it cannot go with --resume or --eval_only")
    return known, given, p


def layered(task, model, preset):
    """defaults < preset: a run's train / task / model settings before its flags. A model without an entry (from a
    file) takes those of the preset's `any` entry that its config has (tiny's sizes)."""
    ps = PRESETS[preset].get(task, {})
    anyone = {k: v for k, v in ps.get("any", {}).items() if k in {f.name for f in fields(resolve_model(model)[0])}}
    task_opts, model_opts = dict(ps.get("task", {})), dict(ps.get(model, anyone))
    # a model's own training settings (e.g. its optimizer) sit in its preset entry, over the task's
    train = {k: d for k, (d, _) in TRAIN.items()} | ps.get("train", {}) | model_opts.pop("train", {})
    return train, task_opts, model_opts


def task_values(task, task_opts, train):
    """(the task's options, e.g. the bijection's L from its V; the longest sequence it trains or evaluates on,
    which is the model's block_size unless set), or (task_opts, None) where the task refuses them: flags may
    mend that."""
    try:
        tasks = [make_task(task, **task_opts)] + [make_task(task, **(task_opts | {"K": K})) for K in train["eval_K"]]
        if train["train_all_queries"] and task == "recall":  # training sequences query every key: longer
            tasks.append(tasks[0].all_queries())
    except (ValueError, TypeError):
        return task_opts, None
    return tasks[0].options(), max(t.seq_len for t in tasks)


def build_config(task, model, preset, given):
    """defaults < preset < flags, split into train / task / model dicts."""
    train, task_opts, model_opts = layered(task, model, preset)
    task_names = {f.name for f in fields(TASKS[task])}
    model_names = {f.name for f in fields(resolve_model(model)[0])}
    for k, v in given.items():
        (task_opts if k in task_names else model_opts if k in model_names else train)[k] = v
    model_opts = with_header_rows(task, task_opts, model_opts)
    train["out_dir"] = train["out_dir"] or os.path.join("out", f"{task}_{model_name(model)}")
    train["lr_decay_iters"] = train["lr_decay_iters"] or train["max_iters"]  # fixed now, so --resume keeps it
    train["curriculum_iters"] = train["curriculum_iters"] or train["max_iters"] // 2  # so is the curriculum's
    check_curriculum(task, task_opts, train)
    fill_io(model, make_task(task, **task_opts), {})  # a model that cannot take the task: said before any note
    return dict(task=task, model=model, preset=preset, train=train, task_opts=task_opts, model_opts=model_opts)


def with_header_rows(task, task_opts, model_opts):
    """model_opts with a preset's n_pos=HEADER_ROWS made the task's header length + 1: a learned row for each
    header token, one shared by every later position (0, a row per position, for a task without a header), so
    that the rows and the window's header follow --n_states and --n_obs. Left as it is where the task refuses
    its options: building the task then says why."""
    if model_opts.get("n_pos") != HEADER_ROWS:
        return model_opts
    try:
        header = getattr(make_task(task, **task_opts), "header_len", -1)
    except (ValueError, TypeError):
        return model_opts
    return model_opts | {"n_pos": header + 1}


def resume_config(state, known, given, out_dir):
    """--resume / --eval_only: the checkpoint's config, with only the RESUMABLE settings changed by flags."""
    missing = [k for k in RESUME_STATE if k not in state]
    if missing:
        raise ValueError(f"{os.path.join(out_dir, 'ckpt.pt')} has no {' or '.join(missing)}: train.py cannot "
                         f"{'resume' if given.get('resume') else 'evaluate'} it (a checkpoint it did not write?)")
    cfg = state["config"]
    for k, v in known.explicit.items():
        if cfg.get(k) != v:
            raise ValueError(f"--{k} {v} differs from the checkpoint's ({cfg.get(k)}) in {out_dir}; "
                             f"drop --{k}, or pass the --out_dir of a {v} run")
    cfg["train"] = {k: d for k, (d, _) in TRAIN.items()} | cfg["train"]  # settings added since: defaults
    cfg["train"]["lr_decay_iters"] = cfg["train"]["lr_decay_iters"] or cfg["train"]["max_iters"]  # its own
    cfg["train"]["curriculum_iters"] = cfg["train"]["curriculum_iters"] or cfg["train"]["max_iters"] // 2
    for k, v in given.items():
        if k in ("resume", "eval_only"):
            continue
        if k not in RESUMABLE and v != {**cfg["train"], **cfg["task_opts"], **cfg["model_opts"]}.get(k, v):
            raise ValueError(f"--{k} cannot change when resuming or evaluating a checkpoint; "
                             f"changeable: {', '.join(RESUMABLE)}")
        if k in RESUMABLE:
            cfg["train"][k] = v
    cfg["train"]["out_dir"] = out_dir
    if given.get("resume") and cfg["train"]["max_iters"] < state["iter"]:  # nothing to train: it would only evaluate
        raise ValueError(f"--max_iters {cfg['train']['max_iters']}: the checkpoint in {out_dir} is at step "
                         f"{state['iter']} already; pass a larger --max_iters to train on, or --eval_only to evaluate it")
    return cfg


def check_train(train):
    """Settings that would crash deep inside torch, or train silently on nonsense (a negative rate), are refused;
    a curriculum that the run ends before is said (curriculum_note)."""
    rules = dict(max_iters=(lambda x: x >= 0, ">= 0"),  # first: a negative one is copied into lr_decay_iters
                 lr=(lambda x: x > 0, "> 0"), min_lr_ratio=(lambda x: 0 <= x <= 1, "in [0, 1]"),
                 weight_decay=(lambda x: x >= 0, ">= 0"), beta1=(lambda x: 0 <= x < 1, "in [0, 1)"),
                 beta2=(lambda x: 0 <= x < 1, "in [0, 1)"), grad_clip=(lambda x: x >= 0, ">= 0 (0 = off)"),
                 warmup_iters=(lambda x: x >= 0, ">= 0"), lr_decay_iters=(lambda x: x >= 0, ">= 0 (0 = --max_iters)"),
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
    if (note := curriculum_note(train)) and os.environ.get("RANK", "0") == "0":  # once, after every check passed
        print(note, file=sys.stderr)


def during_seed(train):
    """The seed of the evaluations during training (--eval_seed_during; -1: --eval_seed + 1)."""
    return train["eval_seed"] + 1 if train["eval_seed_during"] == -1 else train["eval_seed_during"]


def check_device(name):
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", name):
        raise ValueError(f"--device {name!r}: expected auto, cpu, cuda, cuda:N or mps")


# -----------------------------------------------------------------------------
# a model's config: the task's I/O fields, its context, its width matched to a parameter count


def fill_io(spec, task, opts, longest=None):
    """opts with the task's I/O fields that the config has (block_size=longest under opts), or why it cannot."""
    names = {f.name for f in fields(resolve_model(spec)[0])}
    takes = ("vocab_size", "token inputs") if task.vocab_size else ("n_features", "real-valued inputs")
    gives = ("gaussian", "Gaussian prediction") if task.gaussian else ("n_classes", f"{task.n_classes} answer classes")
    for verb, (field, what) in (("take", takes), ("give", gives)):
        if field not in names:
            raise ValueError(f"{spec} cannot {verb} {task.name}'s {what}: its config has no {field} field")
    io = {k: getattr(task, k) for k in IO_FIELDS if k in names}
    return ({"block_size": longest} if longest and "block_size" in names else {}) | opts | io


def fit_block_size(Config, Model, mc, longest):
    """mc, its block_size raised to `longest` where the parameters do not depend on it (no position table, or
    shared rows from n_pos on: any length); a ValueError where the sequences exceed a table that fixes it."""
    if mc.get("block_size", longest) >= longest:
        return mc
    shapes = lambda mc: [p.shape for p in meta_model(Config, Model, mc).state_dict().values()]
    if shapes(mc) == shapes(mc | {"block_size": longest}):
        return mc | {"block_size": longest}
    raise ValueError(f"sequences of length {longest} exceed the model's context block_size={mc['block_size']}")


def meta_model(Config, Model, mc):
    with torch.device("meta"):  # shapes only: no memory, no init work
        return Model(Config(**mc))


def count_params(Config, Model, mc):
    return meta_model(Config, Model, mc).num_params()


def match_width(cfg, Config, Model, mc, task_io, tol=0.02):
    """--match_params: the width d_model whose parameter count is closest to the target, which it must
    land within tol of. The count grows with the width: bisect."""
    target = cfg["train"]["match_params"]
    if target == -1:  # the transformer of this task and preset
        opts = layered(cfg["task"], "transformer", cfg["preset"])[2]
        target = count_params(TransformerConfig, Transformer,
                              task_io | with_header_rows(cfg["task"], cfg["task_opts"], opts))
    if target < 1:
        raise ValueError(f"--match_params must be a parameter count, 0 (off) or -1 (the transformer's), got {target}")

    def count(w):  # (width, parameters) at the first width >= w that the model accepts
        for v in range(max(w, 1), max(w, 1) + 256):
            try:
                return v, count_params(Config, Model, mc | {"d_model": v})
            except ValueError:  # e.g. d_model not a multiple of n_head
                pass
        raise ValueError(f"--match_params: the model accepts no d_model in {w}..{w + 255}")

    lo, hi = 0, 1
    while count(hi)[1] < target and hi < 1 << 20:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # count(lo) < target <= count(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if count(mid)[1] >= target else (mid, hi)
    w, n = min([count(hi)] + [count(lo)] * (lo > 0), key=lambda wn: abs(wn[1] - target))
    off = n / target - 1
    if abs(off) > tol:
        raise ValueError(f"--match_params {target:,}: the closest d_model={w} gives {n:,} parameters "
                         f"({100 * off:+.1f}%); change n_layer or other sizes")
    print(f"match_params: d_model={w} gives {n:,} parameters, target {target:,} ({100 * off:+.2f}%)")
    return mc | {"d_model": w}
