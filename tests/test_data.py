"""Drawing batches for training: the worked examples in the task docstrings, the HMM header grid,
the masked losses, where batches are drawn, the tasks' options. The CUDA tests (batches drawn on the GPU, and no host
sync in a training step) skip without a GPU."""
import dataclasses
import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import batches
import hardware
import tasks
import presets
import settings
import train
from oracles import hmm_filter

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SMALL = {"bijection": dict(V=6), "hmm": dict(n_states=3, n_obs=4, K=6), "regression": dict(d=3, K=5),
         "recall": dict(n_pairs=4, n_queries=2, key_vocab=8, value_vocab=8, filler=2),
         "hop": dict(n_facts=4, depth=2, hops=2, n_queries=2, n_entities=12)}


EXAMPLES = {"bijection": dict(V=4, L=3), "hmm": dict(n_states=2, n_obs=2, K=2), "regression": dict(d=1, K=2),
            "recall": dict(n_pairs=2, n_queries=2, key_vocab=4, value_vocab=4, filler=2),
            "hop": dict(n_facts=4, depth=2, hops=2, mixed_hops=True, n_queries=2, n_entities=6)}
MORE_EXAMPLES = [("bijection", dict(V=4, L=3, layout="query"))]  # a task's other options, shown beside the first


def worked_example(task, seed=0):
    """One sequence drawn with `seed`, as the task docstrings show it: a column per position,
    numbers to 2 decimals, `.` where the loss never reads y."""
    b = task.sample(1, torch.Generator().manual_seed(seed))
    y, m = b.y[0], b.mask[0]
    unread = torch.zeros_like(y) if task.gaussian or task.soft_targets else torch.full_like(y, tasks.IGNORE)
    assert torch.equal(y[~m], unread[~m])  # what `.` stands for
    cell = lambda v: "[" + " ".join(map(cell, v)) + "]" if isinstance(v, list) else f"{round(v, 2):g}"
    rows = dict(x=[cell(v) for v in b.x[0].tolist()], mask=[str(int(s)) for s in m.tolist()],
                y=[cell(v) if s else "." for v, s in zip(y.tolist(), m.tolist())])
    width = [max(len(r[t]) for r in rows.values()) for t in range(task.seq_len)]
    return "\n".join(f"{k:<5}" + " ".join(c.rjust(w) for c, w in zip(r, width)) for k, r in rows.items())


@pytest.mark.parametrize("name, opts", [(name, EXAMPLES[name]) for name in tasks.TASKS] + MORE_EXAMPLES)
def test_each_task_docstring_shows_what_its_sampler_draws(name, opts):
    seed = 0
    doc = inspect.cleandoc(tasks.TASKS[name].__doc__)
    header = f"Example ({', '.join(f'{k}={v}' for k, v in opts.items())}; seed {seed}"
    assert header in " ".join(doc.split()), header
    block = "\n".join("    " + line for line in worked_example(tasks.make_task(name, **opts), seed).splitlines())
    assert block in doc, f"the {name} docstring should show\n{block}"


@pytest.mark.parametrize("with_replacement", [False, True])
def test_the_query_layout_draws_bijections_with_a_context_key_as_query(with_replacement):
    V, L, B = 5, 4 if not with_replacement else 7, 3000
    task = tasks.make_task("bijection", V=V, L=L, with_replacement=with_replacement, layout="query")
    assert (task.vocab_size, task.n_classes, task.answer_offset, task.seq_len) == (V, V, 0, 2 * L + 1)
    batch = task.sample(B, torch.Generator().manual_seed(0))
    x, y, m, perm = batch.x, batch.y, batch.mask, batch.latent["perm"]
    assert x.shape == y.shape == m.shape == (B, 2 * L + 1) and x.dtype == torch.long and perm.shape == (B, V)
    assert (x >= 0).all() and (x < V).all()  # keys and values share the tokens 0..V-1
    assert (perm.sort(-1).values == torch.arange(V)).all()  # each latent is a permutation
    keys, vals, q = x[:, 0:2 * L:2], x[:, 1:2 * L:2], x[:, -1]
    assert torch.equal(vals, perm.gather(1, keys))  # every pair shown is (k, pi(k))
    if not with_replacement:
        assert (keys.sort(-1).values.diff(dim=-1) > 0).all()  # distinct keys
    scored = torch.zeros(2 * L + 1, dtype=torch.bool)
    scored[0:2 * L:2], scored[-1] = True, True  # every key, then the query; never a value
    assert (m == scored).all()
    assert torch.equal(y[m].view(B, L + 1), torch.cat([vals, perm.gather(1, q[:, None])], 1))
    assert (y[~m] == tasks.IGNORE).all()
    hit = keys == q[:, None]
    assert hit.any(1).all()  # the query is a context key ...
    if not with_replacement:  # ... drawn uniformly from the L positions: each count within 5 standard errors
        counts = torch.bincount(hit.float().argmax(1), minlength=L).double()
        assert ((counts - B / L).abs() < 5 * math.sqrt(B / L * (1 - 1 / L))).all(), counts
    again = task.sample(B, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip((x, y, m, perm), (again.x, again.y, again.mask, again.latent["perm"])))
    assert not torch.equal(x, task.sample(B, torch.Generator().manual_seed(1)).x)


