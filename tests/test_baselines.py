"""The LSTM and MLP baselines: causality (outputs and gradients), the flattened prefix against its
padded form, per-position isolation, the authors' LSTM, capacity matching (train.py --match_params)."""
import pytest
import torch
import torch.nn as nn

import tasks
import presets
import settings
import train
from conftest import loss_before_after
from lstm import LSTM, LSTMConfig
from mlp import MLP, MLPConfig

IO = dict(vocab_size=12, n_classes=5, answer_offset=7, block_size=16)


def tiny(kind, **kw):
    torch.manual_seed(0)
    if kind == "lstm":
        return LSTM(LSTMConfig(**(IO | dict(n_layer=2, d_model=16) | kw))).double()
    return MLP(MLPConfig(**(IO | dict(n_layer=2, d_model=16, d_flat=4) | kw))).double()


VARIANTS = [("lstm", {}), ("lstm", dict(pos="none", residual=True)), ("mlp", {}), ("mlp", dict(per_position=True))]


@pytest.mark.parametrize("kind, kw", VARIANTS)
def test_causal_under_future_perturbation(kind, kw):
    model = tiny(kind, **kw)
    x = torch.randint(12, (3, 16))
    out = model(x)
    assert out.shape == (3, 16, 5)
    for t in (0, 5, 14):
        x2 = x.clone()
        x2[:, t + 1:] = torch.randint(12, (3, 15 - t))
        assert torch.allclose(model(x2)[:, :t + 1], out[:, :t + 1], atol=1e-12)


@pytest.mark.parametrize("kind, kw", VARIANTS)
def test_gradients_do_not_flow_from_the_future(kind, kw):
    model = tiny(kind, vocab_size=0, n_features=4, gaussian=True, answer_offset=None, **kw)
    x = torch.randn(2, 10, 4, dtype=torch.float64, requires_grad=True)
    out = model(x)
    assert out.shape == (2, 10, 2)
    for t in (0, 4, 8):
        (g,) = torch.autograd.grad(out[:, t].sum(), x, retain_graph=True)
        assert g[:, t + 1:].abs().max() == 0 and g[:, t].abs().max() > 0
        if t > 0:  # the per-position MLP sees only its own input; the others see the whole prefix
            assert (g[:, :t].abs().max() == 0) == kw.get("per_position", False)


def test_per_position_mlp_sees_only_its_own_token_and_position():
    model = tiny("mlp", per_position=True)
    x = torch.randint(12, (4, 16))
    out = model(x)
    for t in range(16):
        x2 = torch.randint(12, (4, 16))
        x2[:, t] = x[:, t]
        assert torch.allclose(model(x2)[:, t], out[:, t], atol=1e-12)
    # while the default MLP does see the earlier tokens
    full = tiny("mlp")
    x2 = x.clone()
    x2[:, 0] = (x[:, 0] + 1) % 12
    assert not torch.allclose(full(x2)[:, 5], full(x)[:, 5])


def test_flattened_prefix_equals_the_zero_padded_flat_input():
    model = tiny("mlp")
    B, T, f, block = 3, 11, 4, 16
    x = torch.randint(12, (B, T))
    _, inside = model(x, return_internals=True)
    with torch.no_grad():
        e = model.wte_flat(x)  # (B, T, f)
        flat = torch.zeros(B, T, block * f, dtype=torch.float64)  # position t: [e_0 .. e_t, 0 .. 0]
        for t in range(T):
            flat[:, t, :(t + 1) * f] = e[:, :t + 1].reshape(B, -1)
        h = flat @ model.w_flat.reshape(block * f, -1) + model.wte(x) + model.wpe(torch.arange(T))
    assert torch.allclose(inside["layers"][0]["x"], h, atol=1e-12)


def test_lstm_stack_is_a_multilayer_nn_lstm():
    model = tiny("lstm", n_layer=3)
    ref = nn.LSTM(16, 16, num_layers=3, batch_first=True).double()
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(ref, f"{name}_l{i}").copy_(getattr(layer, f"{name}_l0"))
    x = torch.randint(12, (2, 16))
    out, inside = model(x, return_internals=True)
    y, _ = ref(inside["layers"][0]["x"])
    assert torch.allclose(out, model.ln_f(y) @ model.wte.weight[7:12].T, atol=1e-12)
    assert len(inside["layers"]) == 3 and inside["final"].shape == (2, 16, 16)


