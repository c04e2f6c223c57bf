"""
Exact Bayesian posterior predictives of the built-in wind tunnels, entropies in bits, the metrics, and a check of
any tunnel's posterior against its own sampler.

A posterior reads the inputs x alone (and the task's options): what the model sees, never the latents a batch was
drawn from, since a predictor that knows them is calibrated for what it knows and is not the posterior. Each gives
its predictive at every position of x, in float64 (only the scored ones are read):
- bijection: a key seen before has a point mass on its value; an unseen key is uniform over the values not
  yet shown, so after t distinct pairs H = log2(V - t) (layout query: the final query is a context key);
- hmm: the forward filter alpha_t(s) ∝ E(o_t | s) sum_s' T(s | s') alpha_{t-1}(s'), from a uniform alpha_0,
  in log space, of the matrices the header states (in cents; see hmm_header);
- regression: the conjugate posterior Sigma_t = (X^T X / sigma^2 + I / tau^2)^-1, mu_t = Sigma_t X^T y /
  sigma^2 over the pairs before t; predictive N(mu_t^T x_t, sigma^2 + x_t^T Sigma_t x_t);
- recall: a point mass on the value stored with the queried key;
- hop: a point mass on succ^k(e), the query entity e followed k times through the facts in context
  (succ(a) = b for each fact a -> b), so H = 0 at every query.
Categorical posteriors are (B, T, C) probabilities; Gaussian ones a pair (mean, var), each (B, T). `oracle(task,
batch)` is task.posterior(batch.x) with the unscored positions zeroed (mean 0, var 1), for the metrics.

`Metrics` compares a model's predictions with the posterior over evaluation batches, in bits (its docstring
defines each metric, each with its standard error over sequences). Entropies of Gaussians are differential:
H = 1/2 log2(2 pi e var).

`check` (`python oracles.py check bijection`, or `check FILE.py:Class`) holds a posterior against sequences of its
own task's sampler; its docstring says what it tests and why.
"""
import argparse
from dataclasses import MISSING, fields
import importlib
import math
import sys
import time

import torch
import torch.nn.functional as F

from commandline import Parser, str2bool

LOG2 = math.log(2)


def hmm_filter(trans, emit, obs):
    """Filtering posteriors P(s_t | o_1..o_t), (B, K, S), float64, in log space.
    trans (B, S, S) with trans[b, i, j] = P(s_{t+1}=j | s_t=i); emit (B, S, O); obs (B, K)."""
    log_T, log_E = trans.double().log(), emit.double().log()
    B, S, K = trans.shape[0], trans.shape[1], obs.shape[1]
    log_e = log_E.gather(2, obs.unsqueeze(1).expand(B, S, K)).transpose(1, 2)  # (B, K, S) log E(o_t | s)
    log_alpha = torch.full((B, S), -math.log(S), dtype=torch.float64, device=trans.device)  # uniform prior
    out = []
    for t in range(K):
        if t > 0:  # predict: sum_s' alpha(s') T(s' -> s)
            log_alpha = torch.logsumexp(log_alpha.unsqueeze(-1) + log_T, dim=1)
        log_alpha = log_alpha + log_e[:, t]  # update with o_t
        log_alpha = log_alpha - torch.logsumexp(log_alpha, -1, keepdim=True)
        out.append(log_alpha)
    return torch.stack(out, 1).exp()


def uniform(x, C):
    """(B, T, C) uniform rows: a posterior's value where nothing is scored."""
    return torch.full((*x.shape[:2], C), 1 / C, dtype=torch.float64, device=x.device)


