"""
Exact Bayesian posterior predictives for every wind tunnel, entropies in bits, and the metrics.

`oracle(task, batch)` gives the posterior predictive at every scored position, computed in
float64 from the batch's latent parameters and its context only:
- bijection: a key seen before has a point mass on its value; an unseen key is uniform over
  the values not yet used, so after t distinct pairs H = log2(V - t) (layout query: the final
  query is a context key, a point mass);
- hmm: the forward filter alpha_t(s) ∝ E(o_t | s) sum_s' T(s | s') alpha_{t-1}(s'), from a
  uniform alpha_0, in log space;
- regression: the conjugate posterior Sigma_t = (X^T X / sigma^2 + I / tau^2)^-1,
  mu_t = Sigma_t X^T y / sigma^2 over the pairs before t; predictive
  N(mu_t^T x_t, sigma^2 + x_t^T Sigma_t x_t);
- recall: a point mass on the bound value;
- hop: a point mass on succ^k(e), the query entity e followed k times through the facts in
  context (succ(a) = b for each fact a -> b), so H = 0 at every query.
Categorical oracles are (B, T, C) probabilities (zero rows at unscored positions); regression
returns (mean, var), each (B, T) (0 and 1 at unscored positions).

`Metrics` compares a model's predictions with these over evaluation batches, in bits (its
docstring defines each metric); entropy_mae and key_positions_mae, a model's on one batch (geometry.py's
ablations). Entropies of Gaussians are differential: H = 1/2 log2(2 pi e var); js_bits is the Jensen-Shannon
divergence in bits. `StopRule` reads a run's held-out metrics to end it (--stop_at, --patience).
"""
import math
import re

import torch
import torch.nn.functional as F

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


def bijection_posterior(task, batch):
    """(B, Q, V) posterior over pi(k) at each scored key k, given the pairs shown before it: each of the
    L keys after the pairs before it, then (layout query) the query q after all L pairs."""
    perm, L = batch.latent["perm"], task.L
    keys = batch.x[:, 0:2 * L:2]  # (B, L)
    vals = F.one_hot(perm.gather(1, keys), task.V).double()  # (B, L, V) the value shown after each key
    query, n_before = keys, torch.arange(L, device=keys.device)  # (B, Q) scored keys, (Q,) pairs shown before each
    if task.layout == "query":
        query, n_before = torch.cat([keys, batch.x[:, -1:]], 1), torch.cat([n_before, n_before[-1:] + 1])
    shown = (torch.arange(L, device=keys.device) < n_before[:, None]).double()  # (Q, L): pair j shown before query i
    used = torch.einsum("ql,blv->bqv", shown, vals).clamp(max=1)  # values shown before each query
    match = (query.unsqueeze(2) == keys.unsqueeze(1)) * shown  # (B, Q, L): query i's key shown as pair j
    seen = match.sum(-1, keepdim=True) > 0
    point = torch.einsum("bql,blv->bqv", match, vals).clamp(max=1)  # a key seen twice shows the same value
    unseen = (1 - used) / (1 - used).sum(-1, keepdim=True)  # uniform over the unused values: H = log2(V - t)
    return torch.where(seen, point, unseen)


def hmm_posterior(task, batch):
    """(B, K, S) filtering posterior at each observation."""
    lat = batch.latent
    return hmm_filter(lat["trans"], lat["emit"], lat["obs"])


def regression_posterior(task, batch):
    """Predictive (mean, var), each (B, K), of y_t given x_t and the pairs before t."""
    xs, ys = batch.latent["xs"].double(), batch.latent["ys"].double()
    B, K, d = xs.shape
    s2, t2 = task.noise_std ** 2, task.prior_std ** 2
    means, vars_ = [], []
    for t in range(K):
        X, y, x = xs[:, :t], ys[:, :t], xs[:, t]
        precision = X.transpose(1, 2) @ X / s2 + torch.eye(d, dtype=torch.float64) / t2  # Sigma_t^-1
        Sigma = torch.linalg.inv(precision)
        mu = Sigma @ (X.transpose(1, 2) @ y.unsqueeze(-1)) / s2  # (B, d, 1)
        means.append((x.unsqueeze(1) @ mu).view(B))
        vars_.append(s2 + (x.unsqueeze(1) @ Sigma @ x.unsqueeze(-1)).view(B))
    return torch.stack(means, 1), torch.stack(vars_, 1)


