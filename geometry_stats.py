"""
The float64 statistics of geometry.py's diagnostics: functions of tensors only, no model and no task, each
checkable on its own (tests/test_geometry.py, tests/test_belief.py). In float64 since the diagnostics are.
Last, the authors' own protocols (vishalmisra/bayesian-wind-tunnel at 670c6d6), which read a model's streams
the way their scripts do, so that our numbers and theirs stand side by side.

- offdiag_cos: the mean (|)cos(|) over the n(n-1) off-diagonal pairs of n rows; signed it is >= -1/(n-1);
- pca (SVD of the centred points), abs_corr (|Pearson|), probe_r2 (held-out R^2 of a least-squares probe),
  manifold_stats (all three on one set of representations against the posterior entropy H);
- silhouette (b - a) / max(a, b), its permutation null (silhouette_null), Lloyd's k-means from k-means++
  seedings (kmeans), the adjusted Rand index (adjusted_rand_index), and state_clusters, which joins them;
- ridge and probe: the belief probe's ridge regression, its strength chosen on held-out sequences; r2: pooled R^2;
  belief_kl: its KL from the true belief in bits.

The authors' value manifold (the paper's "final-layer PC1 holds 84-90%"), three protocols; H at a value
position is the preceding key's entropy log2(V - i), before the value is seen (their label, :26-53), and PCA
centres without scaling (sklearn), a share being an eigenvalue over the total variance:
- geometric (geometric_analysis.py:76-178): after the final norm, the value positions t = 1, 3, .. of 3,200
  sequences; PCA(10); dim_90 from those 10 (their script prints 1 when 10 do not reach 90%: here None); the
  correlation is the largest |r| of PC1..PC5 with H;
- manifold (manifold_visualization.py:41-110, 209-233): the last block's output BEFORE the final norm at the
  value positions of 2,560 sequences, 3,000 rows drawn at random; PCA(2); |corr(PC1, H)|; the script whose
  figure titles carry "PC1 %";
- qkv (qkv_analysis.py:256-318): after the final norm at the key positions of the sequence of
  generate_no_replacement_sequence (:85-90), which reseeds numpy with 1337 on every call, so its 100 sequences
  are one: 19 distinct points, H = log2(V - i) at the i-th key.
The frame head (concentration, jlens reconcile_frame_head.py): how far ablate's most damaging head leads the rest.
Last, from the diagnostics' numbers: the headline figures of values, clusters and belief (geometry.FIGURES), and
the claims table's spread of figures over seeds (claims).
"""
import copy
from functools import partial
import time

import torch
import torch.nn.functional as F

from oracles import LOG2, Metrics, entropy_bits, gaussian_kl_bits, oracle
from runtime import say_eta

# -----------------------------------------------------------------------------
# points: cosines, principal axes, linear probes, clusters


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
    D, g, t0 = pairwise(X), torch.Generator().manual_seed(seed), time.time()
    s, null = silhouette_d(D, labels), torch.empty(n_perm, dtype=torch.float64)  # 8 bytes a permutation
    for i in range(n_perm):
        if i == 10:
            say_eta("--n_perm", n_perm, i, n_perm, t0)
        null[i] = silhouette_d(D, labels[torch.randperm(len(labels), generator=g)])
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


# -----------------------------------------------------------------------------
# the belief probe: ridge regression with its strength chosen on held-out sequences

RIDGE_ALPHAS = 10.0 ** torch.arange(-8, 2, dtype=torch.float64)  # relative ridge strengths, see ridge()


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


BELIEF_EPS = 1e-6  # floor of a probe's prediction: a negative probability would make the KL infinite


def belief_kl(Y, P, gaussian=False):
    """(N,) KL(truth || probe) in bits per row: categorical, the probe clipped at BELIEF_EPS and renormalised;
    gaussian (rows (mean, log var)), KL(N(m, v) || N(m', exp(l'))) with the probe's (m', l')."""
    if gaussian:
        return gaussian_kl_bits(Y[:, 0], Y[:, 1].exp(), P[:, 0], P[:, 1].exp())
    q = P.clamp(min=BELIEF_EPS)
    q = q / q.sum(-1, keepdim=True)
    return (Y * (torch.where(Y > 0, Y.log(), torch.zeros_like(Y)) - q.log())).sum(-1) / LOG2


def r2(Y, P):
    """Pooled R^2 = 1 - sum |y - p|^2 / sum |y - mean(y)|^2 over points and outputs (< 0: worse than the mean)."""
    return (1 - (Y - P).pow(2).sum() / (Y - Y.mean(0)).pow(2).sum()).item()


# -----------------------------------------------------------------------------
# the authors' protocols: the value manifold three ways, the frame ratio (module docstring)

