"""
The attention-side diagnostics of geometry.py (arXiv 2512.22471 §6.1-6.2, the frame-precision dissociation of §7):
what the keys, queries and attention maps of a softmax-attention model look like, which heads the model cannot
do without, and when its attention settles in training. `python geometry.py keys | qk | ablate | dynamics`
runs them; each returns (numbers for the JSON, a function drawing the figure) and its `*_figures` the numbers
the claims table over seeds reads (geometry.py seeds).

- keys: how orthogonal the hypothesis tokens' keys K = E W_K^T are (mean |cos| of the off-diagonal pairs), in
  every variant of the paper's statistic and the authors' two scripts (KEY_VARIANTS, NAMED_VARIANTS);
- qk (Fig. 15): cos(q_t, k_j) and the attention entropy in bits by layer, beside log2 of the keys in view;
- ablate: the entropy MAE with layers skipped and heads masked, and the frame-head criterion of the authors'
  jlens code (concentration): the most damaging head over the second;
- dynamics: over one run's checkpoints, attention similarity 1 - JS(att || att_final) per layer against the
  entropy MAE and the final layer's manifold (frame against precision), with every figure of the claims table
  at each checkpoint (checkpoint_stats), the authors' value-manifold protocols and their frame ratio.
The statistics are geometry_stats.py's; the representation-side diagnostics (values, clusters, belief) and the
command line are geometry.py's.
"""
import copy
from functools import partial
import glob
import inspect
import os
import re
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from einops import rearrange

from checkpoints import ckpt_path
from geometry_jlens import (AUTHORS_COLUMNS, AUTHORS_DENSE, frame_ratio, jlens_mae, jlens_stats, jlens_tokens,
                            jspace_grams)
from geometry_stats import (concentration, entropy_mae, final_streams, js_bits, key_positions_mae, manifold_stats,
                            offdiag_abs_cos, offdiag_cos, value_protocols)
from oracles import entropy_bits, oracle
from settings import build_model, load, load_checkpoint
from transformer import Transformer, attn_bias

KEY_TASKS = ("bijection", "hmm", "recall", "hop")  # tasks with hypothesis tokens (hypothesis_tokens)


def hypothesis_tokens(task, which="hypothesis"):
    if which == "vocab":
        return torch.arange(task.vocab_size)
    if task.answer_offset is not None:  # bijection values, recall values, hop entities
        return torch.arange(task.answer_offset, task.answer_offset + task.n_classes)
    if task.name == "hmm":
        return torch.arange(task.OBS + 1, task.OBS + 1 + task.n_obs)  # the observation symbols
    raise ValueError(f"task {task.name!r} has no hypothesis tokens")

# -----------------------------------------------------------------------------
# keys: the hypothesis frame (§6.1)


def key_frame(model, tokens, batch=None):
    """(n_layer, H) mean |cos| of the tokens' keys, and layer 0's keys (H, n, d). `weight` (batch None):
    K = E W_K^T from the raw embedding rows (no position, norm or bias: the paper's statistic, a
    weight-space proxy beyond layer 0); `context`: the layer's actual keys in the batch, averaged per token
    over its occurrences (tokens that do not occur are left out)."""
    if batch is None:
        K = torch.stack([head_keys(model, tokens, l) for l in range(model.config.n_layer)])  # (n_layer, H, n, d)
        return offdiag_abs_cos(K), K[0]
    onehot = (batch.x[..., None] == tokens[torch.isin(tokens, batch.x)]).double()  # (B, T, n) tokens that occur
    _, inside = model(batch.x, return_internals=True)
    K = torch.stack([torch.einsum("bhtd,btn->hnd", l["k"], onehot) for l in inside["layers"]])
    K = K / onehot.sum((0, 1))[:, None]  # the mean key of each token
    return offdiag_abs_cos(K), K[0]


# the variants of the key statistic: which tokens, what enters W_K, which statistic, how heads combine
KEY_VARIANTS = dict(tokens=("hypothesis", "vocab"), input=("raw", "norm"), statistic=("abs", "signed"),
                    heads=("mean", "min"))
NAMED_VARIANTS = dict(  # where each variant comes from
    ours=("hypothesis", "raw", "abs", "mean"),  # geometry.py's `weight`, the paper's text
    qkv_analysis=("vocab", "raw", "signed", "mean"),  # the authors' qkv_analysis.py orthogonality
    identify_frame_head=("hypothesis", "norm", "abs", "min"))  # the authors' jlens subspaces.py, layer 0


