"""The transformer: causality (outputs and gradients), the explicit-attention path, masks, I/O heads."""
import pytest
import torch

from transformer import Transformer, TransformerConfig


def tiny(**kw):
    c = dict(vocab_size=12, n_classes=5, answer_offset=7, block_size=16, n_layer=2, n_head=2, d_model=16)
    torch.manual_seed(0)
    return Transformer(TransformerConfig(**(c | kw))).double()


@pytest.mark.parametrize("pos,n_pos,window", [("learned", 0, 0), ("rotary", 0, 0), ("alibi", 0, 0), ("none", 0, 0),
                                              ("learned_alibi", 0, 0), ("learned_alibi", 6, 0),
                                              ("learned_alibi", 6, 4), ("learned", 0, 4), ("rotary", 0, 4),
                                              ("alibi", 6, 1), ("none", 6, 40)])
@pytest.mark.parametrize("log_scale", [False, True])
def test_causal_under_future_perturbation(pos, n_pos, window, log_scale):
    model = tiny(pos=pos, n_pos=n_pos, window=window, log_scale=log_scale)
    x = torch.randint(12, (3, 16))
    out = model(x)
    for t in (0, 5, 14):
        x2 = x.clone()
        x2[:, t + 1:] = torch.randint(12, (3, 15 - t))
        assert torch.allclose(model(x2)[:, :t + 1], out[:, :t + 1], atol=1e-12)


def test_gradients_do_not_flow_from_the_future():
    model = tiny(vocab_size=0, n_features=4, gaussian=True, answer_offset=None)
    x = torch.randn(2, 10, 4, dtype=torch.float64, requires_grad=True)
    out = model(x)
    assert out.shape == (2, 10, 2)
    for t in (0, 4, 8):
        (g,) = torch.autograd.grad(out[:, t].sum(), x, retain_graph=True)
        assert g[:, t + 1:].abs().max() == 0 and g[:, :t + 1].abs().max() > 0


def test_explicit_attention_matches_sdpa_and_returns_internals():
    model = tiny()
    x = torch.randint(12, (2, 16))
    out, inside = model(x, return_internals=True)
    assert torch.allclose(out, model(x), atol=1e-12)
    L = inside["layers"][0]
    assert L["q"].shape == (2, 2, 16, 8) and L["att"].shape == (2, 2, 16, 16)
    assert torch.allclose(L["att"].sum(-1), torch.ones(2, 2, 16, dtype=torch.float64))
    assert (L["att"].triu(1) == 0).all()
    assert torch.allclose(model(x, head_mask=torch.ones(2, 2)), out, atol=1e-12)


