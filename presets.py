"""
The settings a run is built from: the models by name (MODELS, or a class from any file: resolve_model), the
training defaults (TRAIN), and the presets per task and model; how a model's config takes its task's inputs and
outputs and a width matched to a parameter count. settings.py layers them (defaults < preset < flags) into a run.

Presets: `quick` (the default, sized for a 2-core CPU), `paper` (the paper's sizes and schedules, for a GPU),
`cpu_paper_task` (quick, but recall at the paper's size, grown to it by a curriculum), `authors` (the bijection
under the recipe and model of the authors' released dense run) and `tiny` (the quick cells at toy sizes, for
tests). Each task entry holds `train` (training-loop settings), `task` (task options) and one dict per model (its
options, and under `train` its own training settings, e.g. its optimizer); an entry "any task" serves a task
without its own (a file's task, hop), "any model" a model without its own (tiny's sizes). The paper sizes follow
the paper (arXiv 2512.22471) and the authors' released code; the quick sizes were chosen by measurement on a 2-core
CPU (results/table.md: what they reach, how long each takes). `mlp_pos` holds the options of the MLP's other
reading (`--model mlp --per_position`), a row of its own in reproduce.py.

The quick table compares like with like: each task's stop rule (a target, the same plateau rule, the same cap
and checks) is its entry's `train`, and no model's entry changes it (tests/test_train.py holds that); a model's
entry may change how it trains (optimizer, rate, batch), not when it stops.
"""
from dataclasses import asdict, fields, is_dataclass
import os
import sys

import torch

from commandline import is_spec, load_class, raised
from linear_attn import LinearAttention, LinearAttentionConfig
from lstm import LSTM, LSTMConfig
from mamba import Mamba, MambaConfig
from mlp import MLP, MLPConfig
from tasks import IO_FIELDS, task_class
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
                               "their scripts' (jlens), s = it + 1: s / warmup of --lr, then the cosine from "
                               "s = warmup"),
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
    "overwrite": (False, "replace the run in --out_dir (its ckpt.pt, snapshots, results.json, eval.json, config.json "
                         "and the diagnostics of its model, geometry_*)"),
    "eval_only": (False, "evaluate the checkpoint in --out_dir and write eval.json"),
}
CHOICES = {"device": None, "dtype": ("auto", "float32", "bfloat16"), "optimizer": ("adamw", "muon"),
           "ckpt_schedule": ("last", "eval", "log", "dense"), "data_device": ("auto", "cpu", "device"),
           "lr_schedule": ("nanogpt", "authors"), "weight_decay_on": ("matrices", "all")}
HEADER_ROWS = "header + 1"  # a preset's n_pos: a row per header token, then one shared (with_header_rows)
STOP_RULE = ("stop_at", "patience", "max_iters", "eval_interval", "eval_samples_during")  # a task's, not a model's
RESUMABLE = ("out_dir", "device", "dtype", "compile", "max_iters", "stop_at", "patience", "log_interval",
             "eval_interval", "eval_samples", "eval_samples_during", "eval_K", "ckpt_schedule",
             "eval_batch_size")  # may change on --resume/--eval_only

# quick: one stop rule per task, the same for every model: its target, the paper's level in the paper's convention
# (its best figure where a quick model can reach it: hmm's 0.024 per token; recall's 100% as the 99.9% that 8,000
# queries can tell; bijection's 0.010 mean-curve of its successful models, the quick transformer ending at 0.0077
# where the paper's reached 0.007; regression, not in the paper: 0.05 per token), met with its noise allowed for
# (evaluation.StopRule: by two standard errors over the check's sequences); else a plateau of the held-out KL
# (--patience 4); else the cap. Where several models reach the target, their time to it is the comparison
# (results/table.md); time_to_target.py reads the same targets. The caps (bijection 5,000 steps, hmm 3,000,
# regression 4,000, recall 1,500) leave the bijection transformer time to meet its task's target: the whole table
# takes 1h37m on a 2-core CPU, not an hour (results/sweep.md: where the time goes); table_longer.md has the longer
# schedules' figures.

