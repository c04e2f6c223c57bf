"""Every oracle against an independent brute-force computation, and the metrics on hand-made cases."""
import itertools
import math

import pytest
import torch

from oracles import Metrics, entropy_bits, gaussian_entropy_bits, gaussian_kl_bits, hmm_header, oracle
from tasks import IGNORE, TASKS, Task, make_task


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("opts", [dict(V=5, L=5), dict(V=4, L=3), dict(V=4, L=7, with_replacement=True),
                                  dict(V=5, L=5, layout="query"), dict(V=4, L=3, layout="query"),
                                  dict(V=4, L=7, with_replacement=True, layout="query")])
def test_bijection_against_enumerated_permutations(opts):
    """Read off the context alone: a scored position holds a key, and the pairs before it are (x_j, x_j+1)."""
    task = make_task("bijection", **opts)
    batch = task.sample(8, gen(1))
    probs = oracle(task, batch)
    V, off = task.V, task.answer_offset
    assert probs.dtype == torch.float64 and (probs[~batch.mask] == 0).all()
    for b in range(8):
        seq = batch.x[b].tolist()
        scored = [t for t in range(len(seq)) if batch.mask[b, t]]
        assert scored == list(range(0, 2 * task.L, 2)) + ([2 * task.L] if task.layout == "query" else [])
        for t in scored:
            k, shown = seq[t], [(seq[j], seq[j + 1] - off) for j in range(0, t - 1, 2)]
            consistent = [p for p in itertools.permutations(range(V)) if all(p[kk] == vv for kk, vv in shown)]
            brute = torch.zeros(V, dtype=torch.float64)
            for p in consistent:
                brute[p[k]] += 1 / len(consistent)
            assert torch.allclose(probs[b, t], brute, atol=1e-12)
            assert batch.y[b, t] == batch.latent["perm"][b, k]  # the target is the key's value
    assert torch.allclose(probs[batch.mask].sum(-1), torch.ones(int(batch.mask.sum()), dtype=torch.float64))


@pytest.mark.parametrize("layout", ["separate", "query"])
def test_bijection_entropy_curve_is_log2_V_minus_t(layout):
    task = make_task("bijection", layout=layout)  # V=20, L=19, without replacement
    batch = task.sample(16, gen(2))
    H = entropy_bits(oracle(task, batch)[batch.mask]).view(16, -1)
    expected = [math.log2(20 - t) for t in range(19)] + ([0.0] if layout == "query" else [])  # the query: seen
    assert torch.allclose(H, torch.tensor(expected, dtype=torch.float64).expand(16, -1), atol=1e-12)


@pytest.mark.parametrize("discretize", [True, False])
def test_hmm_against_sum_over_paths(discretize):
    task = make_task("hmm", n_states=3, n_obs=2, K=5, discretize=discretize)
    batch = task.sample(4, gen(3))
    probs = oracle(task, batch)[batch.mask].view(4, 5, 3)
    T, E, obs = batch.latent["trans"], batch.latent["emit"], batch.latent["obs"]
    if not discretize:  # the header states each entry to the cent: the filter of what it states, not of the latents
        header = batch.x[:, :task.header_len]
        T, E = hmm_header(header[:, 1:10].view(4, 3, 3)), hmm_header(header[:, 11:17].view(4, 3, 2))
    for b in range(4):
        for t in range(5):
            post = torch.zeros(3, dtype=torch.float64)
            for path in itertools.product(range(3), repeat=t + 1):
                p = 1 / 3 * E[b, path[0], obs[b, 0]]
                for i in range(1, t + 1):
                    p = p * T[b, path[i - 1], path[i]] * E[b, path[i], obs[b, i]]
                post[path[-1]] += p
            assert torch.allclose(probs[b, t], post / post.sum(), atol=1e-12)


def test_hmm_header_states_the_matrices_exactly():
    task = make_task("hmm")
    batch = task.sample(32, gen(4))
    S, O = task.n_states, task.n_obs
    header = batch.x[:, :task.header_len]
    trans = header[:, 1:1 + S * S].view(-1, S, S).double() / 100
    emit = header[:, 2 + S * S:2 + S * S + S * O].view(-1, S, O).double() / 100
    assert torch.equal(trans, batch.latent["trans"]) and torch.equal(emit, batch.latent["emit"])
    assert (trans >= 0.05).all() and torch.allclose(trans.sum(-1), torch.ones(32, S, dtype=torch.float64))
    assert (batch.x[batch.mask] - 105 == batch.latent["obs"].reshape(-1)).all()
    assert torch.allclose(batch.y[batch.mask].double(), oracle(task, batch)[batch.mask], atol=1e-6)


