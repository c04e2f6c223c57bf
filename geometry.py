"""
Geometric diagnostics of a trained wind-tunnel model (arXiv 2512.22471 §6-7, v3's architecture
comparison): what the keys, queries, attention and representations look like inside.

    python geometry.py all --ckpt out/hmm_transformer         # every diagnostic that applies
    python geometry.py clusters --ckpt out/hmm_mamba --K 15   # at the K of the authors' five-cluster figure
    python geometry.py seeds out/s1 out/s2 out/s3 --out DIR   # the claims' figures over seeds of one recipe

Each writes geometry_<name>.json (the numbers) and .png (if matplotlib is installed) beside the
checkpoint, from --n_seq held-out sequences of the run's eval seed (those train.py scores), in float64.
Each diagnostic's function defines what it measures:
- keys: how orthogonal the hypothesis tokens' keys are, in every variant of the paper and the authors' code;
- qk (Fig. 15): query-key cosines and attention entropy by layer;
- values (Figs. 16-17): PCA of the representations against posterior entropy H and position;
- dynamics: frame against precision over one run's checkpoints (train with --ckpt_schedule log);
- ablate: entropy MAE with layers and heads removed, and the authors' frame-head criterion;
- clusters (v3 "five clusters"; hmm): the argmax-state clusters against permuted labels and k-means;
- belief (Shai et al. 2024, arXiv 2405.15943): a linear probe of the whole posterior vector.
Scored positions: the task's `mask` (bijection: every key; hmm: every observation). Hypothesis tokens:
the answer tokens where answers are tokens (bijection: the V value tokens, the hypotheses pi(k), as in
the authors' jlens code; with --layout query the keys share them); hmm has no state tokens: its O observation symbols.
keys, qk, dynamics need softmax attention (transformer); values bijection or hmm; clusters hmm; belief a
task with a posterior vector (bijection, hmm, regression); ablate runs on every model. A diagnostic that
does not apply, or a missing checkpoint: a one-line error (exit 2); weights that are not finite, or a full disk
(the files written before kept whole): one line, exit 1.
"""
from functools import partial
import glob
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from einops import rearrange

from oracles import LOG2, Metrics, entropy_bits, gaussian_kl_bits, oracle
from tasks import make_task
from presets import MODELS, Parser
from transformer import attn_bias
from checkpoints import load_checkpoint, write_file, write_json
from runtime import cli, pyplot

DIAGNOSTICS = ("keys", "qk", "values", "dynamics", "ablate", "clusters", "belief")  # the order of `all`
ATTENTION = ("transformer",)  # models with softmax attention: queries, keys, attention maps
ENTROPY_TASKS = ("bijection", "hmm")  # posterior entropy varies across scored positions
BELIEF_TASKS = ("bijection", "hmm", "regression")  # a posterior vector; recall's and hop's are point masses


def ckpt_path(path):
    return os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path


def build_model(state, trained=True):
    """The checkpoint's model, or (trained=False) the run's initialisation, in float64 eval mode."""
    if not trained:  # train.py seeds the global RNG with --seed, then builds the model
        torch.manual_seed(state["config"]["train"]["seed"])
    Config, Model = MODELS[state["config"]["model"]]
    model = Model(Config(**state["model_config"]))
    if trained:
        model.load_state_dict(state["model"])
    return model.double().eval()


def load(path):
    """(model, task, state) from a run's out_dir or a checkpoint file."""
    state = load_checkpoint(ckpt_path(path))
    try:
        return build_model(state), make_task(state["config"]["task"], **state["config"]["task_opts"]), state
    except (KeyError, TypeError, RuntimeError) as e:
        raise ValueError(f"{ckpt_path(path)} is not a train.py checkpoint ({type(e).__name__}: {str(e)[:80]})") \
            from None


def hypothesis_tokens(task, which="hypothesis"):
    if which == "vocab":
        return torch.arange(task.vocab_size)
    if task.answer_offset is not None:  # bijection values, recall values, hop entities
        return torch.arange(task.answer_offset, task.answer_offset + task.n_classes)
    if task.name == "hmm":
        return torch.arange(task.OBS + 1, task.OBS + 1 + task.n_obs)  # the observation symbols
    raise ValueError(f"task {task.name!r} has no hypothesis tokens")

# -----------------------------------------------------------------------------
# statistics (float64)


def offdiag_cos(K, signed=False):
    """(..., n, d) -> (...): the mean over the n(n-1) off-diagonal pairs of the n rows of their cosine
    (signed) or its absolute value. Signed it is >= -1/(n-1), with equality exactly when the unit rows sum
    to zero: |sum_i u_i|^2 = n + n(n-1) mean >= 0. Rows of zeros count as cos 0."""
    Kn = F.normalize(K, dim=-1)
    C = Kn @ Kn.transpose(-1, -2)
    C = C if signed else C.abs()
    n = K.shape[-2]
    return (C.sum((-1, -2)) - C.diagonal(dim1=-2, dim2=-1).sum(-1)) / (n * (n - 1))


offdiag_abs_cos = partial(offdiag_cos, signed=False)


def abs_corr(a, b):
    """|Pearson correlation| of two (n,) vectors (NaN if one is constant)."""
    return torch.corrcoef(torch.stack([a, b]))[0, 1].abs().item()


def pca(X):
    """Scores on the principal axes and each axis' share of the variance."""
    Xc = X - X.mean(0)
    _, S, Vh = torch.linalg.svd(Xc, full_matrices=False)
    return Xc @ Vh.T, S ** 2 / (S ** 2).sum()