@pytest.mark.parametrize("pos,n_pos,window", [("alibi", 0, 0), ("learned", 0, 4), ("learned_alibi", 6, 4)])
def test_sdpa_gets_a_4d_bias_and_matches_the_explicit_path(monkeypatch, pos, n_pos, window):
    # cuDNN's attention takes a (B or 1, H, T, T) mask, not the 3-D (H, T, T) bias
    masks, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(*a, attn_mask=None, **kw):
        masks.append(attn_mask)
        return sdpa(*a, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    model = tiny(pos=pos, n_pos=n_pos, window=window)
    x = torch.randint(12, (3, 16))
    fused = model(x)
    assert len(masks) == 2 and all(m.shape == (1, 2, 16, 16) for m in masks)
    torch.testing.assert_close(fused, model(x, return_internals=True)[0], rtol=1e-12, atol=1e-12)


def test_masking_every_head_equals_zeroing_the_attention_output():
    model = tiny()
    x = torch.randint(12, (2, 16))
    mask = torch.ones(2, 2)
    mask[1] = 0
    masked = model(x, head_mask=mask)
    # by hand: layer 1 keeps only its MLP (the attention projection's bias remains)
    with torch.no_grad():
        blk = model.blocks[1]
        h = model.blocks[0](model.wte(x) + model.wpe(torch.arange(16)))
        h = h + blk.attn.c_proj.bias
        h = h + blk.mlp(blk.ln_2(h))
        ref = model.ln_f(h) @ model.wte.weight[7:12].T
    assert torch.allclose(masked, ref, atol=1e-12)
    skipped = model(x, skip_layers={1})
    h0 = model.ln_f(model.blocks[0](model.wte(x) + model.wpe(torch.arange(16))))
    assert torch.allclose(skipped, h0 @ model.wte.weight[7:12].T, atol=1e-12)


def test_tied_head_reads_the_answer_token_embeddings():
    model = tiny()
    assert model.head is None
    untied = tiny(tie_head=False)
    assert untied.head.weight.shape == (5, 16)
    assert untied.num_params() == model.num_params() + 5 * 16 + 5


def test_bad_configs_and_too_long_sequences():
    with pytest.raises(ValueError, match="block_size"):
        tiny()(torch.randint(12, (1, 17)))
    with pytest.raises(ValueError, match="n_head"):
        tiny(d_model=15)
    with pytest.raises(ValueError, match="pos must be one of"):
        tiny(pos="sinusoidal")
    with pytest.raises(ValueError, match="window must be >= 0"):
        tiny(window=-1)
    tiny(pos="rotary")(torch.randint(12, (1, 40)))  # rotary has no fixed table


def test_positions_from_n_pos_on_share_the_last_learned_row():
    model = tiny(pos="learned_alibi", n_pos=6)
    assert model.wpe.num_embeddings == 6
    x = torch.randint(12, (2, 40))  # longer than block_size: the table never runs out
    out = model(x)
    with torch.no_grad():
        model.wpe.weight[5] += 1.0  # the shared row moves every position from 5 on, and no earlier one
    moved = (model(x) - out).abs().amax((0, 2))
    assert moved[:5].max() == 0 and moved[5:].min() > 0


def attention_by_hand(model, inside, seen, dist):
    """Layer 0's attention (2 heads of 8, 16 positions) from its unscaled q and k: q.k / sqrt(8), times
    s_h log n (n the keys seen) under log_scale, minus m_h * dist under ALiBi, softmax over the keys seen."""
    attn = model.blocks[0].attn
    h = model.blocks[0].ln_1(inside["layers"][0]["x"])
    q, k, _ = [t.view(2, 16, 2, 8).transpose(1, 2) for t in attn.c_attn(h).split(16, 2)]
    logits = (q @ k.transpose(-2, -1)) / 8 ** 0.5
    if attn.log_scale is not None:
        logits = logits * (attn.log_scale[:, None, None] * seen.sum(-1).double().log()[:, None])
    if model.config.pos.endswith("alibi"):
        logits = logits - (2.0 ** (-8.0 * torch.arange(1, 3) / 2))[:, None, None] * dist
    return logits.masked_fill(~seen, float("-inf")).softmax(-1)


@pytest.mark.parametrize("pos", ["learned", "learned_alibi"])
def test_log_scale_multiplies_each_heads_logits_by_s_log_n(pos):
    model = tiny(pos=pos, log_scale=True)
    with torch.no_grad():
        for b in model.blocks:
            b.attn.log_scale.copy_(torch.tensor([0.3, 0.7]))
    x = torch.randint(12, (2, 16))
    out, inside = model(x, return_internals=True)
    assert torch.allclose(out, model(x), atol=1e-12)  # the explicit path agrees with the fused one
    dist = (torch.arange(16)[:, None] - torch.arange(16)[None, :]).double()
    att = attention_by_hand(model, inside, dist >= 0, dist)
    assert torch.allclose(inside["layers"][0]["att"], att, atol=1e-12)
    (g,) = torch.autograd.grad(out.sum(), model.blocks[0].attn.log_scale)  # s_h is trained
    assert g.abs().min() > 0


@pytest.mark.parametrize("pos,log_scale", [("learned_alibi", False), ("none", True)])
def test_window_attention_by_hand(pos, log_scale):
    """Query i sees key j <= i when j is in the header (j < n_pos - 1, no distance penalty) or i - j < window."""
    model = tiny(pos=pos, n_pos=6, window=4, log_scale=log_scale)
    x = torch.randint(12, (2, 16))
    out, inside = model(x, return_internals=True)
    assert torch.allclose(out, model(x), atol=1e-12)  # the explicit path agrees with the fused one
    seen = torch.zeros(16, 16, dtype=torch.bool)
    dist = torch.zeros(16, 16, dtype=torch.float64)
    for i in range(16):
        for j in range(i + 1):
            seen[i, j] = j < 5 or i - j < 4
            dist[i, j] = 0 if j < 5 else i - j
    assert torch.allclose(inside["layers"][0]["att"], attention_by_hand(model, inside, seen, dist), atol=1e-12)


def test_window_makes_a_long_sequence_read_like_a_short_one():
    """With a window, shared position rows and ALiBi, a query's output depends on the header and the last
    n_layer * (window - 1) positions only, wherever it stands."""
    model = tiny(pos="learned_alibi", n_pos=6, window=4)
    x = torch.randint(12, (2, 40))  # 5 header positions, then 35
    reach = 2 * (4 - 1)
    short = torch.cat([x[:, :5], x[:, -reach - 1:]], 1)  # 12 positions: inside block_size
    assert torch.allclose(model(x)[:, -1], model(short)[:, -1], atol=1e-12)
    x2 = x.clone()
    x2[:, 5:-reach - 1] = torch.randint(12, (2, 40 - reach - 6))  # everything outside that reach
    assert torch.allclose(model(x2)[:, -1], model(x)[:, -1], atol=1e-12)
    x2[:, -reach - 1] = (x[:, -reach - 1] + 1) % 12  # the farthest position inside it
    assert not torch.allclose(model(x2)[:, -1], model(x)[:, -1])


def test_a_layer_is_its_heads_and_its_mlp():
    """Without biases, masking every head of a layer and skipping its MLP is skipping the layer; each alone is not."""
    model = tiny(bias=False)
    x = torch.randint(0, 12, (3, 10))
    mask = torch.ones(2, 2, dtype=torch.float64)
    mask[1] = 0
    skipped = model(x, skip_layers={1})
    assert torch.allclose(model(x, head_mask=mask, skip_mlps={1}), skipped, atol=1e-12)
    assert not torch.allclose(model(x, skip_mlps={1}), skipped)
    assert not torch.allclose(model(x, head_mask=mask), skipped)
    h = model(x, return_internals=True)[1]["layers"][1]["x"]  # the stream into block 1: its MLP skipped, by hand
    h = h + model.blocks[1].attn(model.blocks[1].ln_1(h))
    assert torch.allclose(model(x, skip_mlps={1}), model.ln_f(h) @ model.wte.weight[7:12].T, atol=1e-12)
