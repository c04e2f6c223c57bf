"""
The float64 statistics of geometry.py's diagnostics: functions of tensors only, no model and no task, each
checkable on its own (tests/test_geometry.py, tests/test_belief.py). In float64 since the diagnostics are.

- offdiag_cos: the mean (|)cos(|) over the n(n-1) off-diagonal pairs of n rows; signed it is >= -1/(n-1);
- pca (SVD of the centred points), abs_corr (|Pearson|), probe_r2 (held-out R^2 of a least-squares probe),
  manifold_stats (all three on one set of representations against the posterior entropy H);
- silhouette (b - a) / max(a, b), its permutation null (silhouette_null), Lloyd's k-means from k-means++
  seedings (kmeans), the adjusted Rand index (adjusted_rand_index), and state_clusters, which joins them;
- js_bits: the Jensen-Shannon divergence in bits, in [0, 1];
- ridge and probe: the belief probe's ridge regression, its strength chosen on held-out sequences; r2: pooled R^2.
"""
from functools import partial
import math

import torch
import torch.nn.functional as F

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


def r2(Y, P):
    """Pooled R^2 = 1 - sum |y - p|^2 / sum |y - mean(y)|^2 over points and outputs (< 0: worse than the mean)."""
    return (1 - (Y - P).pow(2).sum() / (Y - Y.mean(0)).pow(2).sum()).item()
