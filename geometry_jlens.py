"""
The authors' statistics of their dense bijection run (vishalmisra/bayesian-wind-tunnel experiments/jlens at
670c6d6, run_phase5.py), computed the way their scripts compute them, so that `geometry.py trajectory` sets ours
beside theirs step for step. All four read their batch: 256 sequences of python random.Random(444)
(data_gen.py:105-202), keys at the even positions, the V value logits.

- jlens_mae (calibration.py eval_entropy_mae): the mean |H_model - log2(V - t)| over the key positions;
- a J-space (extract.py:162-270, the "stacked" reduction): the top-r eigenvectors of sum g g^T, g = d logit[p', v]
  / d h[i] over the sequences, every later position p' and the V value logits, at one residual site and one
  position i; the sites are the stream into block 0 ("emb") and each block's output ("0", "1", ..);
- frame_ratio (run_phase5.py:108-111): the mean projection overlap ||U^T W||_F^2 / min(r, k) of the rank-8
  J-spaces of the carrying band (emb and block 0, every key position with a later one) with the final model's
  frame W (geometry_attention.frame_basis), over the same for 500 random 8-dim subspaces (seed 123);
- j_overlap (run_phase5.py:112-116, `jspace_overlap_with_final`): the mean projection overlap of the same
  J-spaces with the final model's, pair by pair;
- elimination (run_phase5.py:117-121, metrics.py:159-196, `elim_balanced_acc_mid`): at block 1's output and the
  middle key position, the residuals projected on that snapshot's rank-24 J-space; for each value v whose label
  varies there, a binary logistic probe of "v eliminated by a completed pair at or before this position" (L2,
  C = 1, class weights balanced: sklearn's LogisticRegression, here by Newton's method in float64), fitted on
  70% of the sequences (numpy default_rng(0)'s permutation) and scored on the rest by balanced accuracy; the
  mean over v.
"""
import copy
import random

import numpy as np
import torch
import torch.nn.functional as F

from oracles import entropy_bits

# The authors' dense rerun of their recipe (jlens experiments/jlens/results/phase5_dense_summary.json, at 670c6d6):
# step: (calibration MAE in bits, frame ratio to null, J-space overlap with the final model, elimination
# balanced accuracy), the last three against their step-50,000 model (the probe needs no final model)
AUTHORS_DENSE = {
    100: (2.82456, 1.017, 0.068, 0.508), 200: (0.77779, 1.024, 0.067, 0.500), 300: (1.04358, 2.264, 0.094, 0.537),
    400: (0.91253, 3.649, 0.128, 0.553), 500: (0.64876, 4.217, 0.158, 0.585), 600: (0.35219, 4.608, 0.195, 0.622),
    700: (0.2007, 4.910, 0.245, 0.632), 800: (0.14197, 5.126, 0.271, 0.635), 900: (0.11498, 5.312, 0.292, 0.656),
    1000: (0.08603, 5.445, 0.306, 0.661), 1500: (0.06473, 5.948, 0.366, 0.733), 2000: (0.04337, 6.239, 0.404, 0.774),
    2500: (0.03162, 6.317, 0.445, 0.801), 3000: (0.03693, 6.208, 0.475, 0.789), 3500: (0.03626, 6.202, 0.500, 0.793),
    4000: (0.02154, 6.275, 0.510, 0.789), 4500: (0.01828, 6.328, 0.521, 0.791), 5000: (0.02257, 6.350, 0.530, 0.787),
    6000: (0.01248, 6.430, 0.556, 0.768), 7000: (0.01011, 3.192, 0.325, 0.765), 8000: (0.01873, 4.990, 0.536, 0.765),
    9000: (0.01244, 3.897, 0.400, 0.764), 10000: (0.00933, 5.020, 0.510, 0.763),
    15000: (0.00565, 6.231, 0.639, 0.760), 20000: (0.00504, 6.410, 0.687, 0.768),
    25000: (0.0036, 5.749, 0.665, 0.762), 30000: (0.00316, 5.878, 0.709, 0.761),
    35000: (0.00216, 5.734, 0.781, 0.752), 40000: (0.00138, 5.552, 0.840, 0.766),
    45000: (0.0009, 5.637, 0.918, 0.762), 50000: (0.00078, 5.635, 1.000, 0.766)}
AUTHORS_COLUMNS = ("mae", "frame_ratio", "j_overlap", "elimination")

RANK, PROBE_RANK = 8, 24  # the carrying band's J-spaces; the elimination probe's

# -----------------------------------------------------------------------------
# their batch and its labels