def probe_r2(X, y, frac=0.8, seed=42):
    """Held-out R^2 of a least-squares linear map (with intercept) from X to y."""
    idx = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    tr, te = idx[:int(frac * len(X))], idx[int(frac * len(X)):]
    A = torch.cat([X, torch.ones(len(X), 1, dtype=X.dtype)], 1)
    w = torch.linalg.lstsq(A[tr], y[tr, None], driver="gelsd").solution  # SVD-based: X may be rank-deficient
    resid = y[te] - (A[te] @ w).squeeze(1)
    return (1 - resid.pow(2).sum() / (y[te] - y[te].mean()).pow(2).sum()).item()


def pairwise(X):
    """(n, n) Euclidean distances, exact: not by |x|^2 + |y|^2 - 2 x.y, which loses digits."""
    return torch.cdist(X, X, compute_mode="donot_use_mm_for_euclid_dist")


def silhouette(X, labels):
    """Mean silhouette (b - a) / max(a, b) of points X (n, d), Euclidean: a = mean distance to the own
    cluster's other points, b = the smallest mean distance to another cluster; 0 for points alone in their
    cluster; NaN for a single cluster (no b)."""
    return silhouette_d(pairwise(X), labels)


def silhouette_d(D, labels):
    """silhouette from the (n, n) distance matrix D."""
    ks = labels.unique()
    own = labels[:, None] == ks[None, :]  # (n, k)
    sums, sizes = D @ own.to(D.dtype), own.sum(0)
    n_own = (own * sizes).sum(1)
    a = (sums * own).sum(1) / (n_own - 1).clamp(min=1)
    b = (sums / sizes).masked_fill(own, float("inf")).min(1).values
    return torch.where(n_own > 1, (b - a) / torch.maximum(a, b), torch.zeros_like(a)).mean().item()


def silhouette_null(X, labels, n_perm=200, seed=0):
    """The silhouette of the labels against the same with the labels permuted n_perm times (cluster sizes
    kept, any tie to the points broken): the null's mean and 95th percentile, and the one-sided permutation
    p-value (1 + #{null >= observed}) / (1 + n_perm)."""
    D, g = pairwise(X), torch.Generator().manual_seed(seed)
    s = silhouette_d(D, labels)
    null = torch.tensor([silhouette_d(D, labels[torch.randperm(len(labels), generator=g)]) for _ in range(n_perm)],
                        dtype=torch.float64)
    return dict(silhouette=s, silhouette_null_mean=null.mean().item(), silhouette_null_p95=null.quantile(0.95).item(),
                silhouette_p=(1 + (null >= s).sum().item()) / (1 + n_perm))


def kmeans(X, k, restarts=10, iters=300, seed=0):
    """Lloyd's k-means on X (n, d) from `restarts` k-means++ seedings of one seeded generator: the labels of
    the restart with the least within-cluster sum of squares."""
    g, best = torch.Generator().manual_seed(seed), (float("inf"), None)
    for _ in range(restarts):
        C = X[torch.randint(len(X), (1,), generator=g)]
        for _ in range(k - 1):  # k-means++: the next centre with probability ~ squared distance to the nearest
            d2 = torch.cdist(X, C).pow(2).min(1).values
            C = torch.cat([C, X[torch.multinomial(d2 if d2.sum() > 0 else torch.ones_like(d2), 1, generator=g)]])
        for _ in range(iters):
            labels = torch.cdist(X, C).argmin(1)
            new = torch.stack([X[labels == j].mean(0) if (labels == j).any() else C[j] for j in range(k)])
            if torch.equal(new, C):
                break
            C = new
        labels = torch.cdist(X, C).argmin(1)
        sse = (X - C[labels]).pow(2).sum().item()
        if sse < best[0]:
            best = (sse, labels)
    return best[1]


def adjusted_rand_index(a, b):
    """ARI of two labellings (n,) (Hubert & Arabie 1985): (sum_ij C(n_ij, 2) - E) / (M - E), n_ij the
    contingency table, M = (sum_i C(a_i, 2) + sum_j C(b_j, 2)) / 2, E = sum_i C(a_i, 2) sum_j C(b_j, 2) / C(n, 2)
    the index expected by chance. 1: the same partition under any renaming; ~0: independent labels."""
    ai, bi = a.unique(return_inverse=True)[1], b.unique(return_inverse=True)[1]
    N = torch.zeros(int(ai.max()) + 1, int(bi.max()) + 1, dtype=torch.float64)
    N.index_put_((ai, bi), torch.ones(len(ai), dtype=torch.float64), accumulate=True)
    pairs = lambda x: (x * (x - 1) / 2).sum()
    index, sa, sb = pairs(N), pairs(N.sum(1)), pairs(N.sum(0))
    expected = sa * sb / pairs(torch.tensor(float(len(a)), dtype=torch.float64))
    if sa + sb == 2 * expected:  # both one cluster, or both all singletons: the same partition
        return 1.0
    return ((index - expected) / ((sa + sb) / 2 - expected)).item()


def manifold_stats(X, H, labels=None, max_points=3000, seed=42, position=None):
    """PCA statistics of representations X (n, d) with posterior entropies H (n,) in bits: PC1's (and PC2's)
    share of the variance (SVD of the centred points), the PCs for 90% / 95% of it, `corr_pc1` =
    |Pearson corr(PC1, H)|, `corr_pc1_position` = |corr(PC1, position)| (the token index t, if given), and
    `probe_r2`: a least-squares linear probe of H (with intercept) fitted on a random 80%, R^2 on the other
    20% (< 0: worse than the mean). With labels: their silhouette on the top-10 PCs of max_points points.
    Returns them and the points' first two PC coordinates."""
    Z, share = pca(X)
    cum = share.cumsum(0)
    r = dict(pc1_share=share[0].item(), pc2_share=share[1].item() if len(share) > 1 else 0.0,
             dims_90=int((cum < 0.9 - 1e-9).sum()) + 1, dims_95=int((cum < 0.95 - 1e-9).sum()) + 1,
             corr_pc1=abs_corr(Z[:, 0], H), probe_r2=probe_r2(X, H))
    if position is not None:
        r["corr_pc1_position"] = abs_corr(Z[:, 0], position.double())
    if labels is not None:
        sub = subsample(len(X), max_points, seed)
        r["silhouette"] = silhouette(Z[sub, :10], labels[sub])
    return r, Z[:, :2]