def head_keys(model, tokens, layer, normed=False):
    """(H, n, d_head): block `layer`'s keys of the embedding rows wte[tokens], without position (a token's
    identity, as both of the authors' scripts take it) or W_K's bias (their models have none); `normed`:
    through the block's own input norm ln_1 first, as the attention sees its input (jlens
    identify_frame_head, at layer 0). Beyond layer 0 a weight-space proxy: the stream there is no embedding."""
    C, block = model.config.d_model, model.blocks[layer]
    E = model.wte.weight[tokens]  # (n, C)
    E = block.ln_1(E) if normed else E
    return rearrange(E @ block.attn.c_attn.weight[C:2 * C].T, "n (h d) -> h n d", h=model.config.n_head)


def jlens_keys(model, task):
    """jlens identify_frame_head (subspaces.py:104-118), per layer-0 head: mean |cos| between the keys of the
    hypothesis tokens' embedding rows through block 0's input norm (no position, no bias)."""
    return offdiag_cos(head_keys(model, hypothesis_tokens(task), 0, normed=True)).tolist()


def frame_basis(model, task):
    """(d, n) orthonormal basis of the hypothesis tokens' embedding rows through block 0's input norm: the frame
    of jlens run_phase5.py (subspaces.py:121-153, mode 'embedding')."""
    return torch.linalg.qr(model.blocks[0].ln_1(model.wte.weight[hypothesis_tokens(task)]).T).Q


def key_stat(K, statistic, heads):
    """(..., H, n, d) -> (...): each head's offdiag_cos (`abs`: mean |cos|, `signed`: mean cos), then the mean
    or the min over heads."""
    s = offdiag_cos(K, signed=statistic == "signed")
    return s.mean(-1) if heads == "mean" else s.min(-1).values


