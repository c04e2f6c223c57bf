"""
The Bayesian wind tunnels: tasks whose exact posterior is known at every position.

Every sequence draws fresh latent parameters (a permutation, an HMM, a weight vector, a key-value binding, a set of
chains), so the hypothesis space cannot be memorised and the model must infer in context. A task is one dataclass
subclass of `Task` with a `name` (README, "Bring your own task": a file's task follows the same contract): its
fields are its options (`make_task(name, **opts)`, a flag each), `__post_init__` sets what sizes a model's input and
output, `sample(batch_size, generator)` returns a `Batch` (x, y, mask and the latent parameters), `posterior(x)` the
exact predictive of the scored target at every position from the inputs alone (oracles.py has the built-ins'),
`outcome(batch)` the realised value of what is scored (batch.y; hmm: the hidden state) and `loss(out, batch)` the
training loss. `defaults` are the training settings of a task that no preset names.
A batch is drawn on the generator's device: with a CUDA generator every tensor, the HMM's
forward filter included, is made on the GPU, and no step reads a value back to the host (the loops
run a fixed number of times), so drawing a batch never waits for the GPU.

Each task's docstring shows one drawn sequence, a column per position, with `.` where the loss
never reads y (-100, or 0 for soft and real targets); tests/test_data.py draws it again, so the
example cannot drift from the code. The same docstring gives the task's design decisions, which
follow the authors' released code where the paper is silent:

    bijection   belief accumulation: a random permutation's values, shown key by key
    hmm         belief accumulation and transport: the forward filter of the HMM stated in the header
    regression  accumulation with a continuous latent: Bayesian linear regression (not in the paper)
    recall      random-access binding: the value bound to a queried key
    hop         binding composed over k hops (the Pavlovian paper's Theorem 9, for wide vs deep)
"""
from dataclasses import dataclass, field, fields, is_dataclass, replace
import math

import torch
import torch.nn.functional as F

from commandline import is_spec, load_class, raised
from oracles import bijection_posterior, hmm_posterior, hop_posterior, recall_posterior, regression_posterior

IGNORE = -100
IO_FIELDS = ("vocab_size", "n_features", "n_classes", "answer_offset", "gaussian")  # what a task tells its model


@dataclass
class Batch:
    """A batch of sequences, every tensor batch-first:

        x       (B, T) int64 tokens, or (B, T, F) float features (regression)
        y       target at every position: class index (-100 where unscored), the oracle
                posterior (B, T, C) for soft-target tasks, or the real target (regression)
        mask    (B, T) bool, the scored positions; the i-th True entry of mask[b] is query i
        latent  dict of per-sequence hidden parameters, the names the oracle relies on"""
    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor
    latent: dict = field(default_factory=dict)

    def map(self, fn, latent=True):
        """fn applied to every tensor: x, y, mask and, unless latent=False, the latent parameters (all batch-first)."""
        mv = lambda t: fn(t) if isinstance(t, torch.Tensor) else t
        return Batch(mv(self.x), mv(self.y), mv(self.mask), {k: mv(v) if latent else v for k, v in self.latent.items()})

    def to(self, device, latent=True):
        """latent=False moves only what the model and the loss read: the oracle's float64 latents stay where
        they are, for a device without float64 (Apple MPS) and for fewer copies."""
        return self.map(lambda t: t.to(device), latent)


def check(ok, msg):
    if not ok:
        raise ValueError(msg)