def subsample(n, max_points, seed=42):
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:max_points]


def state_clusters(X, states, k, max_points=3000, n_perm=200, seed=42):
    """Are there clusters, and are they the states? On the top-10 PCs of max_points of the points X (those
    of the silhouette in manifold_stats): the silhouette of the argmax states against n_perm permutations of
    them (silhouette_null); k-means with k clusters (kmeans): their adjusted Rand index against the states
    (`kmeans_ari`) and their own silhouette (`kmeans_silhouette`: clusters that are not the states)."""
    sub = subsample(len(X), max_points, seed)
    Z = pca(X)[0][sub, :10]
    km = kmeans(Z, k)
    return silhouette_null(Z, states[sub], n_perm) | dict(
        kmeans_k=k, kmeans_ari=adjusted_rand_index(km, states[sub]), kmeans_silhouette=silhouette(Z, km))


def js_bits(p, q):
    """Jensen-Shannon divergence in bits between distributions on the last dim, in [0, 1]."""
    m = (p + q) / 2
    kl = lambda a: torch.where(a > 0, a * (a.log() - m.log()), torch.zeros_like(a)).sum(-1)
    return (kl(p) + kl(q)) / (2 * math.log(2))

# -----------------------------------------------------------------------------
# the diagnostics: each returns (numbers for the JSON, a function drawing the figure)


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


def representations(model, batch):
    """[(name, (N, d) representation at the scored positions)]: `emb` (the embedding), `L1`.. (the residual
    after l blocks), `final` (after the final norm: what the head reads), and with attention `attn0`..
    (block l's att @ v, heads concatenated)."""
    _, inside = model(batch.x, return_internals=True)
    reps = [l["x"] for l in inside["layers"]] + [inside["final"]]
    names = ["emb"] + [f"L{i}" for i in range(1, len(reps) - 1)] + ["final"]
    for i, l in enumerate(inside["layers"]):
        if "att" in l:  # attention: its output, the attention-weighted values of all heads
            reps.append(rearrange(l["att"] @ l["v"], "b h t d -> b t (h d)"))
            names.append(f"attn{i}")
    return [(n, h[batch.mask]) for n, h in zip(names, reps)]


def final_streams(model, x):
    """(B, T, d) the last block's output before the final norm, and after it (what the head reads)."""
    norm = model.ln_f if hasattr(model, "ln_f") else model.norm_f
    seen = []
    hook = norm.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    try:
        _, inside = model(x, return_internals=True)
    finally:
        hook.remove()
    return seen[0], inside["final"]


def scored_entropy(task, batch):
    p = oracle(task, batch)[batch.mask]  # (N, C)
    return entropy_bits(p), p.argmax(-1)


def sites(task, batch):
    """{site: (B, T) mask} of the positions whose final representation is analysed: hmm, the observations
    (scored); bijection, the keys (scored, even t) and the values (odd t)."""
    if task.name != "bijection":
        return dict(observation=batch.mask)
    value = torch.zeros_like(batch.mask)
    value[:, 1::2] = True
    return dict(key=batch.mask, value=value)


def site_labels(task, batch, site):
    """(H, position, argmax state) at a site's positions: at a scored position its posterior's; at a bijection
    value (t odd) the preceding key's, the entropy before that value is seen (the authors' label)."""
    p = oracle(task, batch)  # (B, T, C), the scored positions filled
    if site == "value":
        p = torch.cat([torch.zeros_like(p[:, :1]), p[:, :-1]], 1)  # position t reads t - 1
    m = sites(task, batch)[site]
    return entropy_bits(p[m]), torch.arange(m.shape[1]).expand_as(m)[m], p[m].argmax(-1)


def final_layer(model, task, batch, args, by_state=False):
    """Per site (sites), the final layer's representation before and after the final norm: manifold_stats
    (with |corr(PC1, position)|), `corr_h_position` = |corr(H, position)| (bijection: H = log2(V - k) is a
    function of the position alone, so both correlations are high), and with by_state state_clusters."""
    before, after = final_streams(model, batch.x)
    out, coords = {}, {}
    for site, m in sites(task, batch).items():
        H, pos, states = site_labels(task, batch, site)
        out[site] = dict(n_points=len(H), corr_h_position=abs_corr(H, pos.double()))
        for name, X in (("before_norm", before[m]), ("after_norm", after[m])):
            stats, coords[site, name] = manifold_stats(X, H, position=pos)  # state_clusters: the silhouette
            if by_state:
                stats |= state_clusters(X, states, task.n_states, args.max_points, args.n_perm)
            out[site][name] = stats
    return out, coords