GEOMETRIC_N_SEQ, MANIFOLD_N_SEQ, MANIFOLD_POINTS = 3200, 2560, 3000
QKV_N_SEQ = 100  # qkv_analysis.py:266: 100 calls of a generator that returns one sequence


def final_streams(model, x):
    """(B, T, d) the last block's output before the final norm, and after it (what the head reads); a model with
    no final norm (ln_f or norm_f), a model from a file, gives its final stream for both."""
    norm = getattr(model, "ln_f", None) or getattr(model, "norm_f", None)
    if norm is None:
        return (model(x, return_internals=True)[1]["final"],) * 2
    seen = []
    hook = norm.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    try:
        _, inside = model(x, return_internals=True)
    finally:
        hook.remove()
    return seen[0], inside["final"]


def pca_shares(X, k):
    """(scores (N, k), shares (k,)): sklearn's PCA(k).fit_transform and explained_variance_ratio_."""
    U, S, _ = torch.linalg.svd(X - X.mean(0), full_matrices=False)
    return U[:, :k] * S[:k], (S ** 2 / (S ** 2).sum())[:k]


def corr(a, b):
    """np.corrcoef(a, b)[0, 1]; 0 where either is constant (manifold_visualization.py:227-229 sets NaN to 0)."""
    a, b = a - a.mean(), b - b.mean()
    den = (a.pow(2).sum() * b.pow(2).sum()).sqrt()
    return (a @ b / den).item() if den > 0 else 0.0


def protocol_geometric(X, H):
    Z, share = pca_shares(X, 10)
    reached = (share.cumsum(0) >= 0.9).nonzero()
    rs = [corr(Z[:, i], H) for i in range(5)]
    best = max(range(5), key=lambda i: abs(rs[i]))
    return dict(n_points=len(X), pc1_share=share[0].item(), pc2_share=share[1].item(),
                dim_90=int(reached[0]) + 1 if len(reached) else None, abs_corr=abs(rs[best]), which_pc=best + 1)


def protocol_manifold(X, H, seed=0):
    idx = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))[:MANIFOLD_POINTS]
    Z, share = pca_shares(X[idx], 2)
    return dict(n_points=len(idx), pc1_share=share[0].item(), pc2_share=share[1].item(),
                abs_corr=abs(corr(Z[:, 0], H[idx])))


def protocol_qkv(X, H):
    Z, share = pca_shares(X, 2)
    return dict(n_points=len(X), n_distinct=len(torch.unique(X, dim=0)), pc1_share=share[0].item(),
                pc2_share=share[1].item(), abs_corr=abs(corr(Z[:, 0], H)))