def recall_posterior(task, batch):
    """(n scored, C) point masses on the bound values."""
    return F.one_hot(batch.latent["answer"][batch.mask], task.n_classes).double()


def hop_posterior(task, batch):
    """(n scored, C) point masses on succ^k(e), read off the facts in the context (not the latent chains)."""
    off, N, x, m = task.answer_offset, task.n_facts, batch.x, batch.mask
    facts = x[:, :2 * N].reshape(-1, N, 2) - off  # (a, b) entity pairs
    succ = torch.full((x.shape[0], task.n_entities), -1, dtype=torch.long).scatter(1, facts[..., 0], facts[..., 1])
    rows, t = m.nonzero(as_tuple=True)
    e, k = x[rows, t] - off, x[rows, t - 1]  # the query entity and its hop token (token id k)
    for i in range(task.hops):
        e = torch.where(k > i, succ[rows, e], e)
    return F.one_hot(e, task.n_classes).double()


# task name -> its posterior at the scored positions, in order
POSTERIORS = {"bijection": bijection_posterior, "hmm": hmm_posterior, "regression": regression_posterior,
              "recall": recall_posterior, "hop": hop_posterior}
# task name -> the latents a batch of it carries, each shape after the batch dim
LATENTS = {"bijection": lambda task: dict(perm=(task.V,)),
           "hmm": lambda task: dict(trans=(task.n_states,) * 2, emit=(task.n_states, task.n_obs), obs=(task.K,)),
           "regression": lambda task: dict(xs=(task.K, task.d), ys=(task.K,)),
           "recall": lambda task: dict(answer=(task.seq_len,)),
           "hop": lambda task: dict(answer=(task.seq_len,))}


def check_batch(task, batch):
    """A batch drawn from another task, or at other sizes, would give a wrong posterior without an error."""
    x, lat, want = batch.x, batch.latent, LATENTS[task.name](task)
    ok = x.dim() >= 2 and x.shape[1] == task.seq_len and tuple(batch.mask.shape) == tuple(x.shape[:2])
    if task.vocab_size:
        ok = ok and x.dim() == 2 and not x.is_floating_point() and 0 <= x.min() and x.max() < task.vocab_size
    else:
        ok = ok and x.dim() == 3 and x.shape[2] == task.n_features
    ok = ok and all(k in lat and tuple(lat[k].shape[1:]) == s for k, s in want.items())
    if ok and task.name == "bijection":  # the two layouts can share a length: the values shown must be perm's
        keys, vals = x[:, 0:2 * task.L:2], x[:, 1:2 * task.L:2] - task.answer_offset
        ok = bool((keys < task.V).all()) and torch.equal(vals, lat["perm"].gather(1, keys[:, :vals.shape[1]]))
    if not ok:
        opts = ", ".join(f"{k}={v}" for k, v in task.options().items())
        raise ValueError(f"oracle: the batch was not drawn from this task ({task.name}: {opts}); "
                         "sample it with task.sample")


def oracle(task, batch):
    """The exact posterior predictive at every scored position (see the module docstring)."""
    if task.name not in POSTERIORS:
        raise ValueError(f"no oracle for task {task.name!r}")
    check_batch(task, batch)
    m, post = batch.mask, POSTERIORS[task.name](task, batch)
    B, T = m.shape
    if task.gaussian:
        mean = torch.zeros(B, T, dtype=torch.float64)
        var = torch.ones(B, T, dtype=torch.float64)
        mean[m], var[m] = [t.reshape(-1) for t in post]
        return mean, var
    probs = torch.zeros(B, T, task.n_classes, dtype=torch.float64)
    probs[m] = post.reshape(-1, task.n_classes)
    return probs


def entropy_bits(p):
    """H = -sum p log2 p over the last dim, with 0 log 0 = 0."""
    return -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1) / LOG2


def gaussian_entropy_bits(var):
    return 0.5 * torch.log2(2 * math.pi * math.e * var)


def gaussian_kl_bits(m0, v0, m1, v1):
    """KL(N(m0, v0) || N(m1, v1)) in bits."""
    return 0.5 * (torch.log(v1 / v0) + (v0 + (m0 - m1) ** 2) / v1 - 1) / LOG2