def jlens_tokens(task, n_seq, seed=444):
    """The tokens of jlens data_gen.py:105-202 generate_batch (python random.Random(seed)), our separate layout:
    per sequence a shuffled permutation, L keys sampled without replacement, `k1 V+pi(k1) .. kL`."""
    rng, rows = random.Random(seed), []
    for _ in range(n_seq):
        perm = list(range(task.V))
        rng.shuffle(perm)
        keys = rng.sample(range(task.V), task.L)
        rows.append([t for k in keys for t in (k, task.V + perm[k])][:-1])
    return torch.tensor(rows)


def eliminated(x, V):
    """(B, T, V) bool: value v was revealed by a completed pair at or before position i (data_gen.py:174-180),
    read from the tokens: the value tokens V + v at the odd positions (keys are below V)."""
    return F.one_hot(x, 2 * V)[..., V:].cumsum(1) > 0


def jlens_mae(model, task, x):
    """jlens calibration.py eval_entropy_mae: the mean |H_model - log2(V - t)| over the key positions of x
    (jlens_tokens), the model's entropy over the answers (task.answers: the value slice of a whole-vocabulary head)."""
    H = entropy_bits(F.softmax(task.answers(model(x))[:, 0::2].double(), -1))
    return (H - torch.log2(task.V - torch.arange(H.shape[1], dtype=torch.float64))).abs().mean().item()

# -----------------------------------------------------------------------------
# J-spaces


def jspace_grams(model, x, task, blocks=1, chunk=32):
    """(1 + blocks, T, d, d) stacked Grams at the stream into block 0 and the outputs of blocks 0 .. blocks - 1:
    for every later position p' and each answer v (task.answers), g = d out[p', v] / d h[i]. The parameters are
    frozen meanwhile, as the authors freeze them (extract.py:201-203)."""
    B, T, n_logits = *x.shape, task.n_classes
    grams, frozen = None, [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    try:
        for s in range(0, B, chunk):
            b = len(x[s:s + chunk])
            rows, which = torch.arange(n_logits * b), torch.arange(n_logits).repeat_interleave(b)  # row j*b+n: logit j
            seen = []
            hooks = [model.blocks[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].requires_grad_()))]
            hooks += [model.blocks[l].register_forward_hook(lambda m, a, out: seen.append(out)) for l in range(blocks)]
            try:
                with torch.enable_grad():
                    out = task.answers(model(x[s:s + chunk].repeat(n_logits, 1)))
            finally:
                for h in hooks:
                    h.remove()
            if grams is None:
                grams = torch.zeros(1 + blocks, T, seen[0].shape[-1], seen[0].shape[-1], dtype=torch.float64)
            for p in range(T - 1, 0, -1):  # target p' = p reaches the positions i < p
                cot = torch.zeros_like(out)
                cot[rows, p, which] = 1.0
                for site, g in enumerate(torch.autograd.grad(out, seen, cot, retain_graph=p > 1)):
                    g = g[:, :p].double()
                    grams[site, :p] += torch.einsum("rid,rie->ide", g, g)
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    return grams


def top_subspace(gram, rank):
    """(d, rank) the Gram's top eigenvectors: a J-space."""
    return torch.linalg.eigh(gram)[1][:, -rank:]


def projection_overlap(U, W):
    """||U^T W||_F^2 / min(r1, r2) of two orthonormal bases (metrics.py:30-34): 1 where the smaller subspace lies
    inside the larger, 0 where they are orthogonal."""
    return (torch.linalg.svdvals(U.T @ W) ** 2).sum().item() / min(U.shape[1], W.shape[1])


def band(grams, rank=RANK):
    """The carrying band's J-spaces: at emb and block 0's output (sites 0, 1), every key position with a later one."""
    return [top_subspace(grams[site, i], rank) for site in range(2) for i in range(0, grams.shape[1] - 1, 2)]


def jlens_ratio(grams, frame, rank=RANK, n_null=500):
    """The carrying band's mean projection overlap with the frame (d, k), over that of n_null random rank-dim
    subspaces: 1 for J-spaces no closer to the frame than chance."""
    Us = band(grams, rank)
    g = torch.Generator().manual_seed(123)
    nulls = torch.linalg.qr(torch.randn(n_null, frame.shape[0], rank, generator=g).double()).Q
    obs = sum(projection_overlap(U, frame) for U in Us) / len(Us)
    null = sum(projection_overlap(U, frame) for U in nulls) / n_null
    return dict(frame_ratio=obs / null, overlap=obs, null_overlap=null, n_jspaces=len(Us))


def j_overlap(grams, final_grams, rank=RANK):
    """The mean projection overlap of the carrying band's J-spaces with the final model's, position by position:
    1 for a model compared with itself."""
    pairs = list(zip(band(grams, rank), band(final_grams, rank)))
    return sum(projection_overlap(U, W) for U, W in pairs) / len(pairs)