def key_variants(model, init, task, n_draws=200):
    """Every variant of the key statistic (KEY_VARIANTS), per layer, of the trained model and of its
    initialisation, beside i.i.d. N(0, 1) keys of the same n tokens, d_head and n_head (`gaussian`: the same
    statistic and head aggregation, mean over n_draws draws) and the signed statistic's floor -1/(n-1)."""
    c, g, rows = model.config, torch.Generator().manual_seed(0), []
    for tok in KEY_VARIANTS["tokens"]:
        tokens = hypothesis_tokens(task, tok)
        n = len(tokens)
        G = torch.randn(n_draws, c.n_head, n, c.d_model // c.n_head, generator=g, dtype=torch.float64)
        for inp in KEY_VARIANTS["input"]:
            keys = {who: torch.stack([head_keys(m, tokens, l, inp == "norm") for l in range(c.n_layer)])
                    for who, m in (("trained", model), ("init", init))}  # (n_layer, H, n, d)
            for stat in KEY_VARIANTS["statistic"]:
                per_head = {who: offdiag_cos(K, signed=stat == "signed") for who, K in keys.items()}  # (n_layer, H)
                for heads in KEY_VARIANTS["heads"]:
                    rows.append(dict(tokens=tok, input=inp, statistic=stat, heads=heads, n_tokens=n,
                                     **{who: key_stat(K, stat, heads).tolist() for who, K in keys.items()},
                                     gaussian=key_stat(G, stat, heads).mean().item(),
                                     floor=-1 / (n - 1) if stat == "signed" else None,
                                     min_head=per_head["trained"].argmin(1).tolist() if heads == "min" else None,
                                     trained_per_head=per_head["trained"].tolist(),
                                     init_per_head=per_head["init"].tolist()))
    return rows


def keys(model, task, batch, state, args):
    """The hypothesis frame (§6.1): per layer and head, mean |cos| of the --key_tokens' keys, `weight` and
    `context` (key_frame), of the trained model and of a fresh model from the run's seed (`init`), beside
    i.i.d. Gaussian keys of the same n and d_head (`gaussian`, 200 draws); `embedding`: the statistic on the
    embedding rows themselves (d_model dims). `variants`: every variant of the statistic (key_variants), and
    `named`: layer 0 of those the paper's text and the authors' two scripts use."""
    tokens = hypothesis_tokens(task, args.key_tokens)
    init, d = build_model(state, trained=False), model.config.d_model // model.config.n_head
    stats = {}
    for name, m in (("trained", model), ("init", init)):
        (w, K0), (c, _) = key_frame(m, tokens), key_frame(m, tokens, batch)
        stats[name] = dict(weight=w, context=c, K0=K0)
    g = torch.Generator().manual_seed(0)
    gauss = lambda dim: offdiag_abs_cos(torch.randn(200, len(tokens), dim, generator=g, dtype=torch.float64)).mean()
    emb = {m: offdiag_abs_cos(k.wte.weight[tokens]).item() for m, k in (("trained", model), ("init", init))}
    layers = [{f"{m}_{k}": stats[m][k][l].tolist() for m in stats for k in ("weight", "context")}
              | {f"{m}_{k}_mean": stats[m][k][l].mean().item() for m in stats for k in ("weight", "context")}
              for l in range(model.config.n_layer)]
    variants = key_variants(model, init, task)
    pick = lambda v: next(r for r in variants if (r["tokens"], r["input"], r["statistic"], r["heads"]) == v)
    named = {name: dict(zip(KEY_VARIANTS, v)) | {k: pick(v)[k][0] for k in ("trained", "init")}
             | {k: pick(v)[k] for k in ("gaussian", "floor", "n_tokens")} for name, v in NAMED_VARIANTS.items()}
    r = dict(tokens=args.key_tokens, n_tokens=len(tokens), d_head=d, gaussian=gauss(d).item(), layers=layers,
             embedding=emb | dict(gaussian=gauss(model.config.d_model).item()), named=named, variants=variants)

    def draw(plt):
        fig, ax = plt.subplots(1, 3, figsize=(19, 4.6), width_ratios=(1, 1, 1.6))
        h = int(stats["trained"]["weight"][0].argmin())
        Kn = F.normalize(stats["trained"]["K0"][h], dim=-1)
        im = ax[0].imshow((Kn @ Kn.T).numpy(), cmap="RdBu_r", vmin=-1, vmax=1)
        ax[0].set_title(f"layer 0, most orthogonal head ({h}): cos of the {len(tokens)} hypothesis keys (E W_K)",
                        fontsize=9)
        fig.colorbar(im, ax=ax[0])
        x, w = torch.arange(len(layers)), 0.2
        for i, k in enumerate(("trained_weight", "trained_context", "init_weight", "init_context")):
            ax[1].bar(x + (i - 1.5) * w, [l[k + "_mean"] for l in layers], w, label=k.replace("_", ", "))
        ax[1].axhline(r["gaussian"], color="k", ls="--", label=f"Gaussian keys, d={d}")
        ax[1].set(xlabel="layer", ylabel="mean |off-diagonal cos|", xticks=x, title="key orthogonality per layer")
        ax[1].legend(fontsize=8)
        x, w = torch.arange(len(variants)), 0.27
        for i, (k, colour) in enumerate((("trained", "tab:blue"), ("init", "tab:orange"), ("gaussian", "gray"))):
            ax[2].bar(x + (i - 1) * w, [v[k][0] if k != "gaussian" else v[k] for v in variants], w, color=colour,
                      label=f"{k} (Gaussian: keys of the head width)" if k == "gaussian" else k)
        floors = [(i, v["floor"]) for i, v in enumerate(variants) if v["floor"] is not None]
        ax[2].scatter(*zip(*floors), marker="_", s=300, color="k", label="floor -1/(n-1) of the signed mean", zorder=3)
        ax[2].axhline(0, color="k", lw=0.5)
        ax[2].set_xticks(x, ["\n".join(str(v[k])[:5] for k in KEY_VARIANTS) for v in variants], fontsize=6)
        ax[2].set(ylabel="off-diagonal cos statistic", title="layer 0: tokens / input / statistic / over heads")
        ax[2].legend(fontsize=7)
        return fig
    return r, draw


def keys_figures(r):
    """keys' figures for the claims table (geometry.py seeds), from its result r: layer 0 of the named statistics
    (NAMED_VARIANTS) and of the signed mean cos of the raw hypothesis keys, with their floors."""
    named = r["named"]
    signed = {v["heads"]: v for v in r["variants"]  # by "mean" and "min" over heads
              if (v["tokens"], v["input"], v["statistic"]) == ("hypothesis", "raw", "signed")}
    return {
        "keys: mean |cos|, value tokens, raw, mean over heads": named["ours"]["trained"],
        "keys: the same at init": named["ours"]["init"],
        "keys: the same, Gaussian keys of the head width": named["ours"]["gaussian"],
        "keys: mean |cos| through the norm, min over heads": named["identify_frame_head"]["trained"],
        "keys: through the norm, min over heads, at init": named["identify_frame_head"]["init"],
        "keys: signed mean, mean over heads": signed["mean"]["trained"][0],
        "keys: signed mean, min over heads": signed["min"]["trained"][0],
        "keys: signed mean at init": signed["mean"]["init"][0],
        "keys: the signed floor -1/(n-1)": signed["mean"]["floor"],
        "keys: signed mean over every id (the authors' qkv_analysis.py)": named["qkv_analysis"]["trained"],
        "keys: its floor": named["qkv_analysis"]["floor"],
    }


# -----------------------------------------------------------------------------
# qk: progressive query-key alignment (Fig. 15)


def qk(model, task, batch, state, args):
    """Progressive query-key alignment (Fig. 15): per layer, cos(q_t, k_j) averaged over heads, for scored t
    and prior positions j < t (heatmap: one sequence); its mean and `spread` (std over j, mean over rows);
    the attention entropy in bits over the full row (mean over heads, rows, sequences) beside log2 of the keys
    in view (t + 1, fewer under a --window); the attention mass on the hypothesis tokens."""
    q_pos = batch.mask[0].nonzero().squeeze(1)  # scored positions, the same in every sequence
    bias = attn_bias(model.config, batch.x.shape[1], batch.x.device)  # None: plain causal, t + 1 keys in view
    in_view = q_pos + 1 if bias is None else bias[0, q_pos].isfinite().sum(-1)  # the mask is the same in every head
    prior = torch.arange(batch.x.shape[1])[None, :] < q_pos[:, None]  # (Q, T): j < t
    hyp = torch.isin(batch.x, hypothesis_tokens(task)).double()  # (B, T)
    _, inside = model(batch.x, return_internals=True)
    layers, heat = [], []
    for l in inside["layers"]:
        cos = (F.normalize(l["q"][:, :, q_pos], dim=-1) @ F.normalize(l["k"], dim=-1).transpose(-1, -2)).mean(1)
        std = torch.stack([cos[:, i, prior[i]].std(-1) for i in range(len(q_pos)) if prior[i].sum() >= 2], 1)
        att = l["att"][:, :, q_pos]  # (B, H, Q, T)
        layers.append(dict(mean_cos=cos[:, prior].mean().item(), spread=std.mean().item(),
                           att_entropy_bits=entropy_bits(att).mean().item(),
                           att_mass_hypothesis=(att * hyp[:, None, None, :]).sum(-1).mean().item()))
        heat.append(cos[0].masked_fill(~prior, float("nan")))
    r = dict(uniform_entropy_bits=torch.log2(in_view.double()).mean().item(), layers=layers)

    def draw(plt):
        n = len(heat)
        fig, ax = plt.subplots(1, n + 1, figsize=(3.6 * (n + 1), 3.4))
        for i, hm in enumerate(heat):
            im = ax[i].imshow(hm.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
            ax[i].set(title=f"layer {i}: cos(q_t, k_j)", xlabel="prior position j", ylabel="query t (scored)")
        fig.colorbar(im, ax=ax[:n])
        ax[n].plot([l["att_entropy_bits"] for l in layers], "o-", label="attention entropy")
        ax[n].axhline(r["uniform_entropy_bits"], color="k", ls="--", label="uniform over visible")
        ax[n].set(xlabel="layer", ylabel="bits", title="attention entropy at scored rows")
        ax[n].legend(fontsize=8)
        return fig
    return r, draw


def qk_figures(r):
    """qk's figure for the claims table (geometry.py seeds): the attention entropy by layer."""
    return {"attention entropy by layer (bits)": [l["att_entropy_bits"] for l in r["layers"]]}


# -----------------------------------------------------------------------------
# ablate: the layers and heads the model cannot do without, and the frame head


def masked(c, layer, head=None):
    """The (n_layer, n_head) head_mask that silences one head of a layer (every head of it: head None)."""
    mask = torch.ones(c.n_layer, c.n_head, dtype=torch.float64)
    mask[layer, slice(None) if head is None else head] = 0
    return mask


def ablate(model, task, batch, state, args):
    """Entropy MAE (both conventions, oracles.Metrics) with each layer skipped (output = input), each layer's MLP
    skipped (models whose forward takes skip_mlps), each head masked (head_mask 0: the head's attention weights
    times 0) and every head of a layer masked (the attention then adds only its output projection's bias; with
    bias=False that is skipping the attention): which of the two sublayers does a layer's work. `frame`
    (models with heads): the per-token MAE's increase per masked head and its concentration, on the bijection's
    query layout also at its key positions alone (key_positions_mae, as the authors score it); with hypothesis
    keys also layer 0's most orthogonal head (jlens identify_frame_head: normed, mean |cos|)."""
    c = SimpleNamespace(**state["model_config"])  # n_layer (n_head): what a model from a file declares
    base = entropy_mae(model, task, batch)
    rows = [dict(ablation=f"skip L{l}", **entropy_mae(model, task, batch, skip_layers={l})) for l in range(c.n_layer)]
    if "skip_mlps" in inspect.signature(model.forward).parameters:  # the MLP alone, apart from the heads
        rows += [dict(ablation=f"skip L{l} MLP", **entropy_mae(model, task, batch, skip_mlps={l}))
                 for l in range(c.n_layer)]
    delta = {}
    if hasattr(c, "n_head") and "head_mask" in inspect.signature(model.forward).parameters:  # transformer, linear_attn
        for l, h in [(l, h) for l in range(c.n_layer) for h in [*range(c.n_head), None]]:
            name = f"mask L{l} all heads" if h is None else f"mask L{l}H{h}"
            rows.append(dict(ablation=name, **entropy_mae(model, task, batch, head_mask=masked(c, l, h))))
            if h is not None:
                delta[f"L{l}H{h}"] = rows[-1]["mae_token"] - base["mae_token"]
    for row in rows:
        row.update(ratio_token=row["mae_token"] / base["mae_token"], ratio_curve=row["mae_curve"] / base["mae_curve"])
    r = dict(baseline=base, ablations=rows)
    if delta and task.name == "bijection" and task.layout == "query":  # as the authors score that layout
        keys = key_positions_mae(model, task, batch)
        d = {f"L{l}H{h}": key_positions_mae(model, task, batch, head_mask=masked(c, l, h)) - keys
             for l in range(c.n_layer) for h in range(c.n_head)}
        skip = [key_positions_mae(model, task, batch, skip_layers={l}) / keys for l in range(c.n_layer)]
        r["frame_key_positions"] = dict(metric="mae_token at the key positions (key_positions_mae)",
                                        baseline=keys, skip_ratio=skip, delta_mae=d, **concentration(d))
    if delta:
        r["frame"] = dict(metric="mae_token", delta_mae=delta, **concentration(delta))
        if isinstance(model, Transformer) and state["config"]["task"] in KEY_TASKS:  # where keys applies
            scores = offdiag_cos(head_keys(model, hypothesis_tokens(task), 0, normed=True))
            r["frame"] |= dict(frame_head_by_orthogonality=f"L0H{int(scores.argmin())}",
                               orthogonality_scores=scores.tolist())

    def draw(plt):
        fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(rows)), 4))
        ax.bar(range(len(rows)), [row["mae_token"] for row in rows], color="tab:red")
        ax.axhline(base["mae_token"], color="k", ls="--", label=f"intact: {base['mae_token']:.4f} bits")
        ax.set_xticks(range(len(rows)), [row["ablation"] for row in rows], rotation=90, fontsize=7)
        title = "ablations"
        if delta:
            f = r["frame"]
            title += (f"; most damaging head {f['top_head']} (+{f['top_delta']:.4f} bits), "
                      + (f"{f['top_over_second']:.2f}x the next ({f['second_head']})" if f["second_head"] else ""))
        ax.set(yscale="log", ylabel="entropy MAE per token (bits)", title=title)
        ax.legend()
        return fig
    return r, draw