def true_answer(task, batch):
    """(B, T) index of the true answer class at scored positions (hmm: the hidden state)."""
    if task.name == "hmm":
        ans = torch.zeros_like(batch.mask, dtype=torch.long)
        ans[batch.mask] = batch.latent["states"].reshape(-1)
        return ans
    return batch.y


def js_bits(p, q):
    """Jensen-Shannon divergence in bits between distributions on the last dim, in [0, 1]."""
    m = (p + q) / 2
    kl = lambda a: torch.where(a > 0, a * (a.log() - m.log()), torch.zeros_like(a)).sum(-1)
    return (kl(p) + kl(q)) / (2 * LOG2)


class Metrics:
    """Accumulates model-vs-oracle statistics over evaluation batches; `result()` gives, in bits:
    - mae_curve: the paper's "mean-curve" entropy MAE: average model and oracle entropy over
      sequences at each query position first, then mean over positions of |difference|;
    - mae_token: mean over every scored (sequence, position) of |H_model - H_oracle| (>= mae_curve);
    - kl: KL(oracle || model) per scored position (the exact Gaussian KL for regression);
    - accuracy: argmax against the true answer (bijection and recall: the value; hop: the
      successor; hmm: the hidden state); oracle_accuracy is the Bayes decision's expected accuracy,
      mean of max_c p(c);
    - n_sequences, curve_model and curve_oracle (the mean entropy at each query position), and for
      recall accuracy_by_slot (by the queried pair's place in the store)."""

    def __init__(self):
        self.n = 0  # scored tokens
        self.seqs = 0
        self.sums = dict(abs=0.0, kl=0.0, correct=0.0, oracle_correct=0.0)
        self.curve_model = self.curve_oracle = None  # per query position sums
        self.by_slot = 0  # recall: (correct, queries) per stored pair

    @torch.no_grad()
    def update(self, task, batch, out):
        m = batch.mask.cpu()
        B, Q = m.shape[0], int(m[0].sum())
        # on the CPU first (MPS has no float64); of a head over every token, the answers' logits
        out = task.answers(task.check_output(out, m.shape).detach().cpu().double())
        if task.gaussian:
            mean, var = oracle(task, batch)
            q_mean, q_var = out[..., 0][m], out[..., 1][m].exp()
            H_model, H_oracle = gaussian_entropy_bits(q_var), gaussian_entropy_bits(var[m])
            kl = gaussian_kl_bits(mean[m], var[m], q_mean, q_var)
        else:
            p = oracle(task, batch)[m]
            log_q = F.log_softmax(out[m], -1)
            H_model, H_oracle = entropy_bits(log_q.exp()), entropy_bits(p)
            kl = (p * (torch.where(p > 0, p.log(), torch.zeros_like(p)) - log_q)).sum(-1) / LOG2
            ans = true_answer(task, batch).cpu()[m]
            hit = log_q.argmax(-1) == ans
            self.sums["correct"] += hit.sum().item()
            if "slot" in batch.latent:  # recall: accuracy by the queried pair's place in the store
                slot, N = batch.latent["slot"].cpu().reshape(-1), task.n_pairs
                self.by_slot += torch.stack([torch.bincount(slot, hit.double(), N), torch.bincount(slot, minlength=N)])
            self.sums["oracle_correct"] += p.max(-1).values.sum().item()
        H_model, H_oracle = H_model.view(B, Q), H_oracle.view(B, Q)
        self.sums["abs"] += (H_model - H_oracle).abs().sum().item()
        self.sums["kl"] += kl.sum().item()
        cm, co = H_model.sum(0), H_oracle.sum(0)
        self.curve_model = cm if self.curve_model is None else self.curve_model + cm
        self.curve_oracle = co if self.curve_oracle is None else self.curve_oracle + co
        self.n += B * Q
        self.seqs += B

    def result(self, task):
        cm, co = self.curve_model / self.seqs, self.curve_oracle / self.seqs
        r = dict(mae_curve=(cm - co).abs().mean().item(), mae_token=self.sums["abs"] / self.n,
                 kl=self.sums["kl"] / self.n, n_sequences=self.seqs)
        if not task.gaussian:
            r.update(accuracy=self.sums["correct"] / self.n, oracle_accuracy=self.sums["oracle_correct"] / self.n)
        if torch.is_tensor(self.by_slot):
            r.update(accuracy_by_slot=(self.by_slot[0] / self.by_slot[1].clamp(min=1)).tolist())
        r.update(curve_model=cm.tolist(), curve_oracle=co.tolist())
        return r