def manifold(model, task, batch, state, args, by_state=False):
    """values (Figs. 16-17; by_state=False) and clusters (v3 "five clusters", hmm; by_state=True): per
    representation (representations) at the scored positions, manifold_stats against the exact posterior
    entropy H (with the argmax state's silhouette for clusters); `final_layer`: the final layer at every
    site before and after the final norm (final_layer). Figure: PC1-2 of the points coloured by H (state)."""
    H, states = scored_entropy(task, batch)
    pos = torch.arange(batch.x.shape[1]).expand_as(batch.mask)[batch.mask]
    layers, coords = {}, {}
    for name, X in representations(model, batch):
        layers[name], coords[name] = manifold_stats(X, H, states if by_state else None, args.max_points, position=pos)
    final, final_coords = final_layer(model, task, batch, args, by_state)
    labels = {site: site_labels(task, batch, site) for site in final}

    def draw(plt):
        panels = [(n, "H") for n in layers] + [((s, b), "H") for s, b in final_coords] if not by_state else \
            [(("observation", b), c) for b in ("after_norm", "before_norm") for c in ("state", "H")]
        cols = min(len(panels), 5)
        rows = (len(panels) + cols - 1) // cols
        fig, axs = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.3 * rows), squeeze=False)
        for ax, (name, colour) in zip(axs.flat, panels):
            if isinstance(name, tuple):  # (site, before/after the final norm)
                (h, _, st), s = labels[name[0]], final[name[0]][name[1]]
                Z, label = final_coords[name], f"{name[0]}s, final layer {name[1].replace('_', ' ')}"
            else:
                h, st, s, Z, label = H, states, layers[name], coords[name], name
            sub = subsample(len(Z), args.max_points, 0)
            Z, h, st = Z[sub].numpy(), h[sub], st[sub]
            if colour == "state":
                pts = ax.scatter(Z[:, 0], Z[:, 1], c=st.numpy(), s=2, cmap="tab10", vmin=0, vmax=9)
                ax.legend(*pts.legend_elements(), title="state", fontsize=7)
                title = (f"{state['config']['model']} {label}, by argmax state\nsilhouette {s['silhouette']:.2f}"
                         + (f" (null p95 {s['silhouette_null_p95']:.2f}), k-means ARI {s['kmeans_ari']:.2f}"
                            if "kmeans_ari" in s else ""))
            else:
                sc = ax.scatter(Z[:, 0], Z[:, 1], c=h.numpy(), s=2, cmap="RdYlBu_r",
                                vmin=H.quantile(0.02).item(), vmax=H.quantile(0.98).item())
                title = (f"{label}: PC1 {100 * s['pc1_share']:.1f}%, R2 {s['probe_r2']:.2f}\n"
                         f"|corr(PC1,H)| {s['corr_pc1']:.2f}, |corr(PC1,t)| {s['corr_pc1_position']:.2f}")
            ax.set_title(title, fontsize=7)
        for ax in list(axs.flat)[len(panels):]:
            ax.axis("off")
        fig.colorbar(sc, ax=axs, label="posterior entropy H (bits)")
        return fig
    return dict(layers=layers, final_layer=final), draw


def entropy_mae(model, task, batch, **kw):
    m = Metrics()
    x = batch.x.double() if batch.x.is_floating_point() else batch.x  # real inputs (regression) meet a float64 model
    m.update(task, batch, model(x, **kw))
    return {k: v for k, v in m.result(task).items() if not isinstance(v, list) and k != "n_sequences"}


def concentration(delta):
    """The frame-head criterion of the authors' jlens reconcile_frame_head.py: the heads {"L{l}H{h}": damage},
    damage = entropy MAE with the head masked - without, ranked over every layer: the top and second heads,
    `top_over_second` = top / max(second, 1e-9), a `single_head_concentrated` top when >= 2, the heads above
    half the top's damage, and layer 0's top (`l0_top`); the same ratio within layer 0 (`l0_*`)."""
    rank = lambda heads: sorted(heads, key=delta.get, reverse=True)
    out = {}
    for prefix, ranked in (("", rank(delta)), ("l0_", rank([h for h in delta if h.startswith("L0H")]))):
        top, second = ranked[0], ranked[1] if len(ranked) > 1 else None
        ratio = delta[top] / max(delta[second], 1e-9) if second else None
        out |= {f"{prefix}top_head": top, f"{prefix}top_delta": delta[top], f"{prefix}second_head": second,
                f"{prefix}second_delta": delta[second] if second else None, f"{prefix}top_over_second": ratio,
                f"{prefix}single_head_concentrated": bool(second and delta[top] >= 2 * delta[second])}
    return out | dict(n_heads_above_half_top=sum(v > 0.5 * out["top_delta"] for v in delta.values()),
                      l0_top=out["l0_top_head"])


def ablate(model, task, batch, state, args):
    """Entropy MAE (both conventions, oracles.Metrics) with each layer skipped (output = input), each head
    masked (head_mask 0: the head's attention weights times 0) and every head of a layer masked (the attention
    then adds only its output projection's bias; with bias=False that is skipping the attention). `frame`
    (models with heads): the per-token MAE's increase per masked head and its concentration; with
    hypothesis keys also layer 0's most orthogonal head (jlens identify_frame_head: normed, mean |cos|)."""
    c = model.config
    base = entropy_mae(model, task, batch)
    rows = [dict(ablation=f"skip L{l}", **entropy_mae(model, task, batch, skip_layers={l})) for l in range(c.n_layer)]
    delta = {}
    if hasattr(c, "n_head"):  # models with a head_mask (transformer, linear_attn)
        for l, h in [(l, h) for l in range(c.n_layer) for h in [*range(c.n_head), None]]:
            mask = torch.ones(c.n_layer, c.n_head, dtype=torch.float64)
            mask[l, slice(None) if h is None else h] = 0
            name = f"mask L{l} all heads" if h is None else f"mask L{l}H{h}"
            rows.append(dict(ablation=name, **entropy_mae(model, task, batch, head_mask=mask)))
            if h is not None:
                delta[f"L{l}H{h}"] = rows[-1]["mae_token"] - base["mae_token"]
    for row in rows:
        row.update(ratio_token=row["mae_token"] / base["mae_token"], ratio_curve=row["mae_curve"] / base["mae_curve"])
    r = dict(baseline=base, ablations=rows)
    if delta:
        r["frame"] = dict(metric="mae_token", delta_mae=delta, **concentration(delta))
        if state["config"]["model"] in ATTENTION and not why_not("keys", state["config"], args.ckpt):
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