def ablate_figures(r):
    """ablate's figures for the claims table (geometry.py seeds): the intact entropy MAE, the error ratio with each
    layer skipped, and the frame head's damage over the second's (None without heads, or without a second head)."""
    frame = r.get("frame")  # models with heads only
    return {
        "entropy MAE per token (these sequences)": r["baseline"]["mae_token"],
        "frame: damage of the top head / the second": None if frame is None else frame["top_over_second"],
        "frame: the same within layer 0": None if frame is None else frame["l0_top_over_second"],
        "error x with layer l skipped (per token)":
            [a["ratio_token"] for a in r["ablations"] if re.fullmatch(r"skip L\d+", a["ablation"])],
        "error x with layer l's MLP skipped (per token)":
            [a["ratio_token"] for a in r["ablations"] if a["ablation"].endswith("MLP")] or None,
        "error x with layer l's heads masked (per token)":
            [a["ratio_token"] for a in r["ablations"] if a["ablation"].endswith("all heads")] or None,
    }


# -----------------------------------------------------------------------------
# dynamics: the frame-precision dissociation over one run's checkpoints


def checkpoint_stats(model, task, batch, args, final_frame=None):
    """One checkpoint's figures of the claims table: jlens's per-head key |cos| (jlens_keys); the attention
    entropy by layer at the scored rows; the per-token MAE with each layer skipped over the intact one; the
    per-token MAE's increase with each layer-0 head masked, and its top over its second; on the bijection's
    separate layout the value manifold at the value positions of the batch (ours) and the authors' three
    protocols (geometry_stats.value_protocols); with --frame_seqs the frame ratio against final_frame."""
    c, base = model.config, entropy_mae(model, task, batch)
    _, inside = model(batch.x, return_internals=True)
    q_pos = batch.mask[0].nonzero().squeeze(1)
    skip = [entropy_mae(model, task, batch, skip_layers={l})["mae_token"] / base["mae_token"] for l in range(c.n_layer)]
    damage = {}
    for h in range(c.n_head):
        damage[f"L0H{h}"] = entropy_mae(model, task, batch, head_mask=masked(c, 0, h))["mae_token"] - base["mae_token"]
    top, second = (sorted(damage.values(), reverse=True) + [0.0])[:2]  # one head: no second, no ratio
    r = dict(keys_jlens=jlens_keys(model, task), att_entropy_bits=[entropy_bits(l["att"][:, :, q_pos]).mean().item()
                                                                     for l in inside["layers"]],
             skip_ratio=skip, l0_damage=damage, l0_top_over_second=top / second if second > 0 else None)
    if task.name == "bijection" and task.layout == "separate":
        after = final_streams(model, batch.x)[1][:, 1::2]  # (B, L - 1, d) the value positions
        i = torch.arange(after.shape[1])
        H, pos = torch.log2(task.V - i.double()).repeat(len(after)), (2 * i + 1).repeat(len(after))
        ours = manifold_stats(after.reshape(-1, after.shape[-1]), H, position=pos, max_points=args.max_points)[0]
        r["values"] = dict(ours=ours) | value_protocols(model, task, args.seed)
        if args.frame_seqs:
            x = jlens_tokens(task, args.frame_seqs)
            r["frame"] = frame_ratio(model, final_frame, x, task)
    return r