@pytest.mark.parametrize("d_active", [0, 2])  # 2: inputs vary in 2 of the 3 dimensions (a curriculum's stage)
def test_regression_against_joint_gaussian_conditioning(d_active):
    task = make_task("regression", d=3, K=6, noise_std=0.3, prior_std=1.5, d_active=d_active)
    batch = task.sample(5, gen(5))
    mean, var = oracle(task, batch)
    xs, ys = batch.latent["xs"], batch.latent["ys"]
    assert (xs[:, :, task.d_active:] == 0).all() and (xs[:, :, :task.d_active] != 0).all()
    assert (batch.x[:, :, task.d_active:3] == 0).all()
    s2, t2 = task.noise_std ** 2, task.prior_std ** 2
    for b in range(5):
        # (y_1..y_K) is jointly Gaussian: Cov(y_i, y_j) = tau^2 x_i.x_j + sigma^2 [i = j]
        cov = t2 * xs[b] @ xs[b].T + s2 * torch.eye(6, dtype=torch.float64)
        for t in range(6):
            c, C = cov[t, :t], cov[:t, :t]
            m = c @ torch.linalg.solve(C, ys[b, :t]) if t else torch.tensor(0.0, dtype=torch.float64)
            v = cov[t, t] - (c @ torch.linalg.solve(C, c) if t else 0)
            assert math.isclose(mean[b, 2 * t].item(), m.item(), abs_tol=1e-9)
            assert math.isclose(var[b, 2 * t].item(), v.item(), rel_tol=1e-9)


def test_recall_oracle_is_the_bound_value():
    task = make_task("recall", n_pairs=6, n_queries=4, key_vocab=10, value_vocab=9, filler=4)
    batch = task.sample(8, gen(6))
    probs = oracle(task, batch)
    for b in range(8):
        seq = batch.x[b].tolist()
        store = {seq[4 * i + 1]: seq[4 * i + 3] - task.answer_offset for i in range(6)}
        queries = [t for t in range(len(seq)) if batch.mask[b, t]]
        assert len(queries) == 4
        for t in queries:
            assert seq[t - 1] == task.QUERY
            assert probs[b, t].argmax().item() == store[seq[t]] and probs[b, t].max() == 1
            assert batch.y[b, t] == store[seq[t]]
    assert (batch.y[~batch.mask] == IGNORE).all()


@pytest.mark.parametrize("mixed_hops", [False, True])
def test_hop_oracle_follows_the_facts_in_context(mixed_hops):
    task = make_task("hop", n_facts=6, depth=3, hops=3, mixed_hops=mixed_hops, n_queries=4, n_entities=10)
    batch = task.sample(8, gen(9))
    probs, off = oracle(task, batch), task.answer_offset
    for b in range(8):
        seq = batch.x[b].tolist()
        succ = {seq[2 * i] - off: seq[2 * i + 1] - off for i in range(6)}
        for t in [t for t in range(len(seq)) if batch.mask[b, t]]:
            e = seq[t] - off
            for _ in range(seq[t - 1]):  # the hop token is k
                e = succ[e]
            assert probs[b, t].argmax().item() == e == batch.y[b, t] and probs[b, t].max() == 1


def follow_by_hand(seq, task, t):
    """Brute force: read the facts off the context into a dict and follow the chain k times."""
    N, off = task.n_facts, task.answer_offset
    succ = {seq[2 * i] - off: seq[2 * i + 1] - off for i in range(N)}
    e, k = seq[t] - off, seq[t - 1]
    for _ in range(k):
        e = succ[e]
    return e


@pytest.mark.parametrize("opts", [dict(),
                                  dict(n_facts=12, depth=3, hops=3, mixed_hops=True, n_queries=6, n_entities=16),
                                  dict(n_facts=5, depth=5, hops=5, n_entities=6)])
def test_hop_oracle_follows_the_chain(opts):
    task = make_task("hop", **opts)
    batch = task.sample(16, torch.Generator().manual_seed(0))
    probs = oracle(task, batch)
    N, off = task.n_facts, task.answer_offset
    assert batch.x.shape == (16, task.seq_len) and batch.mask.sum(1).eq(task.n_queries).all()
    assert (batch.y[~batch.mask] == IGNORE).all() and torch.equal(batch.y, batch.latent["answer"])
    for b in range(16):
        seq = batch.x[b].tolist()
        heads, tails = seq[0:2 * N:2], seq[1:2 * N:2]
        assert len(set(heads)) == len(set(tails)) == N  # one-to-one
        assert seq[2 * N] == task.SEP and min(heads + tails) >= off
        starts = set(heads) - set(tails)  # chain starts: N/depth chains of exactly depth facts
        succ = dict(zip(heads, tails))
        for s in starts:
            n = 0
            while s in succ:
                s, n = succ[s], n + 1
            assert n == task.depth
        for t in batch.mask[b].nonzero().flatten().tolist():
            assert 1 <= seq[t - 1] <= task.hops
            e = follow_by_hand(seq, task, t)
            assert probs[b, t, e] == 1 and probs[b, t].sum() == 1 and batch.y[b, t] == e
    if task.mixed_hops:
        assert set(batch.latent["k"].flatten().tolist()) == set(range(1, task.hops + 1))
    m = Metrics()
    m.update(task, batch, probs.clamp(min=1e-300).log())
    r = m.result(task)
    assert r["accuracy"] == 1 and r["kl"] < 1e-9 and r["mae_token"] < 1e-9