def test_the_bijection_layout_is_a_flag_and_a_typo_names_the_choices():
    known, given, _ = settings.parse_args(["--task", "bijection", "--layout", "query"])
    run = settings.resolve(known, given)
    assert run.task_opts["layout"] == "query" and run.tasks["default"].vocab_size == 20
    with pytest.raises(ValueError, match=r"^bijection: layout must be one of separate, query, got 'shared'$"):
        tasks.make_task("bijection", layout="shared")


def rounded_cents(row, floor=5):
    """Floor at 0.05, renormalise, round to cents (half to even, as numpy's rint), lift to the floor."""
    p = [max(x, floor / 100) for x in row]
    return [max(round(x / sum(p) * 100), floor) for x in p]


def cents_row_by_row(row, floor=5):
    """The authors' procedure, one row at a time in plain Python: the rounded cents, then order the
    entries once, ascending cents to add and descending to remove (ties by index), and walk that
    order round-robin, one cent per entry visited, skipping an entry at 100 or at the floor, until
    the row sums to 100."""
    c = rounded_cents(row, floor)
    diff = 100 - sum(c)
    order = sorted(range(len(c)), key=lambda j: c[j] if diff > 0 else -c[j])  # sorted() is stable
    i = 0
    while diff:
        j = order[i % len(c)]
        if diff > 0 and c[j] < 100:
            c[j], diff = c[j] + 1, diff - 1
        elif diff < 0 and c[j] > floor:
            c[j], diff = c[j] - 1, diff + 1
        i += 1
    return c


def rounding_to(cents, floor=5):
    """A row whose rounded cents are `cents`: the entries at the floor are 0 (clamped up to it),
    the others cents / 100 of the clamped sum."""
    rest = sum(x for x in cents if x > floor) / 100
    s = floor / 100 * sum(x <= floor for x in cents) / (1 - rest)  # the clamped sum
    return [x / 100 * s if x > floor else 0.0 for x in cents]


@pytest.mark.parametrize("row, rounded, fixed", [
    (rounding_to([33, 54, 5, 5, 5]), [33, 54, 5, 5, 5], [32, 53, 5, 5, 5]),  # 2 over: one from each of the two largest
    (rounding_to([6, 7, 60] + [5] * 8), [6, 7, 60] + [5] * 8, [5, 5, 50] + [5] * 8),  # 13 over: 6 and 7 reach the floor
    ([0.104] * 9 + [0.064], [10] * 9 + [6], [11, 11, 11] + [10] * 6 + [7]),  # 4 short: the 6, then the first three 10s
])
def test_the_cents_grid_walks_the_entries_round_robin(row, rounded, fixed):
    assert rounded_cents(row) == rounded
    assert tasks.to_cents_grid(torch.tensor([row], dtype=torch.float64)).tolist() == [fixed] == [cents_row_by_row(row)]


@pytest.mark.parametrize("n", range(2, 21))
def test_the_cents_grid_is_the_row_by_row_procedure(n):
    p = tasks.dirichlet1((3000, n), torch.Generator().manual_seed(n))
    c = tasks.to_cents_grid(p.view(1000, 3, n)).view(3000, n)  # any leading shape
    assert c.tolist() == [cents_row_by_row(row) for row in p.tolist()]
    assert (c.sum(-1) == 100).all() and (c >= 5).all()