def snapshots(run_dir, state):
    """The run's ckpt_*.pt and ckpt.pt, each checked to be a snapshot of this run (state: ckpt.pt's)."""
    paths = glob.glob(os.path.join(run_dir, "ckpt_*.pt")) + [ckpt_path(run_dir)]
    run = lambda st: [st["config"][k] for k in ("task", "task_opts", "model")] + [st["model_config"]]
    for path in paths:  # before the work: a checkpoint of another run copied into the folder
        st = load_checkpoint(path)
        if run(st) != run(state):
            raise ValueError(f"{path} is not a snapshot of {ckpt_path(run_dir)} (another run: "
                             f"{st['config']['model']} on {st['config']['task']} {st['config']['task_opts']}); "
                             f"move it out of the folder")
    return paths


def dynamics(model, task, batch, state, args):
    """The frame-precision dissociation, over ckpt_*.pt and ckpt.pt of one run: the entropy MAE; attention
    similarity 1 - JS(att || att_final) in bits (scored rows, mean over heads and sequences) per layer; layer
    0's `weight` key mean |cos| (key_frame); the final layer's manifold_stats at the scored positions; and every
    figure of the claims table (checkpoint_stats). Summary: the steps from which each layer's similarity stays
    >= --settle and the key |cos| within 10% of its end value; the MAE's fall after them."""
    H = entropy_bits(oracle(task, batch)[batch.mask])  # the exact posterior's entropy at the scored positions
    q_pos = batch.mask[0].nonzero().squeeze(1)
    maps = lambda inside: [l["att"][:, :, q_pos] for l in inside["layers"]]  # (B, H, Q, T) per layer
    final = maps(model(batch.x, return_internals=True)[1])
    frame = frame_basis(model, task) if args.frame_seqs else None
    rows = {}
    for path in snapshots(args.ckpt, state):
        m, _, st = load(path)
        _, inside = m(batch.x, return_internals=True)
        Z = manifold_stats(inside["final"][batch.mask], H, max_points=args.max_points)[0]
        rows[st["iter"]] = dict(step=st["iter"], **entropy_mae(m, task, batch),
                                att_similarity=[1 - js_bits(a, b).mean().item() for a, b in zip(maps(inside), final)],
                                key_cos_l0=key_frame(m, hypothesis_tokens(task))[0][0].mean().item(), **Z,
                                **checkpoint_stats(m, task, batch, args, frame))
    rows = [rows[step] for step in sorted(rows)]  # ckpt.pt, the last, may repeat a snapshot's step
    # settled: the first checkpoint from which a curve stays within tolerance of its final value
    settled = lambda xs, ok: next(i for i in range(len(xs)) if all(map(ok, xs[i:])))
    att = [settled([r["att_similarity"][l] for r in rows], lambda x: x >= args.settle) for l in range(len(final))]
    key_final = rows[-1]["key_cos_l0"]
    key = settled([r["key_cos_l0"] for r in rows], lambda x: abs(x - key_final) <= 0.1 * key_final)
    mae = lambda i: rows[i]["mae_token"] / rows[-1]["mae_token"]
    summary = dict(settle_threshold=args.settle, attention_settled_step=[rows[i]["step"] for i in att],
                   mae_improvement_after_attention=[mae(i) for i in att], keys_settled_step=rows[key]["step"],
                   mae_improvement_after_keys=mae(key), mae_token_final=rows[-1]["mae_token"])
    return dict(steps=rows, summary=summary), partial(dynamics_draw, rows, att)