def test_every_task_has_an_oracle():
    assert all(cls.name == name and cls.posterior is not Task.posterior for name, cls in TASKS.items())


def test_metric_conventions_on_hand_made_outputs():
    # bijection V=8, L=2: the oracle says 3 bits at the first key and log2(7) at the second
    task = make_task("bijection", V=8, L=2)
    batch = task.sample(2, gen(7))
    out = torch.zeros(2, 3, 8)
    out[0, 2, 4:] = -1e9  # sequence 0, second key: uniform over 4 values (2 bits)
    m = Metrics()
    m.update(task, batch, out)  # sequence 1, second key: uniform over 8 (3 bits)
    r = m.result(task)
    h7 = math.log2(7)
    assert math.isclose(r["mae_curve"], abs(2.5 - h7) / 2, abs_tol=1e-9)  # means per position first
    assert math.isclose(r["mae_token"], ((h7 - 2) + (3 - h7)) / 2 / 2, abs_tol=1e-9)  # per token
    assert r["mae_token"] >= r["mae_curve"]
    assert r["curve_oracle"] == pytest.approx([3.0, h7])


def test_kl_is_zero_for_the_oracle_itself():
    for name, opts in [("hmm", dict(K=6)), ("bijection", dict(V=6)), ("bijection", dict(V=6, layout="query")),
                       ("regression", dict(K=5))]:
        task = make_task(name, **opts)
        batch = task.sample(16, gen(8))
        if task.gaussian:
            mean, var = oracle(task, batch)
            out = torch.stack([mean, var.log()], -1)
        else:
            out = oracle(task, batch).clamp(min=1e-300).log()
        r = Metrics()
        r.update(task, batch, out)
        r = r.result(task)
        assert r["kl"] < 1e-9 and r["mae_token"] < 1e-9, name


def test_gaussian_entropy_known_value():
    assert math.isclose(gaussian_entropy_bits(torch.tensor(1 / (2 * math.pi * math.e))).item(), 0.0, abs_tol=1e-12)


@pytest.mark.parametrize("name, opts", [("bijection", {}), ("bijection", dict(V=6, with_replacement=True)),
                                        ("bijection", dict(layout="query")),
                                        ("bijection", dict(V=6, with_replacement=True, layout="query")),
                                        ("hmm", {}), ("regression", {}), ("recall", {}), ("hop", {})])
def test_sampled_answers_follow_the_oracles_distribution(name, opts):
    """If the data are drawn from the distribution the oracle conditions on, the oracle's log-loss on
    the true answers (hmm: the hidden states) equals its entropy in expectation: E[-log2 p(Y)] = E[H]."""
    task = make_task(name, **opts)
    batch = task.sample(2000, gen(7))
    m = batch.mask
    if task.gaussian:
        mean, var = oracle(task, batch)
        y = batch.latent["ys"].double().reshape(-1)  # query i of a row asks for its y_i
        logloss = 0.5 * torch.log2(2 * math.pi * var[m]) + (y - mean[m]) ** 2 / (2 * var[m] * math.log(2))
        H = gaussian_entropy_bits(var[m])
    else:
        p = oracle(task, batch)[m]
        ans = task.outcome(batch)[m]
        logloss, H = -torch.log2(p.gather(1, ans[:, None]).squeeze(1)), entropy_bits(p)
    d = (logloss - H).view(m.shape[0], -1).mean(1)  # per sequence: independent draws
    se = d.std() / math.sqrt(len(d)) + 1e-12
    assert abs(d.mean()) < 4 * se, (d.mean().item(), se.item())


def test_metrics_accumulate_over_evaluation_batches():
    task = make_task("hmm", K=6)
    batch = task.sample(300, gen(3))
    out = torch.randn(300, task.seq_len, task.n_classes, generator=gen(4))
    whole, parts = Metrics(), Metrics()
    whole.update(task, batch, out)
    for i in range(0, 300, 128):  # 128, 128, 44
        parts.update(task, batch.map(lambda t: t[i:i + 128]), out[i:i + 128])
    a, b = whole.result(task), parts.result(task)
    assert b["n_sequences"] == 300
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-9), k