def bijection_posterior(task, x):
    """Over pi(k) at each key k, given the pairs shown before it: each of the L keys after the pairs before it,
    then (layout query) the query after all L pairs."""
    L, V = task.L, task.V
    keys = x[:, 0:2 * L:2]  # (B, L)
    shown = x[:, 1:2 * L:2] - task.answer_offset  # (B, S) the values shown, S = L - 1 (separate) or L (query)
    vals = F.one_hot(shown.clamp(0, V - 1), V).double()  # (B, S, V)
    query, n_before = keys, torch.arange(L, device=x.device)  # (B, Q) the keys asked, (Q,) pairs shown before each
    if task.layout == "query":
        query, n_before = torch.cat([keys, x[:, -1:]], 1), torch.cat([n_before, n_before[-1:] + 1])
    before = (torch.arange(shown.shape[1], device=x.device) < n_before[:, None]).double()  # (Q, S): pair j shown
    used = torch.einsum("qs,bsv->bqv", before, vals).clamp(max=1)  # values shown before each query
    match = (query.unsqueeze(2) == keys[:, None, :shown.shape[1]]) * before  # (B, Q, S): its key shown as pair j
    seen = match.sum(-1, keepdim=True) > 0
    point = torch.einsum("bqs,bsv->bqv", match, vals).clamp(max=1)  # a key seen twice shows the same value
    unseen = (1 - used) / (1 - used).sum(-1, keepdim=True).clamp(min=1)  # uniform over the unused: H = log2(V - t)
    post, out = torch.where(seen, point, unseen), uniform(x, V)
    out[:, 0:2 * L:2] = post[:, :L]
    if task.layout == "query":
        out[:, -1] = post[:, L]
    return out


def hmm_header(cents, floor=0.25):
    """A header's rows in cents as probabilities: exactly the matrices under the default cents grid (rows of
    whole cents summing to 100). discretize=False states each entry rounded to a cent: the rows are
    renormalised and an entry stated as 0 is read as `floor` cents, the middle of what rounds to 0, so that an
    event the header calls impossible is not (what the check finds of that reading: results/tunnels.md)."""
    p = cents.double().clamp(min=floor)
    return p / p.sum(-1, keepdim=True)


def hmm_posterior(task, x):
    """The filter over the hidden state at each observation, of the matrices the header states."""
    S, O, h = task.n_states, task.n_obs, task.header_len
    trans = hmm_header(x[:, 1:1 + S * S].reshape(-1, S, S))
    emit = hmm_header(x[:, 2 + S * S:2 + S * S + S * O].reshape(-1, S, O))
    out = uniform(x, S)
    out[:, h + 1::2] = hmm_filter(trans, emit, (x[:, h + 1::2] - task.symbol_offset).clamp(0, O - 1))
    return out


def regression_posterior(task, x):
    """Predictive (mean, var), each (B, T), of y_t given x_t (query token 2t) and the pairs before it (tokens
    2j + 1, j < t): [x_j, y_j, 0]."""
    x = x.double()
    d, B, K = task.d, x.shape[0], task.K
    xs, ys = x[:, 1::2, :d], x[:, 1::2, d]  # (B, K, d), (B, K): the pairs
    s2, t2 = task.noise_std ** 2, task.prior_std ** 2
    mean, var = torch.zeros(B, 2 * K, dtype=torch.float64), torch.ones(B, 2 * K, dtype=torch.float64)
    for t in range(K):
        X, y, q = xs[:, :t], ys[:, :t], x[:, 2 * t, :d]
        precision = X.transpose(1, 2) @ X / s2 + torch.eye(d, dtype=torch.float64) / t2  # Sigma_t^-1
        Sigma = torch.linalg.inv(precision)
        mu = Sigma @ (X.transpose(1, 2) @ y.unsqueeze(-1)) / s2  # (B, d, 1)
        mean[:, 2 * t] = (q.unsqueeze(1) @ mu).view(B)
        var[:, 2 * t] = s2 + (q.unsqueeze(1) @ Sigma @ q.unsqueeze(-1)).view(B)
    return mean, var


def recall_posterior(task, x):
    """A point mass on the value stored with the key at each position after the store (`STORE k SEP v` x N);
    a key the store does not hold (in no sequence the task draws) is uniform."""
    C, start = task.n_classes, 4 * task.n_pairs
    keys, vals = x[:, 1:start:4], (x[:, 3:start:4] - task.answer_offset).clamp(0, C - 1)  # (B, N)
    match = (x[:, start:, None] == keys[:, None, :]).double()  # (B, T - 4N, N): the stored pair each position names
    found = match.sum(-1, keepdim=True) > 0
    out = uniform(x, C)
    out[:, start:] = torch.where(found, (match @ F.one_hot(vals, C).double()).clamp(max=1), out[:, start:])
    return out