def dynamics_draw(rows, att, plt):
    """Against the per-token MAE (falling to the right): attention similarity to the final maps, the layer-0
    keys, layer skips, the layer-0 heads' concentration and the frame ratio, the value manifold's PC1 share."""
    fig, axs = plt.subplots(1, 6, figsize=(26, 3.8))
    nan = float("nan")  # a figure missing at a checkpoint (a single head's ratio, a frame ratio not computed)
    col = lambda k, l=None: [nan if r.get(k) is None else r[k] if l is None else r[k][l] for r in rows]
    n_layer = len(rows[0]["att_similarity"])
    panels = {"entropy MAE (bits) by step": {"per token": col("mae_token"), "mean-curve": col("mae_curve")},
              "attention similarity to final (1 - JS)": {f"layer {l}": col("att_similarity", l)
                                                         for l in range(n_layer)},
              "layer-0 keys: mean |cos| per head (jlens)": {"mean": [sum(k) / len(k) for k in col("keys_jlens")],
                                                             "min": [min(k) for k in col("keys_jlens")],
                                                             "max": [max(k) for k in col("keys_jlens")]},
              "MAE with one layer skipped / intact": {f"layer {l}": col("skip_ratio", l) for l in range(n_layer)},
              "layer-0 heads": {"top / second head's damage": col("l0_top_over_second")}
              | ({"frame ratio (jlens)": [r["frame"]["frame_ratio"] if "frame" in r else nan for r in rows]}
                 if any("frame" in r for r in rows) else {}),
              "value manifold: PC1 share": {k: [r["values"][k]["pc1_share"] for r in rows] for k in
                                            (rows[0].get("values") or {})}}
    for i, (ax, (title, curves)) in enumerate(zip(axs, panels.items())):
        x = col("step") if i == 0 else col("mae_token")
        for label, ys in curves.items():
            ax.plot(x, ys, "o-", ms=3, label=label)
        ax.set(xscale="log", xlabel="training step" if i == 0 else "entropy MAE per token (bits)", title=title)
        if i:
            ax.invert_xaxis()
        else:
            ax.axvline(rows[att[0]]["step"], color="gray", ls=":")  # layer-0 attention settled
        ax.legend(fontsize=7)
    axs[0].set_yscale("log")
    axs[3].set_yscale("log")
    return fig