@pytest.mark.parametrize("kind", ["lstm", "mlp"])
def test_skipping_every_layer_leaves_embeddings_norm_and_head(kind):
    model = tiny(kind, per_position=True) if kind == "mlp" else tiny(kind)
    x = torch.randint(12, (2, 16))
    h = model.wte(x) + model.wpe(torch.arange(16))
    expect = model.ln_f(h) @ model.wte.weight[7:12].T
    assert torch.allclose(model(x, skip_layers=range(2)), expect, atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "mlp"])
def test_bf16_autocast_runs_and_keeps_the_lstm_recurrence_in_float32(kind):
    torch.manual_seed(0)
    Config, Model = (LSTMConfig, LSTM) if kind == "lstm" else (MLPConfig, MLP)
    model = Model(Config(**(IO | dict(n_layer=2, d_model=16))))
    x = torch.randint(12, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, inside = model(x, return_internals=True)
    assert torch.allclose(out.float(), model(x), atol=0.05)
    if kind == "lstm":
        assert inside["layers"][1]["x"].dtype == torch.float32


def test_the_authors_lstm_sizes():
    """The authors' LSTMs: bijection d 192 x 6 with positions, tied (1.79-1.80M); HMM d 256 x 9 (≈4.77M)."""
    for task, n in (("bijection", 1_793_856), ("hmm", 4_766_981)):
        run = settings.run_of(task, "lstm", "paper", {})
        t = tasks.make_task(task)
        io = dict(vocab_size=t.vocab_size, n_classes=t.n_classes, answer_offset=t.answer_offset, block_size=t.seq_len)
        assert presets.count_params(LSTMConfig, LSTM, io | run.model_opts) == n


def test_bad_configs_and_too_long_sequences():
    for kind in ("lstm", "mlp"):
        with pytest.raises(ValueError, match="block_size"):
            tiny(kind)(torch.randint(12, (1, 17)))
        with pytest.raises(ValueError, match="must be >= 1"):
            tiny(kind, d_model=0)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tiny(kind, answer_offset=10)
    with pytest.raises(ValueError, match="pos must be one of"):
        tiny("lstm", pos="rotary")
    tiny("lstm", pos="none")(torch.randint(12, (1, 40)))  # no position table, no length limit


@pytest.mark.parametrize("model", ["lstm", "mlp"])
def test_a_few_steps_lower_the_loss(model):
    before, after = loss_before_after(model, dict(n_layer=1, d_model=32, lr=1e-2), steps=60)
    assert after < before - 0.1

# -----------------------------------------------------------------------------
# capacity matching


@pytest.mark.parametrize("task", ["bijection", "hmm", "regression", "recall"])
@pytest.mark.parametrize("model", ["lstm", "mlp", "mamba"])
def test_match_params_lands_within_2_percent_of_the_transformer(task, model, capsys):
    ref, _ = train.build(settings.run_of(task, "transformer", "quick", {}), torch.device("cpu"))
    target = ref.num_params()
    for opts in (dict(match_params=-1), dict(match_params=target // 3, n_layer=1)):
        net, _ = train.build(settings.run_of(task, model, "quick", opts), torch.device("cpu"))
        want = opts["match_params"] if opts["match_params"] > 0 else target
        assert abs(net.num_params() / want - 1) <= 0.02
        said = capsys.readouterr().out
        assert f"gives {net.num_params():,} parameters, target {want:,}" in said


def test_match_params_skips_widths_the_model_rejects_and_errors_when_out_of_reach():
    odd, _ = train.build(settings.run_of("bijection", "transformer", "quick", dict(n_head=1, d_model=197)),
                         torch.device("cpu"))
    run = settings.run_of("bijection", "transformer", "quick", dict(match_params=odd.num_params(), n_head=2))
    net, _ = train.build(run, torch.device("cpu"))
    assert run.model_config["d_model"] in (196, 198) and abs(net.num_params() / odd.num_params() - 1) <= 0.02
    with pytest.raises(ValueError, match="the closest d_model=1 gives"):
        settings.run_of("bijection", "mlp", "quick", dict(match_params=10))


@pytest.mark.parametrize("model", ["transformer", "mamba", "lstm", "mlp", "linear_attn"])
def test_a_token_outside_the_vocabulary_is_a_clear_error(model):
    net, _ = train.build(settings.run_of("bijection", model, "quick", dict(V=4, n_layer=1)), torch.device("cpu"))
    x = tasks.make_task("bijection", V=4).sample(2, torch.Generator().manual_seed(0)).x
    for bad in (8, -1):  # vocab_size = 2V = 8
        x[0, 0] = bad
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, 8\)"):
            net(x)