def hop_posterior(task, x):
    """A point mass on succ^k(e) at each query entity e, read off the facts in the context (not the latent
    chains); an entity no fact leads on from (in no sequence the task draws) is uniform."""
    off, N, C = task.answer_offset, task.n_facts, task.n_classes
    facts = (x[:, :2 * N].reshape(-1, N, 2) - off).clamp(0, C - 1)  # (a, b) entity pairs
    succ = torch.full((x.shape[0], C), -1, dtype=torch.long, device=x.device).scatter(1, facts[..., 0], facts[..., 1])
    e, k = x[:, 2 * N + 2::2] - off, x[:, 2 * N + 1::2]  # (B, M) the query entities and their hop tokens (k)
    e = e.clamp(0, C - 1)
    for i in range(task.hops):
        nxt = succ.gather(1, e.clamp(min=0))
        e = torch.where((k > i) & (e >= 0), nxt, e)
    out = uniform(x, C)
    out[:, 2 * N + 2::2] = torch.where(e[..., None] >= 0, F.one_hot(e.clamp(min=0), C).double(), 1 / C)
    return out


def oracle(task, batch):
    """The exact posterior predictive at every scored position, the others zeroed (mean 0 and var 1): categorical
    (B, T, C) probabilities, or Gaussian (mean, var), each (B, T)."""
    if not task.drew(batch.x):
        opts = ", ".join(f"{k}={v}" for k, v in task.options().items())
        raise ValueError(f"oracle: the batch was not drawn from this task ({task.name}: {opts}); "
                         "sample it with task.sample")
    m, post = batch.mask, task.posterior(batch.x)
    if task.gaussian:
        return tuple(torch.where(m.to(p.device), p, fill).double().cpu() for p, fill in zip(post, (0.0, 1.0)))
    return torch.where(m.to(post.device)[..., None], post, 0.0).double().cpu()


def entropy_bits(p):
    """H = -sum p log2 p over the last dim, with 0 log 0 = 0."""
    return -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1) / LOG2


def gaussian_entropy_bits(var):
    return 0.5 * torch.log2(2 * math.pi * math.e * var)


def gaussian_kl_bits(m0, v0, m1, v1):
    """KL(N(m0, v0) || N(m1, v1)) in bits."""
    return 0.5 * (torch.log(v1 / v0) + (v0 + (m0 - m1) ** 2) / v1 - 1) / LOG2

# -----------------------------------------------------------------------------
# the metrics of a model against the posterior, over evaluation batches