def test_gaussian_kl_by_hand():
    one = torch.tensor(1.0, dtype=torch.float64)
    # KL(N(0,1) || N(1,2)) = 1/2 (ln 2 + (1 + 1) / 2 - 1) nats = 1/2 bit; the reverse is not symmetric
    assert gaussian_kl_bits(0 * one, one, one, 2 * one).item() == pytest.approx(0.5, abs=1e-12)
    assert gaussian_kl_bits(one, 2 * one, 0 * one, one).item() == pytest.approx((math.log(0.5) + 2) / 2 / math.log(2))


def test_regression_kl_is_the_oracle_against_the_model_not_the_reverse():
    # a model that is off by one and four times too wide: KL(p || q) and KL(q || p) differ at every position
    task = make_task("regression", K=5, d=2)
    batch = task.sample(8, gen(11))
    mean, var = oracle(task, batch)
    out = torch.stack([mean + 1, (4 * var).log()], -1)
    m = Metrics()
    m.update(task, batch, out)
    v = var[batch.mask].tolist()
    forward = [0.5 * (math.log(4) + (x + 1) / (4 * x) - 1) / math.log(2) for x in v]  # KL(N(m, v) || N(m+1, 4v))
    reverse = [0.5 * (math.log(1 / 4) + (4 * x + 1) / x - 1) / math.log(2) for x in v]  # KL(N(m+1, 4v) || N(m, v))
    kl = m.result(task)["kl"]
    assert kl == pytest.approx(sum(forward) / len(v), rel=1e-12)
    assert abs(kl - sum(reverse) / len(v)) > 0.5


def test_kl_and_bayes_accuracy_by_hand():
    """bijection V=3, L=3 without replacement: the oracle is uniform over 3, then 2, then 1 unused values."""
    task = make_task("bijection", V=3, L=3)
    batch = task.sample(5, gen(0))
    m = Metrics()
    m.update(task, batch, torch.zeros(5, task.seq_len, 3))  # a uniform model
    r = m.result(task)
    assert r["oracle_accuracy"] == pytest.approx((1 / 3 + 1 / 2 + 1) / 3)  # mean of max_c p(c)
    lg3 = math.log2(3)
    assert r["kl"] == pytest.approx(((lg3 - lg3) + (lg3 - 1) + (lg3 - 0)) / 3)  # KL(p || uniform) = log2 3 - H(p)
    assert r["mae_token"] == pytest.approx(r["kl"]) and r["mae_curve"] == pytest.approx(r["kl"])


@pytest.mark.parametrize("task, batch_of", [
    (dict(name="bijection", V=7), dict(name="bijection", V=5)),
    (dict(name="bijection", V=7, L=4), dict(name="bijection", V=5, L=4)),  # same length, other V
    (dict(name="hmm", n_states=4), dict(name="hmm", n_states=3)),
    (dict(name="regression", d=3), dict(name="regression", d=2)),
    (dict(name="bijection", V=5), dict(name="recall")),
    (dict(name="bijection", V=5, L=4), dict(name="bijection", V=5, L=3, layout="query")),  # both 7 tokens
    (dict(name="bijection", V=5, L=3, layout="query"), dict(name="bijection", V=5, L=4)),
])
def test_oracle_refuses_a_batch_of_another_task(task, batch_of):
    task, other = make_task(**task), make_task(**batch_of)
    with pytest.raises(ValueError, match="the batch was not drawn from this task"):
        oracle(task, other.sample(4, gen(0)))


def test_recall_accuracy_by_stored_pair_counts_every_query_once():
    task = make_task("recall", n_pairs=4, n_queries=2, key_vocab=8, value_vocab=8, filler=2)
    m, hits, counts = Metrics(), torch.zeros(4), torch.zeros(4)
    for seed in range(3):  # several batches accumulate
        batch = task.sample(40, torch.Generator().manual_seed(seed))
        out = torch.randn(40, task.seq_len, task.n_classes, generator=torch.Generator().manual_seed(10 + seed))
        right = out.argmax(-1)[batch.mask].view(40, 2) == batch.y[batch.mask].view(40, 2)
        for b in range(40):
            for q in range(2):
                s = batch.latent["slot"][b, q]
                hits[s] += float(right[b, q])
                counts[s] += 1
        m.update(task, batch, out)
    r = m.result(task)
    assert r["accuracy_by_slot"] == pytest.approx((hits / counts).tolist())
    assert r["accuracy"] == pytest.approx(hits.sum().item() / counts.sum().item())