def value_rows(model, task, n_seq, seed, draw=250):
    """(before, after, H): the final stream before and after the final norm at the value positions t = 1, 3, ..
    of n_seq sequences drawn `draw` at a time from `seed` (as train.py draws its held-out ones), in float32 as
    the authors' arrays are; H at a value position is the preceding key's entropy."""
    g, rows, Hs, m32 = torch.Generator().manual_seed(seed), [], [], copy.deepcopy(model).float()
    for i in range(0, n_seq, draw):
        x = task.sample(min(draw, n_seq - i), g).x
        rows.append([h[:, 1::2].reshape(-1, h.shape[-1]) for h in final_streams(m32, x)])  # (B (L - 1), d)
        Hs.append(torch.log2(task.V - torch.arange(x.shape[1] // 2, dtype=torch.float64)).repeat(len(x)))
    before, after = (torch.cat(r).double() for r in zip(*rows))
    return before, after, torch.cat(Hs)


def qkv_sequence(task):
    """The one sequence of qkv_analysis.py's generator (:85-90; numpy's default_rng(1337): a permutation of the
    V values, then the first L of a permutation of the keys), in our layout (values offset by V, ending at the
    last key). numpy only here, for the authors' exact draw."""
    import numpy as np
    rng = np.random.default_rng(1337)
    perm, keys = list(range(task.V)), list(range(task.V))
    rng.shuffle(perm)
    rng.shuffle(keys)
    return torch.tensor([[t for k in keys[:task.L] for t in (k, task.V + perm[k])][:-1]])


def value_protocols(model, task, seed):
    """The three protocols on one bijection model (separate layout); the sequences of `geometric` and `manifold`
    are the first 3,200 and 2,560 drawn from `seed`."""
    before, after, H = value_rows(model, task, GEOMETRIC_N_SEQ, seed)
    n = MANIFOLD_N_SEQ * (task.L - 1)  # the manifold protocol's sequences are the first 2,560 of them
    X = final_streams(model, qkv_sequence(task))[1][0, 0::2].repeat(QKV_N_SEQ, 1)  # the keys, 100 times
    H_qkv = torch.log2(task.V - torch.arange(task.L, dtype=torch.float64)).repeat(QKV_N_SEQ)
    return dict(geometric=protocol_geometric(after, H), manifold=protocol_manifold(before[:n], H[:n]),
                qkv=protocol_qkv(X, H_qkv))


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


# -----------------------------------------------------------------------------
# the claims table's figures over seeds of one recipe (geometry.py seeds)


def values_figures(r):
    """values' figures for the claims table (geometry.py seeds): the final layer after its norm at each site, the
    bijection's value and key positions, hmm's observations."""
    out = {}
    for site in (s for s in ("value", "key", "observation") if s in r["final_layer"]):
        after = r["final_layer"][site]["after_norm"]
        out |= {f"values at {site} positions, after the norm: PC1 share": after["pc1_share"],
                f"|corr(PC1, H)| at {site} positions": after["corr_pc1"]}
        if site != "value":
            out[f"|corr(PC1, position)| at {site} positions"] = after["corr_pc1_position"]
    return out


def clusters_figures(r):
    """clusters' figures: the observations' final layer after its norm, by argmax state."""
    s = r["final_layer"]["observation"]["after_norm"]
    return {"silhouette by argmax state": s["silhouette"], "its null's 95th percentile": s["silhouette_null_p95"],
            "k-means ARI": s["kmeans_ari"]}


def belief_figures(r):
    """belief's figures: the held-out probe of the final layer, trained and at initialisation."""
    final = r["layers"]["final"]
    return {"belief probe R2, final layer": final["trained"]["r2"], "the same at init": final["init"]["r2"],
            "belief probe KL (bits), final layer": final["trained"]["kl_bits"]}


def spread(values):  # per figure: each seed's, their mean, min and max (elementwise for per-layer lists)
    if isinstance(values[0], list):
        cols = [spread(list(c)) for c in zip(*values)]
        return dict(values=values, **{k: [c[k] for c in cols] for k in ("mean", "min", "max")})
    return dict(values=values, mean=sum(values) / len(values), min=min(values), max=max(values))


def claims(runs, found, diagnostics):
    """({figure: spread over the runs}, {figure: what lacks it}) in the claims table's order (diagnostics): a figure is
    missing where a run's diagnostic did not write it, its value is null (does not apply, or NaN), or the run has no
    such diagnostic at all. Runs of different depths are a ValueError: their per-layer figures do not line up."""
    figures, missing = {}, {}
    for n in diagnostics:
        names = dict.fromkeys(k for f in found for k in f.get(n, {}))  # every run's, in the diagnostic's order
        if not names:
            missing[f"every {n} figure"] = dict(diagnostic=n, runs=[r["run"] for r in runs])
        for name in names:
            values = [f.get(n, {}).get(name) for f in found]
            lacking = [r["run"] for r, v in zip(runs, values) if v is None or isinstance(v, list) and None in v]
            if lacking:
                missing[name] = dict(diagnostic=n, runs=lacking)
            elif all(isinstance(v, list) for v in values) and len({len(v) for v in values}) > 1:
                raise ValueError(f"{name}: the runs have {[len(v) for v in values]} layers; seeds of one recipe "
                                 f"only (one model size)")
            else:
                figures[name] = spread(values)
    return figures, missing

# -----------------------------------------------------------------------------
# a model's metrics on one batch (the ablations and the dynamics), and how far two attention maps are


def entropy_mae(model, task, batch, **kw):
    """The metrics of model(x, **kw) on one batch, without the curves and standard errors (the ablations)."""
    m = Metrics()
    x = batch.x.double() if batch.x.is_floating_point() else batch.x  # real inputs (regression) meet a float64 model
    m.update(task, batch, model(x, **kw))
    return {k: v for k, v in m.result(task).items()
            if not isinstance(v, list) and k != "n_sequences" and not k.endswith("_se")}


def key_positions_mae(model, task, batch, **kw):
    """The bijection query layout's per-token MAE at its key positions only, its final query (the recall of a
    seen key) left out: the authors' statistic for that layout (jlens reconcile_frame_head.py,
    paired_calibration_mae: every prefix k1 v1 .. k_t, the entropy at k_t against log2(V - t + 1))."""
    keys = batch.mask.clone()
    keys[:, -1] = False
    H_model = entropy_bits(F.softmax(task.answers(model(batch.x, **kw)).double(), -1)[keys])
    return (H_model - entropy_bits(oracle(task, batch)[keys])).abs().mean().item()


def js_bits(p, q):
    """Jensen-Shannon divergence in bits between distributions on the last dim, in [0, 1]."""
    m = (p + q) / 2
    kl = lambda a: torch.where(a > 0, a * (a.log() - m.log()), torch.zeros_like(a)).sum(-1)
    return (kl(p) + kl(q)) / (2 * LOG2)