class Metrics:
    """Accumulates model-vs-oracle statistics over evaluation batches; `result()` gives, in bits:
    - mae_curve: the paper's "mean-curve" entropy MAE: average model and oracle entropy over
      sequences at each query position first, then mean over positions of |difference|;
    - mae_token: mean over every scored (sequence, position) of |H_model - H_oracle| (>= mae_curve);
    - kl: KL(oracle || model) per scored position (the exact Gaussian KL for regression);
    - accuracy: argmax against the realised answer (task.outcome: bijection and recall the value, hop the
      successor, hmm the hidden state); oracle_accuracy is the Bayes decision's expected accuracy, mean of max_c p(c);
    - <metric>_se: each one's standard error over the sequences, which are independent where positions are not
      (mae_curve's by the delta method: the sequences' mean signed differences, signed as the curve's);
    - n_sequences, curve_model and curve_oracle (the mean entropy at each query position), and for
      recall accuracy_by_slot (by the queried pair's place in the store)."""

    def __init__(self):
        self.n = 0  # scored tokens
        self.seqs = 0
        self.sums = dict(oracle_correct=0.0)
        self.rows = dict(diff=[], abs=[], kl=[], correct=[])  # per sequence: (B, Q) entropy differences, means
        self.curve_model = self.curve_oracle = 0  # per query position sums
        self.by_slot = 0  # recall: (correct, queries) per stored pair

    @torch.no_grad()
    def update(self, task, batch, out):
        m = batch.mask.cpu()
        B, Q = m.shape[0], int(m[0].sum())
        post = oracle(task, batch)
        # on the CPU first (MPS has no float64); of a head over every token, the answers' logits
        out = task.answers(task.check_output(out, m.shape).detach().cpu().double())
        if task.gaussian:
            mean, var = post
            q_mean, q_var = out[..., 0][m], out[..., 1][m].exp()
            H_model, H_oracle = gaussian_entropy_bits(q_var), gaussian_entropy_bits(var[m])
            kl = gaussian_kl_bits(mean[m], var[m], q_mean, q_var)
        else:
            p = post[m]
            log_q = F.log_softmax(out[m], -1)
            H_model, H_oracle = entropy_bits(log_q.exp()), entropy_bits(p)
            kl = (p * (torch.where(p > 0, p.log(), torch.zeros_like(p)) - log_q)).sum(-1) / LOG2
            hit = log_q.argmax(-1) == task.outcome(batch).cpu()[m]
            self.rows["correct"].append(hit.double().view(B, Q).mean(1))
            if "slot" in batch.latent:  # recall: accuracy by the queried pair's place in the store
                slot, N = batch.latent["slot"].cpu().reshape(-1), task.n_pairs
                self.by_slot += torch.stack([torch.bincount(slot, hit.double(), N), torch.bincount(slot, minlength=N)])
            self.sums["oracle_correct"] += p.max(-1).values.sum().item()
        diff = (H_model - H_oracle).view(B, Q)
        self.rows["diff"].append(diff)
        self.rows["abs"].append(diff.abs().mean(1))
        self.rows["kl"].append(kl.view(B, Q).mean(1))
        self.curve_model = self.curve_model + H_model.view(B, Q).sum(0)
        self.curve_oracle = self.curve_oracle + H_oracle.view(B, Q).sum(0)
        self.n += B * Q
        self.seqs += B

    def result(self, task):
        rows = {k: torch.cat(v) for k, v in self.rows.items() if v}
        cm, co = self.curve_model / self.seqs, self.curve_oracle / self.seqs
        se = lambda z: (z.std() / math.sqrt(len(z))).item() if len(z) > 1 else math.inf  # over sequences
        r = dict(mae_curve=(cm - co).abs().mean().item(), mae_token=rows["abs"].mean().item(),
                 kl=rows["kl"].mean().item(), n_sequences=self.seqs)
        signed = (rows["diff"] * (cm - co).sign()).mean(1)  # each sequence's share of the curve's error
        r.update(mae_curve_se=se(signed), mae_token_se=se(rows["abs"]), kl_se=se(rows["kl"]))
        if not task.gaussian:
            r.update(accuracy=rows["correct"].mean().item(), accuracy_se=se(rows["correct"]),
                     oracle_accuracy=self.sums["oracle_correct"] / self.n)
        if torch.is_tensor(self.by_slot):
            r.update(accuracy_by_slot=(self.by_slot[0] / self.by_slot[1].clamp(min=1)).tolist())
        r.update(curve_model=cm.tolist(), curve_oracle=co.tolist())
        return r


def batch_mae(task, batch, out):
    """A training batch's per-token entropy MAE (bits), for train.py's progress line."""
    (m := Metrics()).update(task, batch.to("cpu"), out.float())
    return m.result(task)["mae_token"]

# -----------------------------------------------------------------------------
# a posterior held against its own task's sampler: `python oracles.py check TASK`
#
# If q(. | x<=t) is the true conditional of the scored target y_t, then over sequences the task draws: (i) the mean
# surprisal of the realised target equals the mean entropy of q, E[-log q(y)] = E[H(q)]; (ii) q is calibrated: the
# answers it gives probability near pi occur with frequency pi, and (ii') so they do among the positions that share
# an input: the token (or each real feature) at t, t - 1 and t - 2; (iii) for a Gaussian q, the standardised
# residuals z = (y - mu) / sigma have mean 0 and variance 1 (their share of (i)); (iv) q is causal: splicing one
# sequence's prefix onto another's suffix changes no posterior before the splice. (ii') is there because the exact
# posterior of an observer who forgets something (a filter one observation behind, a count one pair short) is
# calibrated for what it keeps and passes (i)-(iii): only the inputs it ignores tell it apart. Each statistic is
# a mean over sequences (independent, where positions are not) with its standard error; one fails at |z| > 4,
# a family of K cells at the Bonferroni bound of the same level. A wrong posterior that reads only x but is right
# on average everywhere the tests look can pass: the check refutes, it cannot prove.

Z_FAIL = 4.0  # two-sided 6e-5 a statistic: a correct posterior fails one of a check's dozen about once in 1,000
GAP_BITS = 0.01  # the gap in (i) the number of sequences is chosen to detect, with probability POWER
POWER = 0.9
LAGS = 3  # (ii'): the inputs at t, t - 1, t - 2
BINS = 10  # (ii): of the probability q gives an answer (categorical), or of Phi(z) (Gaussian)