def dynamics(model, task, batch, state, args):
    """The frame-precision dissociation, over ckpt_*.pt and ckpt.pt of one run: the entropy MAE; attention
    similarity 1 - JS(att || att_final) in bits (scored rows, mean over heads and sequences) per layer; layer
    0's `weight` key mean |cos| (key_frame); the final layer's manifold_stats. Summary: the steps from which
    each layer's similarity stays >= --settle and the key |cos| within 10% of its end value; the MAE's fall
    after them."""
    H, _ = scored_entropy(task, batch)
    q_pos = batch.mask[0].nonzero().squeeze(1)
    maps = lambda inside: [l["att"][:, :, q_pos] for l in inside["layers"]]  # (B, H, Q, T) per layer
    final = maps(model(batch.x, return_internals=True)[1])
    rows = {}
    for path in glob.glob(os.path.join(args.ckpt, "ckpt_*.pt")) + [ckpt_path(args.ckpt)]:
        m, _, st = load(path)
        _, inside = m(batch.x, return_internals=True)
        Z = manifold_stats(inside["final"][batch.mask], H, max_points=args.max_points)[0]
        rows[st["iter"]] = dict(step=st["iter"], **entropy_mae(m, task, batch),
                                att_similarity=[1 - js_bits(a, b).mean().item() for a, b in zip(maps(inside), final)],
                                key_cos_l0=key_frame(m, hypothesis_tokens(task))[0][0].mean().item(), **Z)
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
    r = dict(steps=rows, summary=summary)

    def draw(plt):
        fig, axs = plt.subplots(1, 4, figsize=(17, 3.6))
        col = lambda k, l=None: [r[k] if l is None else r[k][l] for r in rows]
        panels = {"entropy MAE (bits)": {"per token": col("mae_token"), "mean-curve": col("mae_curve")},
                  "attention similarity to final (1 - JS)": {f"layer {l}": col("att_similarity", l)
                                                             for l in range(len(final))},
                  "layer-0 key mean |cos| (E W_K)": {"trained": col("key_cos_l0")},
                  "final-layer value manifold": {k: col(k) for k in ("pc1_share", "corr_pc1", "probe_r2")}}
        for ax, (title, curves) in zip(axs, panels.items()):
            for label, ys in curves.items():
                ax.plot(col("step"), ys, "o-", ms=3, label=label)
            ax.axvline(rows[att[0]]["step"], color="gray", ls=":")  # layer-0 attention settled
            ax.set(xscale="log", xlabel="training step", title=title)
            ax.legend(fontsize=8)
        axs[0].set_yscale("log")
        return fig
    return r, draw

# -----------------------------------------------------------------------------
# belief: a linear probe of the exact posterior vector (Shai et al. 2024)

RIDGE_ALPHAS = 10.0 ** torch.arange(-8, 2, dtype=torch.float64)  # relative ridge strengths, see ridge()
EPS = 1e-6  # floor of a probe's prediction: a negative probability would make the KL infinite


def ridge(X, Y, alphas):
    """[(W, b)] per alpha: W = (Xc^T Xc + lambda I)^-1 Xc^T Yc, b = mean(Y) - mean(X) W (the intercept is
    not penalised), lambda = alpha tr(Xc^T Xc) / d so that alpha does not depend on the scale of X."""
    mx, my = X.mean(0), Y.mean(0)
    Xc = X - mx
    G = Xc.T @ Xc
    e, Q = torch.linalg.eigh(G)  # one decomposition for the whole grid
    QXY = Q.T @ (Xc.T @ (Y - my))
    scale = (G.trace() / len(G)).clamp(min=torch.finfo(G.dtype).tiny)  # a constant X: W = 0
    return [(W, my - mx @ W) for W in (Q @ (QXY / (e.clamp(min=0) + a * scale)[:, None]) for a in alphas)]


def probe(X, Y, seq, B):
    """Ridge probe of Y (N, D) from X (N, d), points of sequences seq (N,) in range(B): alpha from RIDGE_ALPHAS
    by the squared error on sequences B/4..B/2 of a fit on those below B/4, then refitted on all below B/2.
    Returns alpha and the predictions (N', D) on the held-out sequences >= B/2."""
    fit, inner = seq < B // 2, seq < B // 4
    val = fit & ~inner
    err = torch.stack([(Y[val] - X[val] @ W - b).pow(2).sum() for W, b in ridge(X[inner], Y[inner], RIDGE_ALPHAS)])
    alpha = RIDGE_ALPHAS[int(err.argmin())]  # the first (smallest) on ties
    (W, b), = ridge(X[fit], Y[fit], [alpha])
    return alpha.item(), X[~fit] @ W + b


def r2(Y, P):
    """Pooled R^2 = 1 - sum |y - p|^2 / sum |y - mean(y)|^2 over points and outputs (< 0: worse than the mean)."""
    return (1 - (Y - P).pow(2).sum() / (Y - Y.mean(0)).pow(2).sum()).item()


def belief_target(task, batch):
    """(N, D) the exact posterior at the scored positions, row-major: a distribution, or (mean, log var)."""
    if task.gaussian:
        mean, var = oracle(task, batch)
        return torch.stack([mean[batch.mask], var[batch.mask].log()], -1)
    return oracle(task, batch)[batch.mask]


def belief_kl(task, Y, P):
    """(N,) KL(oracle || probe) in bits. Categorical: the probe clipped at EPS and renormalised;
    regression: KL(N(m, v) || N(m', exp(l'))) with the probe's (m', l')."""
    if task.gaussian:
        return gaussian_kl_bits(Y[:, 0], Y[:, 1].exp(), P[:, 0], P[:, 1].exp())
    q = P.clamp(min=EPS)
    q = q / q.sum(-1, keepdim=True)
    return (Y * (torch.where(Y > 0, Y.log(), torch.zeros_like(Y)) - q.log())).sum(-1) / LOG2


