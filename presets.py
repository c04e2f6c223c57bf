"""
Settings per task and model: `quick` (the default, minutes on a 2-core CPU) and `paper` (the
paper's sizes and schedules, for a GPU). train.py layers them: defaults < preset < flags.

Each entry holds `train` (training-loop settings), `task` (task options) and one dict per model
(model options, and under `train` that model's own training settings, e.g. its optimizer). The paper
sizes follow the paper (arXiv 2512.22471) and the authors' released code.
`mlp_pos` holds the options of the MLP's other reading (`--model mlp --per_position`, only the
current token and position), a row of its own in reproduce.py's table.
The quick sizes were chosen by measurement on a 2-core CPU; README.md has what they reach.

`match_width` sizes a model to a parameter budget (train.py --match_params), for
capacity-matched comparisons.
"""
import torch

from transformer import Transformer, TransformerConfig

PRESETS = {
    "quick": {  # minutes on a 2-core CPU; LSTM and MLP widths match the transformer's parameter count within 1%
        "bijection": dict(train=dict(max_iters=6000, batch_size=64, lr=2e-3, warmup_iters=100, eval_interval=1000),
                          transformer=dict(n_layer=3, n_head=4, n_embd=128),
                          mamba=dict(n_layer=2, d_model=128), lstm=dict(n_layer=2, d_model=192),
                          mlp=dict(n_layer=6, d_model=197), mlp_pos=dict(n_layer=6, d_model=220, per_position=True)),
        # hmm transformer: Muon leaves the uninformed plateau within ~300 steps; learned rows for the 53 header
        # tokens (which cell of T or E each one is) and one shared row for every observation position, with
        # ALiBi giving the order of the observations, so K = 30 and 50 meet no untrained position
        "hmm": dict(train=dict(max_iters=4000, batch_size=64, lr=2e-3, warmup_iters=100, eval_K=[30, 50]),
                    transformer=dict(n_layer=4, n_head=4, n_embd=96, pos="learned_alibi", n_pos=54,
                                     train=dict(optimizer="muon", max_iters=2000)),
                    mamba=dict(n_layer=3, d_model=64), lstm=dict(n_layer=2, d_model=166, pos="none"),
                    mlp=dict(n_layer=6, d_model=113), mlp_pos=dict(n_layer=6, d_model=185, per_position=True)),
        "regression": dict(train=dict(max_iters=4000, batch_size=64, lr=2e-3, warmup_iters=100, eval_interval=1000),
                           transformer=dict(n_layer=4, n_head=4, n_embd=128, train=dict(optimizer="muon")),
                           mamba=dict(n_layer=2, d_model=128), lstm=dict(n_layer=2, d_model=222),
                           mlp=dict(n_layer=6, d_model=235), mlp_pos=dict(n_layer=6, d_model=255, per_position=True)),
        # recall: fewer pairs than the paper so it trains in minutes. ALiBi's recency bias (16 heads, the
        # steepest attending to the last token or two) lets the two-step induction circuit (value <- its
        # key, query -> value) form within a few hundred steps; with a learned position table, or with
        # 4-8 ALiBi heads for some seeds, training sat on the "any stored value" plateau (loss ln N) for thousands
        "recall": dict(task=dict(n_pairs=8, n_queries=8, key_vocab=32, value_vocab=32, filler=4),
                       train=dict(max_iters=1500, batch_size=64, lr=2e-3, warmup_iters=100, eval_interval=250),
                       transformer=dict(n_layer=2, n_head=16, n_embd=128, pos="alibi", train=dict(optimizer="muon")),
                       # Mamba binds with 32 state dimensions per channel and Muon: 100% by step 1,000; with
                       # 16 it sat near 21% (results/mamba.md)
                       mamba=dict(n_layer=2, d_model=128, d_state=32, train=dict(optimizer="muon")),
                       lstm=dict(n_layer=2, d_model=154),
                       mlp=dict(n_layer=4, d_model=156), mlp_pos=dict(n_layer=4, d_model=215, per_position=True)),
    },
    "paper": {  # the paper's sizes and schedules, for a GPU
        "bijection": dict(train=dict(max_iters=100_000, batch_size=128, lr=3e-4, warmup_iters=2000, weight_decay=0.1,
                                     beta2=0.95, eval_interval=5000, log_interval=500),
                          transformer=dict(n_layer=6, n_head=6, n_embd=192, norm="rmsnorm", bias=False),  # 2.67M
                          mamba=dict(n_layer=6, d_model=192, pos="learned"),  # as the authors' (1.53M; theirs 1.44M)
                          lstm=dict(n_layer=6, d_model=192, dropout=0.1),  # the authors' LSTM, 1.79M
                          mlp=dict(n_layer=9, d_model=366),  # 18 linear layers, 2.67M
                          mlp_pos=dict(n_layer=9, d_model=382, per_position=True)),  # 2.67M
        "hmm": dict(train=dict(max_iters=80_000, batch_size=64, lr=3e-4, warmup_iters=1000, weight_decay=0.01,
                               eval_interval=5000, log_interval=500, eval_K=[30, 50]),
                    transformer=dict(n_layer=9, n_head=8, n_embd=256),  # 7.18M (the paper's "2.68M" cannot be)
                    mamba=dict(n_layer=9, d_model=256),  # 3.97M (the authors' 3.77M)
                    lstm=dict(n_layer=9, d_model=256, pos="none", dropout=0.1),  # the authors' LSTM, 4.77M
                    mlp=dict(n_layer=9, d_model=559),  # 7.17M
                    mlp_pos=dict(n_layer=9, d_model=623, per_position=True)),  # 7.18M
        "regression": dict(train=dict(max_iters=50_000, batch_size=128, lr=3e-4, warmup_iters=2000,
                                      eval_interval=5000, log_interval=500),
                           transformer=dict(n_layer=6, n_head=6, n_embd=192), mamba=dict(n_layer=6, d_model=192),
                           lstm=dict(n_layer=6, d_model=192, dropout=0.1), mlp=dict(n_layer=9, d_model=370),
                           mlp_pos=dict(n_layer=9, d_model=383, per_position=True)),
        "recall": dict(train=dict(max_iters=50_000, batch_size=128, lr=3e-4, warmup_iters=2000,
                                  eval_interval=5000, log_interval=500),
                       transformer=dict(n_layer=6, n_head=6, n_embd=192), mamba=dict(n_layer=6, d_model=192),
                       lstm=dict(n_layer=6, d_model=192, dropout=0.1), mlp=dict(n_layer=9, d_model=261),
                       mlp_pos=dict(n_layer=9, d_model=373, per_position=True)),
    },
    # a few steps at toy sizes, for tests; not a train.py preset: reproduce.py --preset tiny runs the quick cells
    # with `train` and `task` as flags, and of `model` the sizes each model has, its width field at `width`
    "tiny": {
        task: dict(train=dict(max_iters=4, batch_size=8, log_interval=2, eval_interval=4, eval_samples=20,
                              eval_samples_during=10, device="cpu"),
                   task=opts, model=dict(n_layer=1, n_head=2, d_state=4, d_flat=4), width=16)
        for task, opts in dict(bijection=dict(V=6), hmm=dict(K=4, n_states=3, n_obs=3, eval_K=[6]),
                               regression=dict(K=4, d=2),
                               recall=dict(n_pairs=4, n_queries=2, key_vocab=8, value_vocab=8, filler=2)).items()
    },
}