class Broken(ValueError):
    """A task that breaks the contract (README, "Bring your own task"), naming the line it breaks."""


def contract(task, batch, post):
    """The batch and posterior of a task as the contract states them, or Broken naming what differs."""
    B, T = batch.mask.shape[:2] if hasattr(batch, "mask") else (None, None)
    for ok, line in (
            (all(hasattr(batch, k) for k in ("x", "y", "mask", "latent")), "sample() returns a tasks.Batch"),
            (batch.mask.dtype == torch.bool and batch.mask.dim() == 2, "Batch.mask is (B, T) bool"),
            (T == task.seq_len, f"Batch.x has seq_len = {task.seq_len} positions (it has {T})"),
            (batch.mask.any(1).all(), "every sequence has a scored position (Batch.mask)"),
            ((batch.mask.sum(1) == batch.mask[0].sum()).all(), "every sequence has as many scored positions")):
        if not ok:
            raise Broken(f"{task.name}: {line}")
    x = batch.x
    if task.vocab_size:
        ok = x.dim() == 2 and not x.is_floating_point() and bool((x >= 0).all() and (x < task.vocab_size).all())
        want = f"Batch.x is (B, T) int64 tokens in [0, vocab_size={task.vocab_size})"
    else:
        ok, want = x.dim() == 3 and x.shape[2] == task.n_features and x.is_floating_point(), \
            f"Batch.x is (B, T, n_features={task.n_features}) floats"
    if not ok or x.shape[:2] != (B, T):
        raise Broken(f"{task.name}: {want}; got {tuple(x.shape)} {x.dtype}")
    y, m = task.outcome(batch), batch.mask
    if not (torch.is_tensor(y) and y.shape[:2] == (B, T) and (y.dim() == 2)):
        raise Broken(f"{task.name}: outcome(batch) (batch.y unless the task defines it) is (B, T), the realised value "
                     f"of what is scored; got {getattr(y, 'shape', type(y).__name__)}"
                     + (" (a task trained on distributions defines outcome)" * bool(task.soft_targets)))
    if task.gaussian:
        ok = isinstance(post, tuple) and len(post) == 2 and all(torch.is_tensor(p) and p.shape == (B, T) for p in post)
        if not ok or any(p.dtype != torch.float64 for p in post):
            raise Broken(f"{task.name}: posterior(x) of a Gaussian task returns (mean, var), each (B, T) = {(B, T)} "
                         f"float64")
        mean, var = (p[m] for p in post)
        if not (torch.isfinite(mean).all() and torch.isfinite(var).all() and (var > 0).all()):
            raise Broken(f"{task.name}: posterior(x)'s mean and var are finite and var > 0 at the scored positions")
        return
    want = (B, T, task.n_classes)
    if not (torch.is_tensor(post) and tuple(post.shape) == want and post.dtype == torch.float64):
        got = f"{tuple(post.shape)} {post.dtype}" if torch.is_tensor(post) else type(post).__name__
        raise Broken(f"{task.name}: posterior(x) returns float64 probabilities (B, T, C) = {want}; got {got}")
    p = post[m]
    if not (torch.isfinite(p).all() and (p >= 0).all() and torch.allclose(p.sum(-1), torch.ones_like(p[:, 0]))):
        raise Broken(f"{task.name}: posterior(x) is finite, >= 0 and sums to 1 at every scored position")
    if ((y[m] < 0) | (y[m] >= task.n_classes)).any():
        raise Broken(f"{task.name}: outcome(batch) holds a class in [0, n_classes={task.n_classes}) where scored")


def inputs(task, x, lags=LAGS):
    """(B, T, lags) the token at t, t - 1, .. (-1 before the start), or (B, T, lags * F) the real features."""
    shifted = [torch.cat([torch.full_like(x[:, :j], -1 if task.vocab_size else 0), x[:, :x.shape[1] - j]], 1)
               for j in range(lags)]
    return torch.stack(shifted, 2) if task.vocab_size else torch.cat(shifted, -1).double()