def test_the_hmm_header_states_valid_rows():
    task = tasks.make_task("hmm")
    batch = task.sample(500, torch.Generator().manual_seed(0))
    S, O = task.n_states, task.n_obs
    for start, rows, cols, name in ((1, S, S, "trans"), (2 + S * S, S, O, "emit")):
        c = batch.x[:, start:start + rows * cols].view(-1, rows, cols)
        assert (c.sum(-1) == 100).all() and (c >= 5).all()
        assert torch.equal(c.double() / 100, batch.latent[name])


def masked_reference_loss(task, out, batch):
    """The loss over out[mask] only, by boolean indexing."""
    m = batch.mask
    if task.gaussian:
        mean, logvar = out[..., 0][m], out[..., 1][m]
        return 0.5 * (logvar + (batch.y[m] - mean) ** 2 * torch.exp(-logvar) + math.log(2 * math.pi)).mean()
    if task.soft_targets:
        return -(batch.y[m] * F.log_softmax(out[m], -1)).sum(-1).mean()
    return F.cross_entropy(out[m], batch.y[m])


@pytest.mark.parametrize("name", list(SMALL))
def test_the_masked_sum_loss_equals_the_loss_over_scored_positions(name):
    task = tasks.make_task(name, **SMALL[name])
    batch = task.sample(16, torch.Generator().manual_seed(0))
    grads = []
    for loss_fn in (task.loss, lambda o, b: masked_reference_loss(task, o, b)):
        out = torch.randn(16, task.seq_len, task.n_classes, generator=torch.Generator().manual_seed(1)).requires_grad_()
        loss = loss_fn(out, batch)
        loss.backward()
        grads.append((loss.detach(), out.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-6, atol=1e-8)


def test_an_extreme_unscored_output_leaves_the_gaussian_gradient_finite():
    task = tasks.make_task("regression", **SMALL["regression"])
    batch = task.sample(4, torch.Generator().manual_seed(0))
    out = torch.zeros(4, task.seq_len, 2)
    out[..., 1][~batch.mask] = -1e4  # exp(-logvar) overflows where nothing is scored
    out.requires_grad_()
    task.loss(out, batch).backward()
    assert torch.isfinite(out.grad).all() and (out.grad[~batch.mask] == 0).all()


def test_memory_can_skip_the_checks_that_read_values_back():
    from linear_attn import memory
    q, k, v = (torch.randn(1, 1, 4, 3) for _ in range(3))
    beta = torch.full((1, 1, 4), 1.5)  # out of (0, 1] for the delta rule
    with pytest.raises(ValueError, match="beta must lie in"):
        memory(q, k, v, "delta", beta)
    memory(q, k, v, "delta", beta, check_values=False)  # the caller vouches for its inputs
    with pytest.raises(ValueError, match="beta must lie in"):  # a number costs no sync: always checked
        memory(q, k, v, "delta", 1.5, check_values=False)


def test_batches_are_drawn_on_the_cpu_unless_training_on_a_gpu():
    run = settings.run_of("hmm", "transformer", "quick", {})
    gen, chunk = batches.data_source(run.train, torch.device("cpu"))
    assert gen.device.type == "cpu" and chunk == 1
    gen, chunk = batches.data_source(run.train | dict(data_device="device", data_chunk=3), torch.device("cpu"))
    assert gen.device.type == "cpu" and chunk == 3


@cuda
@pytest.mark.parametrize("name", list(SMALL))
def test_a_batch_drawn_with_a_gpu_generator_lives_on_the_gpu(name):
    task = tasks.make_task(name, **SMALL[name])
    batch = task.sample(32, torch.Generator(device="cuda").manual_seed(0))
    for t in [batch.x, batch.y, batch.mask, *batch.latent.values()]:
        assert t.device.type == "cuda"
    assert batch.mask.sum().item() == 32 * int(task.sample(1).mask.sum())
    if name == "hmm":  # the soft targets are the filter, computed on the GPU
        lat = {k: v.cpu() for k, v in batch.latent.items()}
        torch.testing.assert_close(batch.y[batch.mask].cpu().view(32, -1, task.n_states),
                                   hmm_filter(lat["trans"], lat["emit"], lat["obs"]).float())


SMALL_MODELS = {"transformer": dict(n_layer=1, n_head=2, d_model=16), "mamba": dict(n_layer=1, d_model=16),
                "lstm": dict(n_layer=1, d_model=16), "mlp": dict(n_layer=2, d_model=16),
                "linear_attn": dict(n_layer=1, n_head=2, d_model=16),
                "linear_attn delta": dict(n_layer=1, n_head=2, d_model=16, rule="delta", learn_beta=True),
                "linear_attn oja": dict(n_layer=1, n_head=2, d_model=16, rule="oja", learn_beta=True)}


@cuda
@pytest.mark.parametrize("name, model", [(t, "transformer") for t in SMALL]
                         + [("hmm", m) for m in SMALL_MODELS if m != "transformer"])
def test_a_training_step_on_the_gpu_never_waits_for_it(name, model):
    run = settings.run_of(name, model.split()[0], "quick", SMALL[name] | SMALL_MODELS[model])
    hardware.sync_free_step(run, torch.device("cuda"))  # the check `bench.py gpu` runs


def test_recall_training_layout_queries_every_stored_key_once_in_random_order():
    task = tasks.make_task("recall", n_pairs=5, n_queries=2, key_vocab=9, value_vocab=9, filler=4)
    every = task.all_queries()
    assert (every.n_queries, every.gap, task.gap) == (5, 0, 2)
    assert every.seq_len == 4 * 5 + 4 + 3 * 5 and every.seq_len > task.seq_len
    b = every.sample(64, torch.Generator().manual_seed(0))
    assert (b.x[:, 20:24] == task.FILLER).all()  # the filler, then the queries back to back
    assert (b.x[:, 24::3] == task.QUERY).all() and (b.x[:, 26::3] == task.PAD).all()
    assert b.mask.sum(1).eq(5).all() and b.mask[:, 25::3].all()
    store_keys, store_vals = b.x[:, 1:20:4], b.x[:, 3:20:4] - task.answer_offset
    for i in range(64):  # each stored key once; the answer is the value it was stored with
        queried = b.x[i, 25::3]
        assert sorted(queried.tolist()) == sorted(store_keys[i].tolist())
        bound = {k: v for k, v in zip(store_keys[i].tolist(), store_vals[i].tolist())}
        assert b.latent["answer"][i, 25::3].tolist() == [bound[k] for k in queried.tolist()]
    orders = {tuple(s) for s in b.latent["slot"].tolist()}
    assert len(orders) > 32  # random order, not the store's


def test_recall_query_gap_places_the_queries():
    task = tasks.make_task("recall", n_pairs=4, n_queries=3, key_vocab=8, value_vocab=8, filler=2, query_gap=5)
    b = task.sample(8, torch.Generator().manual_seed(0))
    assert task.seq_len == 16 + 2 + 9 + 2 * 5 == b.x.shape[1]
    assert b.mask[:, 19::8].all() and b.mask.sum(1).eq(3).all() and (b.x[:, 21:26] == task.FILLER).all()
    with pytest.raises(ValueError, match="query_gap must be an int >= 0, or -1"):
        tasks.make_task("recall", query_gap=-2)


def test_hop_is_deterministic_and_fresh():
    task = tasks.make_task("hop")
    a, b = (task.sample(4, torch.Generator().manual_seed(3)) for _ in range(2))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.x[0], a.x[1])  # every sequence draws its own facts