PRESETS = {
    "quick": {  # sized for a 2-core CPU; LSTM and MLP widths match the transformer's parameter count within 1%
        "bijection": dict(train=dict(max_iters=5000, batch_size=64, lr=2e-3, warmup_iters=100, eval_interval=250,
                                     patience=4, stop_at="mae_curve<=0.01"),
                          # the transformer: Muon, at half the batch and twice the rate (results/time_to_target.md)
                          transformer=dict(n_layer=3, n_head=4, d_model=128,
                                           train=dict(optimizer="muon", batch_size=32, lr=4e-3)),
                          # Mamba: Muon reaches 0.0137 at step 3,750 where AdamW had 0.0150 at 6,000 (results/table.md)
                          mamba=dict(n_layer=2, d_model=128, train=dict(optimizer="muon")),
                          lstm=dict(n_layer=2, d_model=192),
                          mlp=dict(n_layer=6, d_model=197), mlp_pos=dict(n_layer=6, d_model=220, per_position=True)),
        # hmm transformer: Muon leaves the plateau AdamW sits on; a learned row per header token (which cell of T
        # or E it is) and one shared row for the observations, ALiBi giving their order, so K = 30 and 50 meet no
        # untrained position; a 16-token window besides the header, so its share of attention does not dilute past
        # the trained K. hmm Mamba: the same header rows, and the authors' LayerNorm on y (results/mamba.md)
        "hmm": dict(train=dict(max_iters=3000, batch_size=64, lr=2e-3, warmup_iters=100, eval_K=[30, 50],
                               eval_interval=250, patience=4, stop_at="mae_token<=0.024"),
                    transformer=dict(n_layer=4, n_head=4, d_model=96, pos="learned_alibi", n_pos=HEADER_ROWS, window=16,
                                     train=dict(optimizer="muon")),
                    mamba=dict(n_layer=3, d_model=64, pos="learned", n_pos=HEADER_ROWS, y_norm=True),
                    lstm=dict(n_layer=2, d_model=166, pos="none"),
                    mlp=dict(n_layer=6, d_model=113), mlp_pos=dict(n_layer=6, d_model=185, per_position=True)),
        # regression: the inputs vary in 2 of the 8 dimensions at first, all 8 from step 1,000 (Garg et al.); the
        # transformer has 6 layers at its parameter count, where depth helped (results/regression.md)
        "regression": dict(train=dict(max_iters=4000, batch_size=64, lr=2e-3, warmup_iters=100, eval_interval=250,
                                      patience=4, stop_at="mae_token<=0.05", curriculum="d_active=2",
                                      curriculum_iters=1000),
                           transformer=dict(n_layer=6, n_head=4, d_model=104, train=dict(optimizer="muon")),
                           mamba=dict(n_layer=2, d_model=128), lstm=dict(n_layer=2, d_model=222),
                           mlp=dict(n_layer=6, d_model=235), mlp_pos=dict(n_layer=6, d_model=255, per_position=True)),
        # recall: fewer pairs than the paper so it trains in minutes. ALiBi's recency bias (16 heads, the
        # steepest attending to the last token or two) lets the two-step induction circuit (value <- its
        # key, query -> value) form within a few hundred steps; with a learned position table, or with
        # 4-8 ALiBi heads for some seeds, training sat on the "any stored value" plateau (loss ln N) for thousands
        "recall": dict(task=dict(n_pairs=8, n_queries=8, key_vocab=32, value_vocab=32, filler=4),
                       train=dict(max_iters=1500, batch_size=64, lr=2e-3, warmup_iters=100, eval_interval=100,
                                  patience=4, stop_at="accuracy>=0.999"),
                       # the transformer: a rate of 6e-3 decayed over 300 steps, then held at its floor, gets there in
                       # fewer steps than lr 2e-3 over 1,500 did (results/time_to_target.md)
                       transformer=dict(n_layer=2, n_head=16, d_model=128, pos="alibi",
                                        train=dict(optimizer="muon", lr=6e-3, warmup_iters=50, lr_decay_iters=300)),
                       # Mamba binds with 32 state dimensions a channel and Muon; with 16 it did not (results/mamba.md)
                       mamba=dict(n_layer=2, d_model=128, d_state=32, train=dict(optimizer="muon")),
                       lstm=dict(n_layer=2, d_model=154),
                       mlp=dict(n_layer=4, d_model=156), mlp_pos=dict(n_layer=4, d_model=215, per_position=True)),
        # a task without an entry of its own (a file's, hop) under the generic settings and its own defaults
        # (Task.defaults, over these); every model but Mamba matched to the transformer's parameter count
        "any task": dict(train=dict(max_iters=3000, batch_size=64, lr=2e-3, warmup_iters=100, eval_interval=250,
                                    patience=4),
                         transformer=dict(n_layer=3, n_head=4, d_model=96, train=dict(optimizer="muon")),
                         mamba=dict(n_layer=2, d_model=96, train=dict(optimizer="muon")),
                         lstm=dict(n_layer=2, train=dict(match_params=-1)),
                         mlp=dict(n_layer=6, train=dict(match_params=-1)),
                         mlp_pos=dict(n_layer=6, per_position=True, train=dict(match_params=-1)),
                         linear_attn=dict(n_head=2, train=dict(match_params=-1))),  # 2 heads: a width within 2%
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
# training settings and options, and of SIZES those a model's config has (a model from a file too: "any model")
SIZES = dict(n_layer=1, n_head=2, d_state=4, d_flat=4, d_model=16)
TINY_TRAIN = dict(max_iters=4, batch_size=8, log_interval=2, eval_interval=4, eval_samples=20, eval_samples_during=10,
                  device="cpu", curriculum="")
TINY_TASK = dict(bijection=dict(V=6), hmm=dict(K=4, n_states=3, n_obs=3), regression=dict(K=4, d=2),
                 recall=dict(n_pairs=4, n_queries=2, key_vocab=8, value_vocab=8, filler=2))


def shrunk(quick, train, task):
    """A quick task entry at tiny sizes: its training settings and task options overridden, each model's options
    at SIZES (those its config has); a model's own training settings kept but --match_params (toy widths cannot
    land within 2% of a count)."""
    def small(name, opts):
        names = {f.name for f in fields(MODELS["mlp" if name == "mlp_pos" else name][0])}
        own = {k: v for k, v in opts.get("train", {}).items() if k != "match_params"}
        return opts | {k: v for k, v in SIZES.items() if k in names} | ({"train": own} if "train" in opts else {})
    return dict(quick, train=quick["train"] | train, task=quick.get("task", {}) | task, **{"any model": SIZES},
                **{m: small(m, opts) for m, opts in quick.items() if m not in ("train", "task")})


PRESETS["tiny"] = {task: shrunk(PRESETS["quick"][task], TINY_TRAIN | ({"eval_K": [6]} if task == "hmm" else {}), opts)
                   for task, opts in (TINY_TASK | {"any task": {}}).items()}




# -----------------------------------------------------------------------------
# a model by its name, or a class from a file


def resolve_model(spec):
    """(Config, Model) of --model, its config the @dataclass <Class>Config in its file; a bad spec: a one-line error."""
    if spec in MODELS:
        return MODELS[spec]
    if not is_spec(spec):
        raise ValueError(f"{spec}: not a model; give one of {', '.join(MODELS)}, PATH.py:Class or module:Class")
    Model, (where, _, name) = load_class(spec, "model"), spec.rpartition(":")
    Config = getattr(sys.modules[Model.__module__], name + "Config", None)
    for ok, what in ((issubclass(Model, torch.nn.Module), f"{name} is not an nn.Module"),
                     (callable(getattr(Model, "num_params", None)), f"{name} has no num_params() method"),
                     (is_dataclass(Config), f"no config: add a @dataclass named {name}Config to {where}")):
        if not ok:
            raise ValueError(f"{spec}: {what}")
    return Config, Model


def model_spec(spec):
    """--model as a run records it, checked: a file's path made absolute, so that --resume finds it from anywhere."""
    where, _, name = spec.rpartition(":")
    return resolve_model(spec) and (f"{os.path.abspath(where)}:{name}" if where.endswith(".py") else spec)


def model_name(spec):  # in folders (out/<task>_<name>, reproduce.py's cells) and tables: a file's model by its class
    return spec.rpartition(":")[2]


def task_name(spec):  # the same for a task: a file's by its name, a built-in's is its name
    return task_class(spec).name if is_spec(spec) else spec


def run_name(task, model):  # <task>_<model>: a run's folder under out/ (without --out_dir), a sweep's cell's
    return f"{task_name(task)}_{model_name(model)}"


def default_out_dir(task, model):
    return os.path.join("out", run_name(task, model))


# -----------------------------------------------------------------------------
# a model's config: the task's I/O fields, its context, its width matched to a parameter count


def model_config(spec, task, opts, longest, match_params=0, transformer_opts=None, saved=None):
    """(the whole config of --model spec on task, every field's value, and its parameter count): its options, the
    task's I/O fields that the config has (a model that lacks one it needs is refused here), a block size that
    holds the longest sequence, and the width --match_params asks for (-1: the count of the transformer of
    transformer_opts). saved: a checkpoint's config, which the model is rebuilt from as it is."""
    Config, Model = resolve_model(spec)
    mc = dict(saved) if saved else fill_io(spec, task, opts, longest)
    if match_params and not saved:
        target = match_params if match_params != -1 else count_params(
            *MODELS["transformer"], fill_io("transformer", task, transformer_opts, longest))
        mc = match_width(target, Config, Model, mc)
    try:  # every field's value: what the model is built from and its checkpoint records
        whole = asdict(Config(**fit_block_size(Config, Model, mc, longest)))
    except TypeError as e:  # a flag of another model, or a field a file's config does not have
        raise ValueError(f"--model {spec}: its config {Config.__name__} refuses these options: {e}") from None
    return whole, count_params(Config, Model, whole)


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


class SkipNormalInit(torch.overrides.TorchFunctionMode):
    """A meta model's normal initialisations (nn.init.normal_, xavier_normal_, Tensor.normal_, ...) return their
    tensor as it is: its values are never read, and on the meta device normal_ runs torch's Python reference, whose
    first call imports torch._dynamo, a second of every command that only resolves a run (--dry_run, --help, a plan)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        t = args[0] if args else (kwargs or {}).get("tensor")
        if getattr(func, "__name__", "").endswith("normal_") and isinstance(t, torch.Tensor) and t.is_meta:
            return t
        return func(*args, **(kwargs or {}))


def meta_model(Config, Model, mc):
    """The model on the meta device (shapes only: no memory, no init work); an error raised in a file model's own
    __init__ names its file and line."""
    config = Config(**mc)
    try:
        with torch.device("meta"), SkipNormalInit():
            return Model(config)
    except Exception as e:
        if (Config, Model) in MODELS.values():  # a built-in's: a bug of ours, with its traceback
            raise
        where = sys.modules[Model.__module__].__file__
        raise ValueError(f"{Model.__name__}: building it raised {raised(e, where)}") from None


def count_params(Config, Model, mc):
    return meta_model(Config, Model, mc).num_params()


def match_width(target, Config, Model, mc, tol=0.02):
    """--match_params: the width d_model whose parameter count is closest to the target, which it must
    land within tol of. The count grows with the width: bisect."""
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