def residuals(task, batch, post):
    """Per sequence: {(i): mean surprisal - entropy over its scored positions (bits), (ii): the residual sums
    1[y = c] - q_c by bin of q_c (Gaussian: 1[Phi(z) in bin] - 1/BINS), (iii): mean z and z^2 - 1}, the
    (ii') residuals and the cells they fall in, and the number of realised outcomes given probability 0."""
    m, y, B = batch.mask, task.outcome(batch), batch.mask.shape[0]
    Q = int(m[0].sum())
    per = lambda v: v.view(B, Q, *v.shape[1:])  # scored positions, in order, per sequence
    if task.gaussian:
        mean, var = (p[m].cpu() for p in post)
        z = (y[m].double().cpu() - mean) / var.sqrt()
        u = 0.5 * (1 + torch.erf(z / math.sqrt(2)))  # Phi(z): uniform under the posterior
        bins = F.one_hot((u * BINS).long().clamp(max=BINS - 1), BINS).double() - 1 / BINS
        stats = dict(gap=per(0.5 * (z ** 2 - 1) / LOG2).mean(1), calib=per(bins).sum(1),
                     z_mean=per(z).mean(1), z_var=per(z ** 2 - 1).mean(1))
        r, zero = torch.stack([z, z ** 2 - 1], -1), 0  # (N, 2): (ii') of both
    else:
        q, yc = post[m].cpu(), y[m].cpu()
        qy = q.gather(1, yc[:, None]).squeeze(1)
        zero = int((qy <= 0).sum())
        surprisal = -torch.log2(qy.clamp(min=1e-300))
        r = F.one_hot(yc, task.n_classes).double() - q  # (N, C)
        inside = (q > 0) & (q < 1)  # a point mass on the realised answer says nothing of calibration
        k = (q * BINS).long().clamp(max=BINS - 1)
        calib = torch.zeros(len(q), BINS, dtype=torch.float64).scatter_add(1, k, torch.where(inside, r, 0.0))
        stats = dict(gap=per(surprisal - entropy_bits(q)).mean(1), calib=per(calib).sum(1))
    return stats, r, inputs(task, batch.x)[m].cpu(), per, zero