def dynamics_figures(r):
    """dynamics' figures for the claims table (geometry.py seeds): the step from which layer 0's attention stays
    settled, and how much the entropy MAE fell after it."""
    return {"layer-0 attention settled at step": r["summary"]["attention_settled_step"][0],
            "entropy MAE's fall after that": r["summary"]["mae_improvement_after_attention"][0]}


# -----------------------------------------------------------------------------
# trajectory: one run's snapshots step by step beside the authors' dense run


def trajectory(model, task, batch, state, args):
    """At every snapshot (ckpt_*.pt, ckpt.pt; --ckpt_schedule dense saves at the authors' steps): the authors'
    calibration MAE on their 256 sequences (jlens_mae), layer 0's per-head key |cos| (jlens_keys) and, with
    --frame_seqs, their other three statistics (geometry_jlens.jlens_stats: the frame ratio and the J-overlap
    against this run's last checkpoint, theirs against their step-50,000 model; the elimination probe, which needs
    no final model), the J-spaces from the first --frame_seqs sequences (theirs: 256); beside their dense run's
    figures at the same step (AUTHORS_DENSE)."""
    x, frame, rows = jlens_tokens(task, 256), frame_basis(model, task), {}
    final_grams = jspace_grams(copy.deepcopy(model).float(), x[:args.frame_seqs], task) if args.frame_seqs else None
    for path in snapshots(args.ckpt, state):
        m, _, st = load(path)
        theirs = dict(zip(AUTHORS_COLUMNS, AUTHORS_DENSE.get(st["iter"], (None,) * len(AUTHORS_COLUMNS))))
        rows[st["iter"]] = dict(step=st["iter"], mae=jlens_mae(m, task, x), keys_jlens=jlens_keys(m, task),
                                **{f"authors_{k}": v for k, v in theirs.items()})
        if args.frame_seqs:
            rows[st["iter"]] |= jlens_stats(m, task, x, frame, final_grams, args.frame_seqs)[0]
    rows = [rows[step] for step in sorted(rows)]  # ckpt.pt, the last, may repeat a snapshot's step
    return dict(steps=rows), partial(trajectory_draw, rows)