class Task:
    """The contract of a wind tunnel; subclasses are dataclasses.

    Model I/O is described by attributes every task has: `vocab_size` (0 for real inputs), `n_features`,
    `n_classes` (answer classes C; the model outputs (B, T, C), or (B, T, 2) = (mean, log-variance) when
    `gaussian`), `answer_offset` (token id of answer class 0 when the answers are tokens, which lets a model tie
    its head to the embedding, or output (B, T, vocab_size) logits over every token, scored on the answers'
    slice) and `seq_len` (T)."""
    name = None  # the task's key in TASKS (a file's task: its folders' and tables' name), set by each subclass
    gaussian = False  # real-valued prediction with a Gaussian head
    soft_targets = False  # y is a distribution (B, T, C): outcome() gives the realised value
    vocab_size = 0
    n_features = 0
    answer_offset = None
    float64 = False  # draws in float64 (the exact posterior's parameters): never on a device without it (MPS)
    defaults = {}  # training settings (train.py flags) of this task where no preset has an entry for it

    def sample(self, batch_size, generator=None):
        raise NotImplementedError(f"{type(self).__name__} has no sample(batch_size, generator=None)")

    def posterior(self, x):
        """The exact predictive of the scored target at every position of x (B, T[, F]), float64: probabilities
        (B, T, C), or (mean, var) each (B, T) when gaussian; read from x alone, positions not scored ignored."""
        raise NotImplementedError(f"{type(self).__name__} has no posterior(x)")

    def outcome(self, batch):
        """(B, T): the realised value of what is scored, at the scored positions (the class, or the real target)."""
        return batch.y

    def drew(self, x):
        """Whether x can be a batch this task draws (its length, and tokens in its vocabulary or its features): a
        batch of another task, or of other sizes, would give a wrong posterior without an error."""
        ok = x.dim() >= 2 and x.shape[1] == self.seq_len
        if self.vocab_size:
            return ok and x.dim() == 2 and not x.is_floating_point() and bool(((0 <= x) & (x < self.vocab_size)).all())
        return ok and x.dim() == 3 and x.shape[2] == self.n_features

    def options(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def whole_vocab(self, out):
        """Whether out holds logits over the whole vocabulary, (B, T, vocab_size), rather than the C answers'."""
        return self.answer_offset is not None and self.vocab_size != self.n_classes and out.shape[-1] == self.vocab_size

    def answers(self, out):
        """The C answers' logits of a model's output: the answer tokens' slice where it covers every token."""
        return out[..., self.answer_offset:self.answer_offset + self.n_classes] if self.whole_vocab(out) else out

    def check_output(self, out, shape):
        """out, if it is the tensor this task needs at (B, T) = shape: (B, T, C) (or 2: Gaussian), or where the
        answers are tokens (B, T, vocab_size); else a one-line error (a model of one's own with another head)."""
        want = (*shape, 2 if self.gaussian else self.n_classes)
        got = getattr(out, "shape", type(out).__name__)  # a tuple, or a name: tensors only
        if got != want and not (isinstance(got, tuple) and got[:-1] == want[:-1] and self.whole_vocab(out)):
            raise ValueError(f"the model's output is {tuple(got) if isinstance(got, tuple) else 'a ' + got}; "
                             f"{self.name} needs a tensor (B, T, C) = {want}")
        return out

    def loss(self, out, batch):
        """Mean over the scored positions. Written as a masked sum, not out[mask], because boolean
        indexing makes the host wait for the GPU to learn how many positions there are."""
        m, y, out = batch.mask, batch.y, self.check_output(out, batch.mask.shape).float()
        if self.whole_vocab(out):  # a head over every token: the cross-entropy over all of them (the authors' head)
            y = y + self.answer_offset
        if self.gaussian:
            # Gaussian negative log-likelihood, out = (mean, log-variance); unscored outputs are zeroed
            # first so that an extreme one cannot put inf * 0 = nan into the gradient
            mean, logvar = (torch.where(m, out[..., i], 0.0) for i in range(2))
            per = 0.5 * (logvar + (batch.y - mean) ** 2 * torch.exp(-logvar) + math.log(2 * math.pi))
        elif self.soft_targets:
            # cross-entropy against the posterior: -sum_s alpha_t(s) log q_t(s)
            per = -(batch.y * F.log_softmax(out, -1)).sum(-1)
        else:
            per = F.cross_entropy(out.flatten(0, 1), y.flatten().masked_fill(~m.flatten(), IGNORE),
                                  reduction="none").view(m.shape)
        return torch.where(m, per, 0.0).sum() / m.sum()


def device_of(g):
    """Where a batch drawn with generator g lives (the CPU when g is None)."""
    return g.device if g is not None else torch.device("cpu")


def uniform_choice_without_replacement(B, n, k, g):
    """(B, k) indices into range(n), distinct within each row."""
    return torch.rand(B, n, generator=g, device=device_of(g)).argsort(-1)[:, :k]


# -----------------------------------------------------------------------------
# bijection elimination: belief accumulation

@dataclass
class Bijection(Task):
    """y at key k is its value pi(k) as a class index. Two layouts:

    separate (the default): keys are tokens 0..V-1 and values V..2V-1, `k1 v1 k2 v2 ... kL`, every key a
    query. Example (V=4, L=3; seed 0):

        x    0 6 2 4 1
        mask 1 0 1 0 1
        y    2 . 0 . 3

    Key 0 is followed by token 6, so pi(0) = 2; the last key's value (here 3) is never shown.

    query: keys and values share the tokens 0..V-1, `k1 v1 ... kL vL q`, T = 2L+1: every key and the final
    query q, a key drawn uniformly from the L context keys, are scored. Example (V=4, L=3, layout=query; seed 0):

        x    0 2 2 0 1 3 2
        mask 1 0 1 0 1 0 1
        y    2 . 0 . 3 . 0

    The query is key 2, shown with value 0 at positions 2-3, so its posterior is a point mass.

    separate is the authors' analysed "sepvocab" format; L defaults to V-1 = 19 as in their analysed checkpoint
    (the position-only predictor, uniform over V, then scores mean_t log2(V / (V - t)) = 1.107 bits; L=V adds a
    final position that is always determined). query is the variant on which the paper measured its layer-0 frame
    (their jlens/reconcile_frame_head.py), scored as their jlens/train_paired_variant.py trains it (labels on the
    key positions; their paper1_bijection/train.py also labels each value position with itself)."""
    name = "bijection"
    V: int = 20  # size of the key and value alphabets; pi is a permutation of range(V)
    L: int = None  # number of key positions; None means V-1
    with_replacement: bool = False  # keys drawn with replacement (seen keys become 0-bit queries)
    layout: str = "separate"  # separate: k1 v1 .. kL, values V..2V-1; query: k1 v1 .. kL vL q, shared tokens 0..V-1

    LAYOUTS = ("separate", "query")

    def __post_init__(self):
        check(isinstance(self.V, int) and self.V >= 2, f"bijection: V must be an int >= 2, got {self.V}")
        if self.L is None:
            self.L = self.V - 1
        check(isinstance(self.L, int) and self.L >= 1, f"bijection: L must be an int >= 1, got {self.L}")
        check(self.with_replacement or self.L <= self.V,
              f"bijection: without replacement L must be <= V={self.V}, got L={self.L}")
        check(self.layout in self.LAYOUTS, f"bijection: layout must be one of {', '.join(self.LAYOUTS)}, "
                                           f"got {self.layout!r}")
        query = self.layout == "query"
        self.vocab_size = self.V if query else 2 * self.V
        self.n_classes = self.V
        self.answer_offset = 0 if query else self.V  # the token of value 0
        self.seq_len = 2 * self.L + 1 if query else 2 * self.L - 1

    def sample(self, batch_size, generator=None):
        B, V, L, dev = batch_size, self.V, self.L, device_of(generator)
        perm = torch.rand(B, V, generator=generator, device=dev).argsort(-1)  # perm[b, key] = value
        if self.with_replacement:
            keys = torch.randint(V, (B, L), generator=generator, device=dev)
        else:
            keys = uniform_choice_without_replacement(B, V, L, generator)
        vals = perm.gather(1, keys)
        x = torch.empty(B, 2 * L, dtype=torch.long, device=dev)
        x[:, 0::2], x[:, 1::2] = keys, vals + self.answer_offset
        y = torch.full_like(x, IGNORE)
        y[:, 0::2] = vals  # each key's logits predict the value token after it
        if self.layout == "query":  # append the query, a context key (uniform over the L positions), and its value
            i = torch.randint(L, (B, 1), generator=generator, device=dev)
            x, y = torch.cat([x, keys.gather(1, i)], 1), torch.cat([y, vals.gather(1, i)], 1)
        else:
            x, y = x[:, :-1], y[:, :-1]  # the last value is never shown: its key is the last query
        return Batch(x, y, y != IGNORE, dict(perm=perm))

    def posterior(self, x):
        return bijection_posterior(self, x)

    def drew(self, x):
        """Its length and vocabulary, and keys and values where its layout has them (two layouts can share both)."""
        values = x[:, 1:2 * self.L:2] - self.answer_offset
        keys = x[:, 0:2 * self.L:2]
        return super().drew(x) and bool((keys < self.V).all() and ((0 <= values) & (values < self.V)).all())


# -----------------------------------------------------------------------------
# HMM filtering: belief accumulation + transport

def dirichlet1(shape, g):
    """Rows ~ Dirichlet(1, ..., 1): normalised Exp(1) draws."""
    e = -torch.log1p(-torch.rand(shape, generator=g, dtype=torch.float64, device=device_of(g)))
    return e / e.sum(-1, keepdim=True)


def to_cents_grid(p, floor=5):
    """The authors' discretisation (their src/data/hmm.py, discretize_and_renormalize): floor at
    0.05, renormalise, round to integer cents, lift any entry below the floor back to it, then fix
    the row sum. The entries are ordered once, ascending when cents must be added and descending
    when removed (ties by index: a stable sort; the numpy argsort they call leaves ties to the
    platform), and that order is walked round-robin, moving one cent per entry visited and skipping
    an entry at 100 (adding) or at the floor (removing), until the row sums to 100.

    In pass k of the walk an entry moves a cent if it can still move more than k and the row still
    needs one, so the walk is a loop over passes. Each pass that is needed moves a cent, so a fixed
    count of the largest possible |100 - sum| passes needs no host check of the sums (no GPU sync):
    rounding is off by <= 1/2 per entry, and the floor lifts an entry by at most floor * (1 - 1/s)
    cents, where s <= 1 + n * floor / 100 is the clamped sum. At most 20 entries: the walk removes
    down to the floor, which 21 entries of 5 cents would already exceed."""
    n = p.shape[-1]
    p = p.clamp(min=floor / 100)
    p = p / p.sum(-1, keepdim=True)
    c = torch.round(p * 100).long().clamp(min=floor)
    need = 100 - c.sum(-1, keepdim=True)  # (..., 1): cents to add (> 0) or to remove (< 0)
    _, order = torch.sort(torch.where(need > 0, c, -c), stable=True)  # the walk's order
    room = torch.where(need > 0, 100 - c, c - floor).gather(-1, order)  # cents each entry can move
    left, moved = need.abs(), torch.zeros_like(c)
    s_max = 1 + n * floor / 100
    for k in range(math.ceil(n / 2 + n * floor * (1 - 1 / s_max))):
        step = room > k
        step = step & (step.cumsum(-1) <= left)  # the first `left` entries that can still move
        moved, left = moved + step, left - step.sum(-1, keepdim=True)
    return c.scatter_add(-1, order, need.sign() * moved)


def categorical(probs, g):
    """One draw per row of probs (..., n) by inverting the CDF."""
    u = torch.rand(probs.shape[:-1] + (1,), generator=g, dtype=probs.dtype, device=probs.device)
    return (probs.cumsum(-1) < u).sum(-1).clamp(max=probs.shape[-1] - 1)


@dataclass
class HMM(Task):
    """Tokens 0..100 are probabilities in cents, 101..104 are [TRANS] [EMIT] [SEP] [OBS] and symbol o
    is 105 + o; y at each symbol is the filter posterior P(s_t | o_1..o_t) over the S states.
    Example (n_states=2, n_obs=2, K=2; seed 0):

        x    101 74 26 20 80 102 40 60 31 69 103 104         105 104         105
        mask   0  0  0  0  0   0  0  0  0  0   0   0           1   0           1
        y      .  .  .  .  .   .  .  .  .  .   .   . [0.56 0.44]   . [0.57 0.43]

    T = [[0.74, 0.26], [0.2, 0.8]], E = [[0.4, 0.6], [0.31, 0.69]], then symbol 0 twice.

    The layout is the authors' header of probability tokens `[TRANS] T.. [EMIT] E.. [SEP]` then
    `[OBS] o1 [OBS] o2 ...`. Rows ~ Dirichlet(1), by default floored at 0.05 and put on a 2-decimal grid by the
    authors' procedure (`to_cents_grid`) so the header states the matrices exactly. With `discretize=False` the
    header shows the rounded matrices while the oracle uses the exact ones."""
    name = "hmm"
    n_states: int = 5  # S hidden states
    n_obs: int = 5  # O observation symbols
    K: int = 20  # observations per sequence (the paper trains at 20, evaluates also at 30 and 50)
    discretize: bool = True  # 0.05 floor + 2-decimal grid so the header is exact (authors' code)

    soft_targets = True
    float64 = True

    def __post_init__(self):
        for k in ("n_states", "n_obs", "K"):
            v = getattr(self, k)
            check(isinstance(v, int) and v >= 1, f"hmm: {k} must be an int >= 1, got {v}")
        check(self.n_states >= 2, f"hmm: n_states must be >= 2, got {self.n_states}")
        check(not self.discretize or max(self.n_states, self.n_obs) <= 20,
              "hmm: with discretize=True the 0.05 floor allows at most 20 states/symbols")
        S, O = self.n_states, self.n_obs
        # tokens: 0..100 = probability in cents, then [TRANS] [EMIT] [SEP] [OBS], then symbols
        self.TRANS, self.EMIT, self.SEP, self.OBS, self.symbol_offset = 101, 102, 103, 104, 105
        self.vocab_size = 105 + O
        self.header_len = 3 + S * S + S * O
        self.seq_len = self.header_len + 2 * self.K
        self.n_classes = S

    def sample(self, batch_size, generator=None):
        B, S, O, K, g, dev = batch_size, self.n_states, self.n_obs, self.K, generator, device_of(generator)
        trans, emit = dirichlet1((B, S, S), g), dirichlet1((B, S, O), g)
        if self.discretize:
            tc, ec = to_cents_grid(trans), to_cents_grid(emit)
            trans, emit = tc.double() / 100, ec.double() / 100
        else:
            tc, ec = torch.round(trans * 100).long(), torch.round(emit * 100).long()
        states = torch.empty(B, K, dtype=torch.long, device=dev)
        states[:, 0] = torch.randint(S, (B,), generator=g, device=dev)  # uniform initial state
        rows = torch.arange(B, device=dev)
        for t in range(1, K):
            states[:, t] = categorical(trans[rows, states[:, t - 1]], g)
        obs = categorical(emit.gather(1, states.unsqueeze(-1).expand(B, K, O)), g)  # (B, K)

        col = lambda tok: torch.full((B, 1), tok, dtype=torch.long, device=dev)
        steps = torch.stack([torch.full_like(obs, self.OBS), obs + 105], -1).view(B, 2 * K)
        x = torch.cat([col(self.TRANS), tc.view(B, -1), col(self.EMIT), ec.view(B, -1), col(self.SEP), steps], 1)
        mask = torch.zeros(B, self.seq_len, dtype=torch.bool, device=dev)
        mask[:, self.header_len + 1::2] = True  # the observation-symbol tokens
        y = torch.where(mask[..., None], self.posterior(x), 0.0).float()  # the filter: soft targets
        return Batch(x, y, mask, dict(trans=trans, emit=emit, obs=obs, states=states))

    def posterior(self, x):
        return hmm_posterior(self, x)

    def outcome(self, batch):
        """The hidden state at each observation: what the filter's posterior is over."""
        states = torch.zeros(batch.mask.shape, dtype=torch.long, device=batch.mask.device)
        states[:, self.header_len + 1::2] = batch.latent["states"]
        return states


# -----------------------------------------------------------------------------
# Bayesian linear regression: accumulation with a continuous latent

@dataclass
class Regression(Task):
    """Each pair (x_i, y_i) is two tokens: the query [x_i, 0, 1], whose target is y_i, then the
    observation [x_i, y_i, 0]. Example (d=1, K=2; seed 0; values to 2 decimals):

        x    [-0.29 0 1] [-0.29 -0.17 0] [-2.18 0 1] [-2.18 -3.9 0]
        mask           1               0           1              0
        y          -0.17               .        -3.9              .

    Not in the paper: the standard conjugate setting. Each observation is one token, so the task tests
    accumulation, not the binding of x and y across positions (recall's job)."""
    name = "regression"
    d: int = 8  # input dimension
    K: int = 16  # (x, y) pairs per sequence
    noise_std: float = 0.5  # sigma: y = w.x + N(0, sigma^2)
    prior_std: float = 1.0  # tau: w ~ N(0, tau^2 I)
    d_active: int = 0  # inputs vary in the first d_active dimensions, the rest are 0 (0 = all d): a curriculum grows it

    gaussian = True
    float64 = True

    def __post_init__(self):
        check(isinstance(self.d, int) and self.d >= 1, f"regression: d must be an int >= 1, got {self.d}")
        check(isinstance(self.K, int) and self.K >= 1, f"regression: K must be an int >= 1, got {self.K}")
        check(all(1e-6 <= s <= 1e6 for s in (self.noise_std, self.prior_std)),  # NaN too
              f"regression: noise_std and prior_std must be in [1e-6, 1e6] (beyond, the targets' and the posterior's "
              f"variances leave float32), got {self.noise_std}, {self.prior_std}")
        check(isinstance(self.d_active, int) and 0 <= self.d_active <= self.d,
              f"regression: d_active must be an int in [0, d={self.d}] (0 = all), got {self.d_active}")
        self.d_active = self.d_active or self.d
        self.n_features = self.d + 2
        self.n_classes = 2  # (mean, log-variance)
        self.seq_len = 2 * self.K

    def sample(self, batch_size, generator=None):
        B, d, K, g = batch_size, self.d, self.K, generator
        new = dict(dtype=torch.float64, device=device_of(g))
        w = torch.randn(B, d, generator=g, **new) * self.prior_std
        xs = torch.randn(B, K, d, generator=g, **new).float().double()  # the model's float32 inputs, exactly
        # with fewer active dimensions the exact posterior is still the oracle's: x.w ignores the zeroed ones
        xs[:, :, self.d_active:] = 0
        ys = (xs @ w.unsqueeze(-1)).squeeze(-1) + self.noise_std * torch.randn(B, K, generator=g, **new)
        ys = ys.float().double()  # as the pair tokens state them: the posterior reads those
        x = torch.zeros(B, K, 2, d + 2, device=w.device)
        x[:, :, 0, :d], x[:, :, 0, d + 1] = xs.float(), 1.0  # x token: [x_i, 0, 1]
        x[:, :, 1, :d], x[:, :, 1, d] = xs.float(), ys.float()  # pair token: [x_i, y_i, 0]
        x = x.view(B, 2 * K, d + 2)
        y = torch.zeros(B, K, 2, device=w.device)
        y[:, :, 0] = ys.float()
        mask = torch.zeros(B, K, 2, dtype=torch.bool, device=w.device)
        mask[:, :, 0] = True
        return Batch(x, y.view(B, 2 * K), mask.view(B, 2 * K), dict(w=w, xs=xs, ys=ys))

    def posterior(self, x):
        return regression_posterior(self, x)


# -----------------------------------------------------------------------------
# associative recall: random-access binding

@dataclass
class Recall(Task):
    """Tokens: PAD, STORE, FILLER, QUERY, SEP = 0..4, key i is 5 + i and value j is 5 + key_vocab + j;
    y at a query's key is the bound value j. Example (n_pairs=2, n_queries=2, key_vocab=4,
    value_vocab=4, filler=2; seed 0):

        x    1 7 4 9 1 8 4 11 2 2 3 7 0 2 3 8 0
        mask 0 0 0 0 0 0 0  0 0 0 0 1 0 0 0 1 0
        y    . . . . . . .  . . . . 0 . . . 2 .

    Key 2 (token 7) is bound to value 0 (token 9), key 3 (token 8) to value 2 (token 11).

    The layout is the authors' generator's, `[STORE k SEP v] x N, FILLER x F, then QUERY k PAD` with F/2 fillers
    between queries; the bound value is read at the query key position (causal)."""
    name = "recall"
    n_pairs: int = 64  # N stored key-value pairs
    n_queries: int = 3  # M queries of distinct stored keys
    key_vocab: int = 256  # keys drawn without replacement from this many tokens
    value_vocab: int = 256  # values drawn without replacement from this many tokens
    filler: int = 32  # F filler tokens after the store section; F//2 between queries
    query_gap: int = -1  # filler tokens between queries (-1 = filler // 2, the paper's layout)

    PAD, STORE, FILLER, QUERY, SEP = 0, 1, 2, 3, 4

    def __post_init__(self):
        for k in ("n_pairs", "n_queries", "key_vocab", "value_vocab"):
            v = getattr(self, k)
            check(isinstance(v, int) and v >= 1, f"recall: {k} must be an int >= 1, got {v}")
        check(isinstance(self.filler, int) and self.filler >= 0,
              f"recall: filler must be an int >= 0, got {self.filler}")
        check(isinstance(self.query_gap, int) and self.query_gap >= -1,
              f"recall: query_gap must be an int >= 0, or -1 for filler // 2; got {self.query_gap}")
        self.gap = self.filler // 2 if self.query_gap == -1 else self.query_gap
        check(self.n_pairs <= min(self.key_vocab, self.value_vocab),
              f"recall: n_pairs={self.n_pairs} needs key_vocab and value_vocab >= n_pairs "
              f"(got {self.key_vocab}, {self.value_vocab})")
        check(self.n_queries <= self.n_pairs, f"recall: n_queries={self.n_queries} must be <= n_pairs={self.n_pairs}")
        self.key_offset = 5
        self.answer_offset = self.key_offset + self.key_vocab
        self.vocab_size = self.answer_offset + self.value_vocab
        self.n_classes = self.value_vocab
        self.seq_len = 4 * self.n_pairs + self.filler + 3 * self.n_queries + (self.n_queries - 1) * self.gap

    def sample(self, batch_size, generator=None):
        B, N, M, g = batch_size, self.n_pairs, self.n_queries, generator
        keys = uniform_choice_without_replacement(B, self.key_vocab, N, g)
        vals = uniform_choice_without_replacement(B, self.value_vocab, N, g)
        which = uniform_choice_without_replacement(B, N, M, g)  # which stored pairs are queried
        col = lambda tok, n=1: torch.full((B, n), tok, dtype=torch.long, device=keys.device)
        store = [col(self.STORE, N), keys + self.key_offset, col(self.SEP, N), vals + self.answer_offset]
        parts = [torch.stack(store, -1).view(B, 4 * N), col(self.FILLER, self.filler)]
        for i in range(M):
            if i > 0 and self.gap:
                parts.append(col(self.FILLER, self.gap))
            query = keys.gather(1, which[:, i:i + 1]) + self.key_offset
            parts.append(torch.cat([col(self.QUERY), query, col(self.PAD)], 1))
        x = torch.cat(parts, 1)
        answer = torch.full_like(x, IGNORE)  # read at the queried keys: 4N + F + 1, then every 3 + gap tokens
        answer[:, 4 * N + self.filler + 1::3 + self.gap] = vals.gather(1, which)
        # slot: the queried pair's place in the store (accuracy by slot tells forgetting from never binding)
        return Batch(x, answer, answer != IGNORE, dict(answer=answer, slot=which))

    def posterior(self, x):
        return recall_posterior(self, x)

    def all_queries(self, **changes):
        """The training-only layout of --train_all_queries: every stored key queried once, in random order,
        right after the filler (Zoology's MQAR, Arora et al. 2023), so a sequence trains n_pairs answers.
        changes: other options at once (a curriculum's stage, e.g. n_pairs=2 below the task's n_queries)."""
        grown = [k for k in ("n_queries", "query_gap") if k in changes]
        check(not grown, f"recall: with --train_all_queries every stored key is queried (n_queries = n_pairs, "
                         f"query_gap = 0), so {grown and grown[0]} cannot grow; a curriculum can grow n_pairs")
        return replace(self, **changes | dict(n_queries=changes.get("n_pairs", self.n_pairs), query_gap=0))


# -----------------------------------------------------------------------------
# multi-hop recall: binding composed over k hops (Pavlovian paper, Thm 9 / wide vs deep)

@dataclass
class Hop(Task):
    """Tokens: SEP = 0, [k] = k for k = 1..hops, entity e is hops + 1 + e; y at a query's entity is
    the k-hop successor's index. Example (n_facts=4, depth=2, hops=2, mixed_hops=True, n_queries=2,
    n_entities=6; seed 0):

        x    3 8 5 6 8 4 6 7 0 2 5 1 8
        mask 0 0 0 0 0 0 0 0 0 0 1 0 1
        y    . . . . . . . . . . 4 . 1

    The facts are 0 -> 5, 2 -> 3, 5 -> 1, 3 -> 4 (chains 0 -> 5 -> 1 and 2 -> 3 -> 4): entity 2
    two hops on is 4, entity 5 one hop on is 1.

    N one-to-one facts a -> b over fresh entities form N/depth chains e_0 -> e_1 -> ... -> e_depth, shown as
    `a1 b1 ... aN bN` in shuffled order, then `SEP`, then queries `[k] e` whose answer, read at e (causal), is the
    k-hop successor of e. Each query's start is uniform over the chain positions with k successors; queries are
    independent (repeats possible)."""
    name = "hop"
    n_facts: int = 16  # N one-to-one facts a -> b in context
    depth: int = 4  # facts per chain; the N facts form N/depth chains
    hops: int = 2  # k: a query asks for the k-hop successor (the largest k when mixed_hops)
    mixed_hops: bool = False  # draw k per query uniformly from 1..hops
    n_queries: int = 4  # queries per sequence
    n_entities: int = 256  # entity vocabulary; a sequence uses N + N/depth distinct entities

    SEP = 0

    def __post_init__(self):
        for k in ("n_facts", "depth", "hops", "n_queries", "n_entities"):
            v = getattr(self, k)
            check(isinstance(v, int) and v >= 1, f"hop: {k} must be an int >= 1, got {v}")
        check(self.n_facts % self.depth == 0, f"hop: n_facts={self.n_facts} must be a multiple of depth={self.depth}")
        check(self.hops <= self.depth, f"hop: hops={self.hops} must be <= depth={self.depth} (facts per chain)")
        need = self.n_facts + self.n_facts // self.depth
        check(self.n_entities >= need, f"hop: n_entities={self.n_entities} must be >= n_facts + n_facts/depth = {need}")
        self.answer_offset = self.hops + 1
        self.vocab_size = self.answer_offset + self.n_entities
        self.n_classes = self.n_entities
        self.seq_len = 2 * self.n_facts + 1 + 2 * self.n_queries

    def sample(self, batch_size, generator=None):
        B, N, D, M, g, dev = batch_size, self.n_facts, self.depth, self.n_queries, generator, device_of(generator)
        n_chains, off = N // D, self.answer_offset
        chains = uniform_choice_without_replacement(B, self.n_entities, n_chains * (D + 1), g).view(B, n_chains, D + 1)
        a, b = chains[:, :, :-1].reshape(B, N), chains[:, :, 1:].reshape(B, N)  # fact i: a[i] -> b[i]
        order = torch.rand(B, N, generator=g, device=dev).argsort(-1)  # shuffled fact order
        a, b = a.gather(1, order), b.gather(1, order)
        k = (torch.randint(1, self.hops + 1, (B, M), generator=g, device=dev) if self.mixed_hops
             else torch.full((B, M), self.hops, device=dev))
        chain = torch.randint(n_chains, (B, M), generator=g, device=dev)
        start = (torch.rand(B, M, generator=g, device=dev) * (D - k + 1)).long()  # uniform over 0..D-k
        rows = torch.arange(B, device=dev)[:, None]
        query, target = chains[rows, chain, start], chains[rows, chain, start + k]  # (B, M)
        x = torch.cat([torch.stack([a, b], -1).view(B, 2 * N) + off, torch.full((B, 1), self.SEP, device=dev),
                       torch.stack([k, query + off], -1).view(B, 2 * M)], 1)
        mask = torch.zeros_like(x, dtype=torch.bool)
        mask[:, 2 * N + 2::2] = True  # the query entities
        answer = torch.full_like(x, IGNORE)
        answer[:, 2 * N + 2::2] = target
        return Batch(x, answer, mask, dict(answer=answer, chains=chains, k=k))

    def posterior(self, x):
        return hop_posterior(self, x)


TASKS = {task.name: task for task in (Bijection, HMM, Regression, Recall, Hop)}


def task_class(spec):
    """The class --task names: a built-in's name, or PATH.py:Class / module:Class, a dataclass subclass of Task
    with a name of its own; else a ValueError naming the valid choices."""
    if spec in TASKS:
        return TASKS[spec]
    if not is_spec(spec):
        raise ValueError(f"unknown task {spec!r}; valid tasks: {', '.join(TASKS)}, or PATH.py:Class or module:Class")
    cls = load_class(spec, "task")
    name = getattr(cls, "name", None)
    for ok, what in ((issubclass(cls, Task), f"{cls.__name__} is not a subclass of tasks.Task"),
                     (is_dataclass(cls), f"{cls.__name__} is not a @dataclass (its fields are its options)"),
                     (isinstance(name, str) and name.isidentifier(), f"{cls.__name__} has no name (a class attribute, "
                      f"e.g. name = \"dice\": its runs' folders and tables use it)"),
                     (name not in TASKS, f"its name {name!r} is a built-in task's: name it otherwise")):
        if not ok:
            raise ValueError(f"{spec}: {what}")
    return cls


def make_task(name, **overrides):
    """Build a task by name (or from a file, task_class); unknown names or options raise ValueError naming the valid
    ones, and so does a task of a file whose own code fails (its error, file and line)."""
    cls = task_class(name)
    valid = [f.name for f in fields(cls)]
    bad = [k for k in overrides if k not in valid]
    if bad:
        raise ValueError(f"unknown option(s) {', '.join(bad)} for task {name!r}; valid options: {', '.join(valid)}")
    try:
        return cls(**overrides)
    except (ValueError, TypeError) as e:  # a task's own refusal of its options: its message
        if name in TASKS:
            raise
        raise ValueError(f"{name}: {e}") from None
    except Exception as e:
        raise ValueError(f"{name}: building it raised {raised(e, name.rpartition(':')[0])}") from None