def model_options(entry):
    """A model's preset entry without its own training settings (`train`)."""
    return {k: v for k, v in entry.items() if k != "train"}


def count_params(Config, Model, mc):
    with torch.device("meta"):  # shapes only: no memory, no init work
        return Model(Config(**mc)).num_params()


def match_width(cfg, Config, Model, mc, task_io, tol=0.02):
    """--match_params: the width (`Model.width_field`, else n_embd) whose parameter count is closest
    to the target, which it must land within tol of. The count grows with the width: bisect."""
    target, field = cfg["train"]["match_params"], getattr(Model, "width_field", "n_embd")
    if target == -1:  # the transformer of this task and preset
        target = count_params(TransformerConfig, Transformer,
                              task_io | model_options(PRESETS[cfg["preset"]].get(cfg["task"], {}).get("transformer", {})))
    if target < 1:
        raise ValueError(f"--match_params must be a parameter count, 0 (off) or -1 (the transformer's), got {target}")

    def count(w):  # (width, parameters) at the first width >= w that the model accepts
        for v in range(max(w, 1), max(w, 1) + 256):
            try:
                return v, count_params(Config, Model, mc | {field: v})
            except ValueError:  # e.g. n_embd not a multiple of n_head
                pass
        raise ValueError(f"--match_params: the model accepts no {field} in {w}..{w + 255}")

    lo, hi = 0, 1
    while count(hi)[1] < target and hi < 1 << 20:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # count(lo) < target <= count(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if count(mid)[1] >= target else (mid, hi)
    w, n = min([count(hi)] + [count(lo)] * (lo > 0), key=lambda wn: abs(wn[1] - target))
    off = n / target - 1
    if abs(off) > tol:
        raise ValueError(f"--match_params {target:,}: the closest {field}={w} gives {n:,} parameters "
                         f"({100 * off:+.1f}%); change n_layer or other sizes")
    print(f"match_params: {field}={w} gives {n:,} parameters, target {target:,} ({100 * off:+.2f}%)")
    return mc | {field: w}