def trajectory_draw(rows, plt):
    """The four statistics of the authors' dense run by step, ours and theirs; and layer 0's key |cos|."""
    fig, axs = plt.subplots(1, 5, figsize=(25, 4))
    steps, theirs = [r["step"] for r in rows], sorted(AUTHORS_DENSE.items())
    nan = float("nan")
    ours = {"mae": [r["mae"] for r in rows],
            "frame_ratio": [r["frame"]["frame_ratio"] if "frame" in r else nan for r in rows],
            "j_overlap": [r.get("j_overlap", nan) for r in rows],
            "elimination": [nan if r.get("elimination") is None else r["elimination"] for r in rows]}
    titles = {"mae": "calibration MAE (bits, their 256 sequences)", "frame_ratio": "frame ratio to null (jlens)",
              "j_overlap": "J-space overlap with the final model", "elimination": "elimination probe, balanced acc."}
    against = {"frame_ratio": (", to its last checkpoint", ", to their step 50k"),
               "j_overlap": (", to its last checkpoint", ", to their step 50k")}
    for ax, (k, column) in zip(axs, enumerate(AUTHORS_COLUMNS)):
        mine, their = against.get(column, ("", ""))
        ax.plot(steps, ours[column], "o-", ms=3, label="this run" + mine)
        ax.plot([s for s, _ in theirs], [v[k] for _, v in theirs], "s--", ms=3, label="the authors' dense run" + their)
        ax.set(xscale="log", xlabel="training step", title=titles[column])
    axs[0].set_yscale("log")
    axs[3].axhline(0.5, color="gray", ls=":", label="chance")
    for stat, f in (("mean", lambda k: sum(k) / len(k)), ("min", min), ("max", max)):
        axs[4].plot(steps, [f(r["keys_jlens"]) for r in rows], "o-", ms=3, label=stat)
    axs[4].axhspan(0.43, 0.49, color="gray", alpha=0.2, label="their released model's heads")
    axs[4].set(xscale="log", xlabel="training step", title="layer-0 keys: mean |cos| per head (jlens)")
    for ax in axs:
        ax.legend(fontsize=7)
    return fig