@pytest.mark.parametrize("opts, match", [
    (dict(n_facts=10, depth=4), "n_facts=10 must be a multiple of depth=4"),
    (dict(hops=5), "hops=5 must be <= depth=4"),
    (dict(n_entities=19), "n_entities=19 must be >= n_facts \\+ n_facts/depth = 20"), (dict(n_queries=0), "n_queries"),
    (dict(hop=2), "valid options: n_facts, depth, hops, mixed_hops, n_queries, n_entities")])
def test_hop_bad_options(opts, match):
    with pytest.raises(ValueError, match=match):
        tasks.make_task("hop", **opts)


# -----------------------------------------------------------------------------
# the paper's setup, pinned: a default or a hand-over that drifts fails here, not silently in a table

def test_every_task_hands_a_model_these_io_fields():
    # what a task tells its model (tasks.IO_FIELDS), task by task at its defaults: a changed value, or a field
    # added or dropped, changes every model built for it
    assert tasks.IO_FIELDS == ("vocab_size", "n_features", "n_classes", "answer_offset", "gaussian")
    want = dict(bijection=(40, 0, 20, 20, False), hmm=(110, 0, 5, None, False), regression=(0, 10, 2, None, True),
                recall=(517, 0, 256, 261, False), hop=(259, 0, 256, 3, False))
    assert set(want) == set(tasks.TASKS)
    for name, values in want.items():
        task = tasks.make_task(name)
        assert tuple(getattr(task, k) for k in tasks.IO_FIELDS) == values, name
        for model, (Config, _) in presets.MODELS.items():  # fill_io hands each built-in model the fields it has
            names = {f.name for f in dataclasses.fields(Config)}
            io = presets.fill_io(model, task, {}, task.seq_len)
            assert {k: io[k] for k in tasks.IO_FIELDS if k in names} == dict(zip(tasks.IO_FIELDS, values)), \
                (name, model)
            assert {"vocab_size", "n_classes"} <= names and io.get("block_size", task.seq_len) == task.seq_len