def frame_ratio(model, frame, x, task, rank=RANK, n_null=500):
    """frame_ratio_to_null (run_phase5.py:108-111) of a model on the sequences x: jlens_ratio of its jspace_grams."""
    grams = jspace_grams(copy.deepcopy(model).float(), x, task)  # float32, as the authors' models
    return jlens_ratio(grams, frame, rank, n_null) | dict(n_seq=len(x))

# -----------------------------------------------------------------------------
# the elimination probe


def logistic_fit(X, y, C=1.0, iters=100, tol=1e-12):
    """sklearn's LogisticRegression(C=C, class_weight="balanced") objective, minimised by Newton's method in
    float64: 0.5 ||w||^2 + C sum_i s_i log(1 + exp(-(2 y_i - 1)(x_i w + b))), the intercept b unpenalised, s_i =
    n / (2 n_{y_i}). Strictly convex: Newton from zero converges in a few steps. Returns (w, b)."""
    X, y = X.double(), y.double()
    s = len(y) / (2 * torch.where(y > 0, y.sum(), (1 - y).sum()))
    Z = torch.cat([X, torch.ones(len(X), 1, dtype=torch.float64)], 1)
    reg = torch.ones(Z.shape[1], dtype=torch.float64)
    reg[-1] = 0.0  # the intercept is not penalised
    theta = torch.zeros(Z.shape[1], dtype=torch.float64)
    for _ in range(iters):
        p = torch.sigmoid(Z @ theta)
        grad = reg * theta + C * Z.T @ (s * (p - y))
        hess = torch.diag(reg) + C * (Z.T * (s * p * (1 - p))) @ Z
        step = torch.linalg.solve(hess, grad)
        theta = theta - step
        if step.abs().max() < tol:
            break
    return theta[:-1], theta[-1].item()


def balanced_accuracy(y, pred):
    """The mean over the classes present of the fraction of each predicted right (sklearn's)."""
    return sum((pred[y == c] == c).double().mean().item() for c in y.unique()) / len(y.unique())


def elimination_probe(coords, elim, train_frac=0.7, seed=0):
    """metrics.py elimination_probes: coords (B, r), elim (B, V) bool. Per value whose label varies, the probe
    fitted on the first 70% of numpy default_rng(seed)'s permutation of the rows, scored on the rest; a value
    with one class only in either part is left out (theirs: NaN, dropped). (mean, min balanced accuracy, n)."""
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(coords)))
    tr, te = order[:int(train_frac * len(coords))], order[int(train_frac * len(coords)):]
    accs = []
    for v in range(elim.shape[1]):
        y = elim[:, v].long()
        if y[tr].unique().numel() < 2 or y[te].unique().numel() < 2:
            continue
        w, b = logistic_fit(coords[tr], y[tr])
        accs.append(balanced_accuracy(y[te], (coords[te].double() @ w + b > 0).long()))
    if not accs:
        return dict(elimination=None, elimination_min=None, n_probes=0)
    return dict(elimination=sum(accs) / len(accs), elimination_min=min(accs), n_probes=len(accs))


def residual(model, x, block):
    """(B, T, d) block `block`'s output on x, detached."""
    out = []
    hook = model.blocks[block].register_forward_hook(lambda m, a, o: out.append(o.detach()))
    try:
        with torch.no_grad():
            model(x)
    finally:
        hook.remove()
    return out[0]


def jlens_stats(model, task, x, frame, final_grams=None, n_grams=None):
    """At one checkpoint, on their batch x: the frame ratio against `frame`, the J-overlap with final_grams (the
    final model's jspace_grams; None: this is the final model, overlap 1), and the elimination probe. The Grams
    come from the first n_grams sequences (theirs: all 256), the probe reads all of x. Returns (stats, grams)."""
    if len(model.blocks) < 2:
        raise ValueError(f"the elimination probe reads block 1's output: this model has {len(model.blocks)} block")
    m32 = copy.deepcopy(model).float()  # float32, as the authors' models
    grams = jspace_grams(m32, x[:n_grams], task, blocks=2)
    key_pos = range(0, x.shape[1], 2)
    mid = key_pos[len(key_pos) // 2]  # theirs: key_pos[len(key_pos) // 2]
    U = top_subspace(grams[2, mid], PROBE_RANK)  # block 1's output
    coords = residual(m32, x, 1)[:, mid].double() @ U
    stats = dict(frame=jlens_ratio(grams, frame) | dict(n_seq=len(x[:n_grams])),
                 j_overlap=j_overlap(grams, final_grams if final_grams is not None else grams),
                 **elimination_probe(coords, eliminated(x, task.V)[:, mid]), probe_position=mid)
    return stats, grams