def belief(model, task, batch, state, args):
    """Is the whole posterior a linear function of the stream (Shai et al. 2024)? Target y: hmm, the filter's
    P(s_t | o_1..o_t); bijection, P(pi(k_t) = v); regression, the predictive (mean, log var). Per layer
    (`emb`, `L1`.., `final`), of the trained model, of its initialisation and of the token embeddings alone
    (wte(x_t)): a ridge probe y ~ X W + b (probe, ridge) fitted on the first half of the sequences, scored
    on the second: pooled R^2 (r2), and the mean KL(oracle || probe) in bits (belief_kl). `constant`: the
    fitting half's mean belief, for scale. Figure: the final layer's held-out predictions beside the truth
    (3 states: in the simplex, coloured by the true belief as RGB; else on the truth's PC1-2), R^2 and KL
    per layer."""
    B = len(batch.x)
    if B < 4:
        raise ValueError("belief needs --n_seq >= 4: sequences to fit, to choose the ridge strength and to score")
    Y, seq = belief_target(task, batch), batch.mask.nonzero()[:, 0]  # the sequence of every scored point
    test = seq >= B // 2

    def score(X):
        alpha, P = probe(X, Y, seq, B)
        return dict(r2=r2(Y[test], P), kl_bits=belief_kl(task, Y[test], P).mean().item(), alpha=alpha), P

    init = build_model(state, trained=False)
    streams = lambda m: [(n, X) for n, X in representations(m, batch) if not n.startswith("attn")]
    layers, pred = {}, {}
    for (name, X), (_, X0) in zip(streams(model), streams(init)):
        (trained, pred[name]), (fresh, _) = score(X), score(X0)
        layers[name] = dict(trained=trained, init=fresh)
    tokens, _ = score(model.wte(batch.x)[batch.mask])
    Yt, const = Y[test], Y[~test].mean(0).expand_as(Y[test])
    target = "(mean, log var)" if task.gaussian else \
        f"P over {Y.shape[1]} " + ("hidden states" if task.name == "hmm" else "values")
    r = dict(target=target, n_fit=int((~test).sum()), n_scored=int(test.sum()), eps=EPS, layers=layers, tokens=tokens,
             constant=dict(r2=r2(Yt, const), kl_bits=belief_kl(task, Yt, const).mean().item()))
    sub = torch.randperm(len(Yt), generator=torch.Generator().manual_seed(0))[:args.max_points]
    Yt, P = Yt[sub], pred["final"][sub]  # the final layer's held-out predictions

    def draw(plt):
        fig, axs = plt.subplots(1, 4, figsize=(16, 3.8))
        names, cfg_model = list(layers), state["config"]["model"]
        for ax, k in zip(axs[:2], ("r2", "kl_bits")):
            for who in ("trained", "init"):
                ax.plot(names, [layers[n][who][k] for n in names], "o-", label=f"{who} model")
            ax.axhline(tokens[k], color="gray", ls="--", label="token embeddings")
            ax.set(xlabel="layer", title=f"held-out probe {'R2' if k == 'r2' else 'KL (bits)'} of the belief")
        axs[1].axhline(r["constant"]["kl_bits"], color="k", ls=":", label="constant (mean belief)")
        axs[1].set_yscale("log")
        axs[1].legend(fontsize=8)
        if task.gaussian:
            for ax, i, label in ((axs[2], 0, "predictive mean"), (axs[3], 1, "predictive log variance")):
                ax.scatter(Yt[:, i].numpy(), P[:, i].numpy(), s=2, c=Yt[:, 1].numpy(), cmap="viridis")
                ax.axline((0, 0), slope=1, color="k", lw=0.8)
                ax.set(xlabel=f"oracle {label}", ylabel="probe", title=f"probe of the final layer ({cfg_model})")
            return fig
        if Y.shape[1] == 3:  # barycentric coordinates: the 2-simplex as a triangle, the belief as RGB
            corners = torch.tensor([[0, 0], [1, 0], [0.5, 3 ** 0.5 / 2]], dtype=torch.float64)
            xy, colour, axes = lambda p: p @ corners, dict(c=Yt.clamp(0, 1).numpy()), ("", "")
        else:  # both on the truth's principal axes, coloured by the truth's PC1
            mu = Yt.mean(0)
            Vh = torch.linalg.svd(Yt - mu, full_matrices=False)[2][:2]
            xy, axes = lambda p: (p - mu) @ Vh.T, ("PC1 of the true beliefs", "PC2")
            colour = dict(c=xy(Yt)[:, 0].numpy(), cmap="viridis")
        both = torch.cat([xy(Yt), xy(P)] + ([corners] if Y.shape[1] == 3 else []))  # the same axes in both panels
        pad = 0.05 * (both.max(0).values - both.min(0).values)
        lo, hi = (both.min(0).values - pad).numpy(), (both.max(0).values + pad).numpy()
        for ax, p, title in ((axs[2], Yt, "true belief"), (axs[3], P, f"probe of the final layer ({cfg_model})")):
            if Y.shape[1] == 3:
                ax.plot(*corners[[0, 1, 2, 0]].T.numpy(), color="k", lw=0.8)
                for i, corner in enumerate(corners.tolist()):  # hidden states, or bijection values
                    ax.annotate(f"{'s' if task.name == 'hmm' else 'v'}{i}", corner, textcoords="offset points",
                                xytext=(0, 4), ha="center")
                ax.set_aspect("equal")
                ax.axis("off")
            ax.scatter(*xy(p).T.numpy(), s=2, **colour)
            ax.set(title=title, xlabel=axes[0], ylabel=axes[1], xlim=(lo[0], hi[0]), ylim=(lo[1], hi[1]))
        return fig
    return r, draw


RUN = dict(keys=keys, qk=qk, values=manifold, dynamics=dynamics, ablate=ablate,
           clusters=partial(manifold, by_state=True), belief=belief)

# -----------------------------------------------------------------------------
# one recipe over several seeds


def named(which, k):  # geometry_keys.json: layer 0 of a named key statistic (NAMED_VARIANTS)
    return lambda d: d["named"][which][k]