class Cells:
    """(ii'): running sums over sequences of each cell's per-sequence residual sum, a cell being (lag, token at that
    lag, class) for tokens, or (lag, feature, class) where the residual is weighted by a real feature."""

    def __init__(self):
        self.s1, self.s2, self.count, self.n = {}, {}, {}, 0

    def add(self, task, r, feats, per, B):
        """r (N, R) residuals (R classes, or z and z^2 - 1), feats (N, lags) tokens or (N, lags * F) features."""
        R = r.shape[1]
        if task.vocab_size:  # cell = ((lag * vocab + token) * R + class), its sum per sequence
            lags = torch.arange(feats.shape[1])
            cell = ((lags * task.vocab_size + feats) * R)[:, :, None] + torch.arange(R)  # (N, lags, R)
            seq = torch.arange(B).repeat_interleave(len(r) // B)[:, None, None].expand_as(cell)
            ok = (feats >= 0)[:, :, None].expand_as(cell)  # no token before the start
            n_cells = LAGS * task.vocab_size * R
            keys, inv = torch.unique((seq * n_cells + cell)[ok], return_inverse=True)
            sums = torch.zeros(len(keys), dtype=torch.float64).index_add_(0, inv, r[:, None, :].expand_as(cell)[ok])
            cells, counts = keys % n_cells, torch.bincount(inv, minlength=len(keys))
        else:  # dense: every (feature, class) of every sequence
            w = per(feats[:, :, None] * r[:, None, :]).sum(1).reshape(B, -1)  # (B, lags * F * R)
            cells, sums, counts = torch.arange(w.shape[1]).repeat(B), w.reshape(-1), torch.ones(w.numel())
        for c, s, n in zip(cells.tolist(), sums.tolist(), counts.tolist()):
            self.s1[c], self.s2[c] = self.s1.get(c, 0.0) + s, self.s2.get(c, 0.0) + s * s
            self.count[c] = self.count.get(c, 0) + n
        self.n += B

    def worst(self, min_count=50):
        """(the largest |z| of a cell seen at >= min_count positions, the number of such cells, that cell)."""
        z = {c: zscore(s1 / self.n, math.sqrt(max(self.s2[c] / self.n - (s1 / self.n) ** 2, 0) / self.n))
             for c, s1 in self.s1.items() if self.count[c] >= min_count}
        cell = max(z, key=lambda c: abs(z[c]), default=None)
        return (z[cell] if z else 0.0), len(z), cell


def zscore(mean, se, tol=1e-9):
    """mean / se, where a mean within tol of 0 is float rounding (a uniform posterior's surprisal is its entropy
    to 1e-16) and a mean beyond it with se 0 is infinitely far."""
    return mean / math.sqrt(se ** 2 + tol ** 2) if abs(mean) > tol else 0.0


def bonferroni(k, z=Z_FAIL):
    """The |z| at which the largest of k statistics fails at the level at which one fails at |z| > z."""
    level = math.erfc(z / math.sqrt(2))  # two-sided
    return max(z, -torch.special.ndtri(torch.tensor(level / (2 * max(k, 1)), dtype=torch.float64)).item())


def causality(task, batch, tol=1e-9):
    """(iv): over every splice point s of each pair (a, b) of the batch's sequences, a's prefix x[:s] then b's
    suffix: (the largest change of a scored posterior before s, the first (position, splice) where it exceeds tol)."""
    a, b, mask = batch.x[0::2], batch.x[1::2], batch.mask[0::2].cpu()
    n, worst, where = min(len(a), len(b)), 0.0, None
    a, b, mask = a[:n], b[:n], mask[:n]
    flat = lambda p: torch.stack(p, -1) if task.gaussian else p  # (n, T, C or 2)
    full = flat(task.posterior(a)).cpu()
    for s in range(1, a.shape[1]):
        got = flat(task.posterior(torch.cat([a[:, :s], b[:, s:]], 1))).cpu()
        d = (got[:, :s] - full[:, :s]).abs().amax(-1) * mask[:, :s]  # (n, s), the scored positions
        if d.max().item() > worst:
            worst = d.max().item()
        if where is None and d.max().item() > tol:
            where = (int(d.amax(0).argmax()), s)
    return worst, where


def check(task, n_seq=0, seed=0, pairs=64, say=print, n_max=100_000, chunk=2000):
    """Hold task.posterior against task.sample: returns [(statistic, value, z or None, passed)], saying each line;
    Broken where the task breaks the contract. n_seq: sequences (0 = enough for (i) to find a gap of GAP_BITS bits
    a position with probability POWER, from the first `chunk`'s spread; at most n_max)."""
    g, t0 = torch.Generator().manual_seed(seed), time.time()
    try:
        first = task.sample(8, g)
        contract(task, first, task.posterior(first.x))
    except Broken:
        raise
    except Exception as e:  # the task's own code: its error and where
        raise Broken(f"{task.name}: sample, outcome or posterior raised {type(e).__name__}: {str(e)[:200]}") from None
    parts, cells, zero, n, done = dict(gap=[], calib=[], z_mean=[], z_var=[]), Cells(), 0, n_seq or n_max, 0
    while done < n:
        batch = task.sample(min(chunk, n - done), g)
        post = task.posterior(batch.x)
        contract(task, batch, post)
        stats, r, feats, per, z0 = residuals(task, batch, post)
        for k, v in stats.items():
            parts[k].append(v)
        cells.add(task, r, feats, per, len(batch.x))
        zero, done = zero + z0, done + len(batch.x)
        if not n_seq and done == chunk:  # sequences for the power asked, from the spread of the first
            sd = torch.cat(parts["gap"]).std().item()
            n = int(min(n_max, max(chunk, ((Z_FAIL + 1.2816) * sd / GAP_BITS) ** 2)))
    rows = []

    def row(name, value, z=None, bound=Z_FAIL, ok=None):
        ok = abs(z) <= bound if ok is None else ok
        rows.append((name, value, z, ok))
        at = "" if z is None else f"   z {z:+.1f}" + (f" (bound {bound:.1f})" if bound != Z_FAIL else "")
        say(f"  {name:<30} {value}{at}   {'ok' if ok else 'FAILS'}")

    def mean_se(name):
        v = torch.cat(parts[name], 0)
        return v.mean(0), v.std(0) / math.sqrt(done)

    say(f"check {task.name} ({', '.join(f'{k}={v}' for k, v in task.options().items())}): {done:,} sequences of "
        f"its sampler, seed {seed}")
    if zero:
        row("(i) outcomes of probability 0", f"{zero:,} realised outcomes the posterior calls impossible", ok=False)
    m, se = mean_se("gap")
    row("(i) surprisal - entropy", f"{m:+.5f} ± {se:.5f} bits a position", zscore(m.item(), se.item()))
    m, se = mean_se("calib")
    z = [zscore(a, b) for a, b in zip(m.tolist(), se.tolist())]
    k = max(range(BINS), key=lambda i: abs(z[i]))
    what = "q of an answer" if not task.gaussian else "Phi(z)"
    row(f"(ii) calibration, {BINS} bins", f"worst {what} in {k / BINS:.1f}-{(k + 1) / BINS:.1f}: {m[k]:+.4f} "
        f"a sequence", z[k], bonferroni(BINS))
    z, n_cells, cell = cells.worst()
    per_lag = task.vocab_size * (2 if task.gaussian else task.n_classes)  # a lag's cells (Cells.add)
    lag = f", worst at lag {cell // per_lag}" if cell is not None and task.vocab_size else ""
    row("(ii') calibration given inputs", f"{n_cells:,} cells{lag}", z, bonferroni(n_cells))
    if task.gaussian:
        for name, key in (("(iii) mean of z", "z_mean"), ("(iii) variance of z - 1", "z_var")):
            m, se = mean_se(key)
            row(name, f"{m:+.4f} ± {se:.4f}", zscore(m.item(), se.item()))
    batch = task.sample(2 * pairs, g)
    worst, where = causality(task, batch)
    reads = f" (position {where[0]} reads position {where[1]} or later)" if where else ""
    row("(iv) causality", f"{pairs} pairs spliced at each of {batch.x.shape[1] - 1} positions: largest change "
        f"before a splice {worst:.2g}{reads}", ok=where is None)
    power = f"(i) finds a gap of {GAP_BITS} bits a position with probability {POWER}" if not n_seq else \
        "sequences set by --n_seq"
    say(f"{'holds' if all(r[3] for r in rows) else 'FAILS'}: each statistic fails at |z| > {Z_FAIL:g} (a family of "
        f"cells at its Bonferroni bound); {power}; {time.time() - t0:.0f} s")
    return rows


def failed(rows):
    """The first failing statistic's line, or None."""
    return next((f"{name} ({value}{'' if z is None else f', z = {z:+.1f}'})" for name, value, z, ok in rows
                 if not ok), None)


def main(argv=None):
    """python oracles.py check TASK [--n_seq N] [--seed S] [--OPTION VALUE ...]: the task by name, PATH.py:Class or
    module:Class, its options as flags. Exit 0: the posterior holds; 1: it does not; 2: bad input."""
    p = Parser(prog="oracles.py", description=main.__doc__.split(":")[0])
    p.add_argument("command", choices=["check"])
    p.add_argument("task", help="a built-in task (bijection, hmm, ...), PATH.py:Class or module:Class")
    p.add_argument("--n_seq", type=int, default=0, help="sequences (default: enough for the stated power)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sequences drawn")
    p.add_argument("--pairs", type=int, default=64, help="pairs of sequences spliced for (iv)")
    args, rest = p.parse_known_args(argv)
    # tasks.py builds on this file (its posteriors): the command line loads it as it would a task's own module
    tasks = importlib.import_module("tasks")
    try:
        cls = tasks.task_class(args.task)
        q = Parser(prog=f"oracles.py check {args.task}")  # the task's options, each a flag of its field's type
        for f in fields(cls):
            kind = type(f.default) if f.default not in (None, MISSING) else f.type if isinstance(f.type, type) else str
            q.add_argument(f"--{f.name}", type=str2bool if kind is bool else kind, default=argparse.SUPPRESS)
        task = tasks.make_task(args.task, **vars(q.parse_args(rest)))
        if args.n_seq < 0 or args.pairs < 1:
            raise ValueError("--n_seq must be >= 0 and --pairs >= 1")
    except ValueError as e:
        p.exit(2, f"oracles.py: error: {e}\n")
    try:
        rows = check(task, args.n_seq, args.seed, args.pairs)
    except Broken as e:
        print(f"oracles.py: FAILS: the task breaks the contract: {e}", file=sys.stderr)
        return 1
    return 0 if failed(rows) is None else 1


if __name__ == "__main__":
    sys.exit(main())