@pytest.mark.parametrize("task_name", ["bijection", "recall", "hop"])
def test_the_transformer_reads_answers_off_the_answer_tokens_embeddings(task_name):
    # the paper's tied head: logits = h @ (the C answer tokens' embedding rows)^T, no head of its own, by default
    assert presets.TransformerConfig.tie_head is True and presets.TransformerConfig.head_vocab is False
    run = settings.run_of(task_name, "transformer", "quick", dict(d_model=16, n_layer=1, n_head=2))
    torch.manual_seed(0)
    (model, _), task = train.build(run, torch.device("cpu")), run.tasks["default"]
    assert model.tied and not any("head" in n for n, _ in model.named_parameters())
    x = task.sample(2, torch.Generator().manual_seed(0)).x
    _, inside = model(x, return_internals=True)
    C, a = task.n_classes, task.answer_offset
    torch.testing.assert_close(model(x), inside["final"] @ model.wte.weight[a:a + C].T)


def test_recall_values_have_a_vocabulary_of_their_own():
    # keys and values are different tokens: value j is token 5 + key_vocab + j, the answers are the values
    task = tasks.make_task("recall")
    assert (task.n_pairs, task.key_vocab, task.value_vocab) == (64, 256, 256)
    assert task.answer_offset == 5 + task.key_vocab and task.n_classes == task.value_vocab
    assert task.vocab_size == 5 + task.key_vocab + task.value_vocab
    b = task.sample(4, torch.Generator().manual_seed(0))
    keys = (b.x >= 5) & (b.x < task.answer_offset)
    values = b.x >= task.answer_offset
    assert keys.any() and values.any() and (b.y[b.mask] < task.value_vocab).all()
    stored = [set((row[v] - task.answer_offset).tolist()) for row, v in zip(b.x, values)]  # each row's values
    assert all(set(y[m].tolist()) <= s for y, m, s in zip(b.y, b.mask, stored))  # the answer is a stored value


def test_hmm_states_its_matrices_exactly_on_the_cents_grid():
    # the authors' header: every row of T and E on the 2-decimal grid, floored at 0.05, summing to 1, and the
    # oracle filters with those very numbers (discretize=True by default)
    task = tasks.make_task("hmm")
    assert task.discretize is True and (task.n_states, task.n_obs, task.K) == (5, 5, 20)
    b = task.sample(64, torch.Generator().manual_seed(0))
    S, O = task.n_states, task.n_obs
    tc, ec = b.x[:, 1:1 + S * S].view(-1, S, S), b.x[:, 2 + S * S:2 + S * S + S * O].view(-1, S, O)
    for cents, p in ((tc, b.latent["trans"]), (ec, b.latent["emit"])):
        assert (cents.sum(-1) == 100).all() and (cents >= 5).all()
        assert torch.equal(p, cents.double() / 100)