def batch_mae(task, batch, out):
    """A training batch's per-token entropy MAE (bits), for train.py's progress line."""
    (m := Metrics()).update(task, batch.to("cpu"), out.float())
    return m.result(task)["mae_token"]


# -----------------------------------------------------------------------------
# geometry.py's held-out batch, and a model's metrics on one batch (its ablations and dynamics)


def entropy_mae(model, task, batch, **kw):
    """The metrics of model(x, **kw) on one batch, without the curves (geometry.py's ablations)."""
    m = Metrics()
    x = batch.x.double() if batch.x.is_floating_point() else batch.x  # real inputs (regression) meet a float64 model
    m.update(task, batch, model(x, **kw))
    return {k: v for k, v in m.result(task).items() if not isinstance(v, list) and k != "n_sequences"}


def key_positions_mae(model, task, batch, **kw):
    """The bijection query layout's per-token MAE at its key positions only, its final query (the recall of a
    seen key) left out: the authors' statistic for that layout (jlens reconcile_frame_head.py,
    paired_calibration_mae: every prefix k1 v1 .. k_t, the entropy at k_t against log2(V - t + 1))."""
    keys = batch.mask.clone()
    keys[:, -1] = False
    H_model = entropy_bits(F.softmax(task.answers(model(batch.x, **kw)).double(), -1)[keys])
    return (H_model - entropy_bits(oracle(task, batch)[keys])).abs().mean().item()


def held_out(task, n, seed, draw=250):
    """The first n sequences of train.evaluate's held-out stream (geometry.py's batch): from `seed`, `draw` at a
    time (its batch_size), as one tasks.Batch."""
    g = torch.Generator().manual_seed(seed)
    parts = [task.sample(draw, g) for _ in range(-(-n // draw))]
    cat = lambda ts: torch.cat(list(ts))[:n]
    return type(parts[0])(cat(b.x for b in parts), cat(b.y for b in parts), cat(b.mask for b in parts),
                          {k: cat(b.latent[k] for b in parts) for k in parts[0].latent})


# -----------------------------------------------------------------------------
# when a run's held-out evaluations end it: --stop_at, --patience


def parse_stop(spec, task):
    """--stop_at: 'metric<=x' or 'metric>=x' -> a test of an evaluation's metrics; '' -> None."""
    if not spec:
        return None
    m = re.fullmatch(r"(mae_curve|mae_token|kl|accuracy)(<=|>=)([0-9.eE+-]+)", spec.replace(" ", ""))
    try:
        x = float(m.group(3)) if m else None
    except ValueError:
        x = None
    if x is not None and not math.isfinite(x):
        raise ValueError(f"--stop_at {spec!r}: the threshold must be a finite number, got {x}")
    if x is None:
        raise ValueError(f"--stop_at {spec!r}: expected METRIC<=X or METRIC>=X with METRIC one of "
                         "mae_curve, mae_token, kl, accuracy and X a finite number")
    name, op = m.group(1), m.group(2)
    if name == "accuracy" and task.gaussian:
        raise ValueError(f"--stop_at {spec!r}: {task.name} has no accuracy; use mae_curve, mae_token or kl")
    return lambda r: name in r and (r[name] <= x if op == "<=" else r[name] >= x)


class StopRule:
    """When a run's held-out evaluations end it: at --stop_at's target, or after --patience evaluations in a row whose
    KL is not 1% below the best before them (the evaluations reuse one set of sequences, so a change is the model's).
    rule(r) -> why to stop now, or None; a resumed run's history is counted first."""

    def __init__(self, train, task, history=()):
        self.spec, self.target, self.patience = train["stop_at"], parse_stop(train["stop_at"], task), train["patience"]
        self.what = " or ".join([self.spec] * bool(self.spec) + ["a plateau"] * bool(self.patience))  # for eta lines
        self.best, self.since = math.inf, 0
        for r in history:
            self(r)
        self.reason = None

    def __call__(self, r):
        self.best, self.since = (r["kl"], 0) if r["kl"] < 0.99 * self.best else (self.best, self.since + 1)
        self.reason = None
        if self.target is not None and self.target(r):
            self.reason = f"reached {self.spec}"
        elif self.patience and self.since >= self.patience:
            self.reason = f"plateau: KL not 1% below {self.best:.4g} in {self.patience} evaluations"
        return self.reason