def signed(heads, k):  # geometry_keys.json: layer 0 of the signed mean cos of the raw hypothesis keys
    pick = lambda d: next(r for r in d["variants"] if (r["tokens"], r["input"], r["statistic"], r["heads"])
                          == ("hypothesis", "raw", "signed", heads))
    return lambda d: pick(d)[k] if k == "floor" else pick(d)[k][0]


def final(site, k):  # geometry_values.json: the final layer after its norm at the bijection's key or value sites
    return lambda d: d["final_layer"][site]["after_norm"][k]


SEED_FIGURES = {  # the claims table's figures: name -> (diagnostic, what to read from its JSON)
    "keys: mean |cos|, value tokens, raw, mean over heads": ("keys", named("ours", "trained")),
    "keys: the same at init": ("keys", named("ours", "init")),
    "keys: the same, Gaussian keys of the head width": ("keys", named("ours", "gaussian")),
    "keys: mean |cos| through the norm, min over heads": ("keys", named("identify_frame_head", "trained")),
    "keys: through the norm, min over heads, at init": ("keys", named("identify_frame_head", "init")),
    "keys: signed mean, mean over heads": ("keys", signed("mean", "trained")),
    "keys: signed mean, min over heads": ("keys", signed("min", "trained")),
    "keys: signed mean at init": ("keys", signed("mean", "init")),
    "keys: the signed floor -1/(n-1)": ("keys", signed("mean", "floor")),
    "keys: signed mean over every id (the authors' qkv_analysis.py)": ("keys", named("qkv_analysis", "trained")),
    "keys: its floor": ("keys", named("qkv_analysis", "floor")),
    "entropy MAE per token (these sequences)": ("ablate", lambda d: d["baseline"]["mae_token"]),
    "frame: damage of the top head / the second": ("ablate", lambda d: d["frame"]["top_over_second"]),
    "frame: the same within layer 0": ("ablate", lambda d: d["frame"]["l0_top_over_second"]),
    "error x with layer l skipped (per token)":
        ("ablate", lambda d: [a["ratio_token"] for a in d["ablations"] if a["ablation"].startswith("skip")]),
    "attention entropy by layer (bits)": ("qk", lambda d: [l["att_entropy_bits"] for l in d["layers"]]),
    "values at value positions, after the norm: PC1 share": ("values", final("value", "pc1_share")),
    "|corr(PC1, H)| at value positions": ("values", final("value", "corr_pc1")),
    "values at key positions, after the norm: PC1 share": ("values", final("key", "pc1_share")),
    "|corr(PC1, H)| at key positions": ("values", final("key", "corr_pc1")),
    "|corr(PC1, position)| at key positions": ("values", final("key", "corr_pc1_position")),
    "layer-0 attention settled at step": ("dynamics", lambda d: d["summary"]["attention_settled_step"][0]),
    "entropy MAE's fall after that": ("dynamics", lambda d: d["summary"]["mae_improvement_after_attention"][0]),
}


def spread(values):  # per figure: each seed's, their mean, min and max (elementwise for per-layer lists)
    if isinstance(values[0], list):
        cols = [spread(list(c)) for c in zip(*values)]
        return dict(values=values, **{k: [c[k] for c in cols] for k in ("mean", "min", "max")})
    return dict(values=values, mean=sum(values) / len(values), min=min(values), max=max(values))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def seeds(argv):
    """`geometry.py seeds RUN ... --out DIR`: the claims table's figures (SEED_FIGURES) over runs of one recipe
    with different seeds, each analysed by `geometry.py all` first: every seed's value, the mean, min and max,
    in DIR/geometry_seeds.json and as a table. A figure that a run's diagnostics lack is left out."""
    p = Parser(prog="geometry.py seeds", description=seeds.__doc__.split(":")[0], allow_abbrev=False)
    p.add_argument("runs", nargs="+", help="the runs' out_dirs, each with its geometry_<diagnostic>.json")
    p.add_argument("--out", required=True, help="folder for geometry_seeds.json")
    args = p.parse_args(argv)
    runs, read = [], {}
    for run in args.runs:
        found = {n: os.path.join(run, f"geometry_{n}.json") for n in DIAGNOSTICS}
        found = {n: f for n, f in found.items() if os.path.exists(f)}
        if not found:
            p.exit(2, f"geometry.py seeds: error: no geometry_*.json in {run} (first: geometry.py all --ckpt {run})\n")
        result = os.path.join(run, "results.json")
        meta = read_json(result) if os.path.exists(result) else {}
        runs.append(dict(run=run, seed=meta.get("seed"), iter=meta.get("iter")))
        read[run] = {n: read_json(f) for n, f in found.items()}
    figures = {}
    for name, (n, get) in SEED_FIGURES.items():
        try:
            figures[name] = spread([get(read[run][n]) for run in args.runs])
        except (KeyError, IndexError, StopIteration, TypeError):  # a diagnostic or site this task lacks
            continue
    write_json(os.path.join(args.out, "geometry_seeds.json"), to_json(dict(runs=runs, figures=figures)))
    f = lambda x: "[" + ", ".join(f(v) for v in x) + "]" if isinstance(x, list) else f"{x:.4g}"
    print(f"| figure | mean | min | max | {' | '.join(str(r['seed']) for r in runs)} |")
    print("|---" * (4 + len(runs)) + "|")
    for name, s in figures.items():
        cells = [name.replace("|", "\\|")] + [f(v) for v in [s["mean"], s["min"], s["max"], *s["values"]]]
        print(f"| {' | '.join(cells)} |")
    print(f"wrote {os.path.join(args.out, 'geometry_seeds.json')}")
    return 0


# -----------------------------------------------------------------------------
# command line


def why_not(name, cfg, path):
    """None if the diagnostic applies to this checkpoint, else the reason."""
    model, task = cfg["model"], cfg["task"]
    if name in ("keys", "qk", "dynamics") and model not in ATTENTION:
        return f"{name} needs a model with softmax attention ({', '.join(ATTENTION)}), not {model!r}"
    if name in ("values", "dynamics") and task not in ENTROPY_TASKS:
        return f"{name} needs a task whose posterior entropy varies ({', '.join(ENTROPY_TASKS)}), not {task!r}"
    if name == "clusters" and task != "hmm":
        return f"clusters needs an hmm checkpoint (hidden states), not {task!r}"
    if name == "belief" and task not in BELIEF_TASKS:
        what = dict(recall="the bound value", hop="the k-hop successor").get(task, "one answer")
        return (f"belief needs a task whose posterior is a vector ({', '.join(BELIEF_TASKS)}): "
                f"{task}'s is a point mass on {what}, nothing to probe")
    if name in ("keys", "qk") and task not in ("bijection", "hmm", "recall", "hop"):
        return f"{name} needs a task with hypothesis tokens, not {task!r}"
    if name == "dynamics" and not glob.glob(os.path.join(path, "ckpt_*.pt")):
        return f"dynamics needs snapshot checkpoints ckpt_*.pt in {path} (train with --ckpt_schedule log)"
    return None


def to_json(x):  # NaN (e.g. the silhouette of a single cluster) -> null
    if isinstance(x, dict):
        return {k: to_json(v) for k, v in x.items()}
    return [to_json(v) for v in x] if isinstance(x, list) else None if x != x else x


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["seeds"]:
        return seeds(argv[1:])
    p = Parser(prog="geometry.py", description=__doc__.split("\n\n")[0].strip(), allow_abbrev=False)
    p.add_argument("diagnostic", choices=DIAGNOSTICS + ("all",),
                   help="which diagnostic (all: every one that applies); `geometry.py seeds --help`: over seeds")
    p.add_argument("--ckpt", required=True, help="a run's out_dir (its ckpt.pt) or a checkpoint file")
    p.add_argument("--n_seq", type=int, default=200, help="held-out sequences to analyse")
    p.add_argument("--seed", type=int, default=None, help="seed of those sequences (default: the run's eval_seed)")
    p.add_argument("--max_points", type=int, default=3000, help="points in the scatter plots and the silhouette")
    p.add_argument("--key_tokens", default="hypothesis", choices=("hypothesis", "vocab"),
                   help="keys: the hypothesis tokens (paper) or every token id (authors' qkv_analysis)")
    p.add_argument("--settle", type=float, default=0.95, help="dynamics: attention similarity that counts as settled")
    p.add_argument("--K", type=int, default=None,
                   help="hmm: observations per sequence (default: the run's; the authors' five-cluster figure: 15)")
    p.add_argument("--n_perm", type=int, default=200, help="clusters: label permutations in the silhouette's null")
    p.add_argument("--no_plot", action="store_true", help="write the JSON only")
    args = p.parse_args(argv)
    try:
        if args.n_seq < 2 or args.max_points < 2 or args.n_perm < 1:
            raise ValueError("--n_seq and --max_points must be >= 2, --n_perm >= 1")
        if not 0 <= args.settle <= 1:  # NaN too
            raise ValueError(f"--settle must be in [0, 1] (an attention similarity 1 - JS, in bits), got {args.settle}")
        model, task, state = load(args.ckpt)
        if not all(torch.isfinite(p).all() for p in model.parameters()):  # a diverged run's: every number NaN
            print(f"geometry.py: error: the parameters in {ckpt_path(args.ckpt)} are not finite (step "
                  f"{state['iter']}): nothing to analyse", file=sys.stderr)
            return 1
        cfg, path = state["config"], ckpt_path(args.ckpt)
        if args.K is not None:
            if cfg["task"] != "hmm":
                raise ValueError(f"--K applies to hmm checkpoints only, not {cfg['task']!r}")
            task = make_task("hmm", **cfg["task_opts"] | dict(K=args.K))
        names = [n for n in DIAGNOSTICS if args.diagnostic in (n, "all") and not why_not(n, cfg, args.ckpt)]
        if args.diagnostic != "all" and why_not(args.diagnostic, cfg, args.ckpt):
            raise ValueError(why_not(args.diagnostic, cfg, args.ckpt))
        seed = cfg["train"]["eval_seed"] if args.seed is None else args.seed
        batch = task.sample(args.n_seq, torch.Generator().manual_seed(seed))
        if batch.x.is_floating_point():  # regression's real inputs, for the float64 model
            batch.x = batch.x.double()
        plt = None if args.no_plot else pyplot()
        if plt is not None:
            plt.rcParams["figure.constrained_layout.use"] = True
        elif not args.no_plot:  # the figures are optional, the JSON is not
            print("matplotlib is not installed: writing the JSON only")
        stem = os.path.splitext(os.path.basename(path))[0]
        for n in names:
            with torch.no_grad():
                r, draw = RUN[n](model, task, batch, state, args)
            base = os.path.join(os.path.dirname(path), f"geometry_{n}" + ("" if stem == "ckpt" else f"_{stem}"))
            head = dict(diagnostic=n, ckpt=path, task=cfg["task"], model=cfg["model"], iter=state["iter"],
                        n_seq=args.n_seq, seed=seed) | (dict(K=task.K) if task.name == "hmm" else {})
            write_json(base + ".json", to_json(head | r))
            if plt is not None:
                fig = draw(plt)
                write_file(base + ".png", lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
                plt.close(fig)
            print(f"wrote {base}.json" + (" and .png" if plt is not None else ""))
    except ValueError as e:
        p.exit(2, f"geometry.py: error: {e}\n")
    except OSError as e:  # a full or read-only disk: every file is written whole or not at all (write_file)
        print(f"geometry.py: error: {f'{e.filename}: {e.strerror}' if e.filename else e}; the files written "
              f"before are kept", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    cli(main, "geometry.py", "the diagnostics already written are kept")
