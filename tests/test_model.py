"""The model of §3: each behaviour the chapters claim, pinned down so that it fails
without the behaviour."""

import math

import pytest
import torch
import torch.nn.functional as F

import annotated_transformer as at

PAD = 0


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def tiny_model(**options):
    options = {"N": 2, "d_model": 32, "d_ff": 64, "h": 4, "dropout": 0.1} | options
    return at.make_model(13, 13, **options).eval()


def toy_batch():
    src = torch.randint(1, 13, (3, 7))
    src[1, 5:] = PAD  # a padded sentence
    tgt = torch.randint(1, 13, (3, 6))
    tgt[2, 4:] = PAD
    return src, tgt, at.padding_mask(src, PAD), at.target_mask(tgt, PAD)


# ---- masks ----------------------------------------------------------------------------


def test_subsequent_mask_is_boolean_lower_triangular():
    mask = at.subsequent_mask(4)
    assert mask.shape == (1, 4, 4) and mask.dtype == torch.bool
    # position i may attend to position j exactly when j <= i
    assert mask[0].tolist() == [[j <= i for j in range(4)] for i in range(4)]


def test_target_mask_combines_padding_and_future():
    tgt = torch.tensor([[5, 6, PAD]])
    expected = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 1, 0]]], dtype=torch.bool)
    assert torch.equal(at.target_mask(tgt, PAD), expected)


# ---- fused and reference attention agree ---------------------------------------------


@pytest.mark.parametrize("masking", ["none", "padding", "causal"])
def test_fused_kernel_agrees_with_reference_attention(masking):
    query, key, value = (torch.randn(2, 4, 6, 16) for _ in range(3))
    mask = {
        "none": None,
        "padding": torch.tensor([1, 1, 1, 1, 0, 0]).bool().view(1, 1, 1, 6),
        "causal": at.subsequent_mask(6).unsqueeze(1),
    }[masking]
    reference, weights = at.attention(query, key, value, mask=mask)
    fused = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    torch.testing.assert_close(fused, reference, atol=1e-5, rtol=0)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 6))


@pytest.mark.parametrize("mask_kind", ["padding", "causal"])
def test_fused_and_reference_multi_head_attention_agree(mask_kind):
    fused = at.MultiHeadedAttention(4, 32, fused=True).eval()
    reference = at.MultiHeadedAttention(4, 32, fused=False).eval()
    reference.load_state_dict(fused.state_dict())
    x = torch.randn(2, 6, 32)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, PAD, PAD, PAD]])
    mask = at.padding_mask(tokens, PAD) if mask_kind == "padding" else at.target_mask(tokens, PAD)
    torch.testing.assert_close(fused(x, x, x, mask), reference(x, x, x, mask), atol=1e-5, rtol=0)
    assert reference.weights.shape == (2, 4, 6, 6) and fused.weights is None


def test_fused_and_reference_whole_model_agree():
    model = tiny_model()
    src, tgt, src_mask, tgt_mask = toy_batch()
    with torch.no_grad():
        fused = model(src, tgt, src_mask, tgt_mask)
        with at.use_fused_attention(model, False):
            reference = model(src, tgt, src_mask, tgt_mask)
    torch.testing.assert_close(fused, reference, atol=1e-5, rtol=0)


def test_use_fused_attention_gives_each_layer_its_own_path_back_even_after_an_error():
    model = tiny_model()
    layers = [m for m in model.modules() if isinstance(m, at.MultiHeadedAttention)]
    layers[0].fused = False  # one layer on the reference path, the others fused
    with pytest.raises(RuntimeError), at.use_fused_attention(model, True) as same:
        assert same is model and all(layer.fused for layer in layers)
        raise RuntimeError("inside the block")
    assert [layer.fused for layer in layers] == [False] + [True] * (len(layers) - 1)


# ---- causality and padding ------------------------------------------------------------


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("j", [1, 3, 5])
def test_decoder_cannot_see_the_future(fused, j):
    model = tiny_model(fused=fused)
    src, tgt, src_mask, _ = toy_batch()
    tgt = torch.randint(1, 13, (3, 6))
    changed = tgt.clone()
    changed[:, j] = (tgt[:, j] % 12) + 1  # a different real token at position j
    with torch.no_grad():
        before = model(src, tgt, src_mask, at.target_mask(tgt, PAD))
        after = model(src, changed, src_mask, at.target_mask(changed, PAD))
    assert torch.equal(before[:, :j], after[:, :j])
    assert not torch.allclose(before[:, j:], after[:, j:])


@pytest.mark.parametrize("fused", [True, False])
def test_padded_source_tokens_change_nothing(fused):
    model = tiny_model(fused=fused)
    src, tgt, src_mask, tgt_mask = toy_batch()
    changed = src.clone()
    changed[1, 5:] = torch.tensor([7, 9])  # overwrite the padding of sentence 1, keep its mask
    with torch.no_grad():
        before = model(src, tgt, src_mask, tgt_mask)
        after = model(changed, tgt, src_mask, tgt_mask)
    torch.testing.assert_close(before, after, atol=1e-6, rtol=0)
    # and without the mask the same change does leak into the output
    with torch.no_grad():
        unmasked = model(changed, tgt, torch.ones_like(src_mask), tgt_mask)
    assert not torch.allclose(before[1], unmasked[1], atol=1e-4)


# ---- positional encoding --------------------------------------------------------------


def test_positional_encoding_equals_the_formula():
    table = at.positional_encoding(60, 16)
    assert table.shape == (60, 16) and table.dtype == torch.float32
    for pos in (0, 1, 7, 59):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("k", [1, 5, 40])
def test_positional_encoding_shift_is_a_rotation(k):
    d_model = 64
    table = at.positional_encoding(200, d_model).double()
    omega = 1 / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    rotation = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, w in enumerate(omega):  # a matrix that depends on k only, not on pos
        c, s = math.cos(k * w), math.sin(k * w)
        block = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
        rotation[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = block
    shifted = table[: 200 - k] @ rotation.T
    torch.testing.assert_close(shifted, table[k:], atol=1e-5, rtol=0)


def test_dot_product_of_encodings_depends_only_on_the_offset():
    # §3.5 as chapter 3.5 states it: PE(pos) . PE(pos + k) = sum_i cos(omega_i k), any pos
    d_model = 32
    table = at.positional_encoding(300, d_model).double()
    omega = 1 / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    for k in (0, 3, 25):
        expected = torch.cos(omega * k).sum().item()
        for pos in (0, 17, 250):
            assert (table[pos] @ table[pos + k]).item() == pytest.approx(expected, abs=1e-5)


def test_sequence_longer_than_the_table_is_refused():
    model = tiny_model(max_len=10)
    src = torch.randint(1, 13, (1, 11))
    with pytest.raises(ValueError, match="max_len=10"):
        model.encode(src, at.padding_mask(src, PAD))


# ---- parameters and weight sharing ----------------------------------------------------


def test_base_model_has_the_parameters_of_the_papers_formula():
    # per layer, by hand: 4 d^2 per attention (W^Q, W^K, W^V, W^O, no biases), 2 d d_ff +
    # d_ff + d for Eq. (2), 2 d per LayerNorm; one shared V x d matrix for both embeddings
    # and the pre-softmax projection (§3.4)
    d, d_ff, V, N = 512, 2048, 37000, 6
    ffn = 2 * d * d_ff + d_ff + d
    encoder_layer = 4 * d * d + ffn + 2 * 2 * d
    decoder_layer = 2 * 4 * d * d + ffn + 3 * 2 * d
    expected = N * (encoder_layer + decoder_layer) + V * d
    model = at.make_model(V, V, share_embeddings=True)
    assert at.count_parameters(model) == expected == 63_045_632
    assert abs(expected - 65e6) / 65e6 < 0.05  # Table 3 rounds the base model to 65M
    embedding = model.src_embed[0].embedding.weight
    assert model.tgt_embed[0].embedding.weight is embedding
    assert model.generator.projection.weight is embedding


def test_unshared_model_has_three_matrices():
    shared = at.count_parameters(
        at.make_model(1000, 1000, N=1, d_model=64, d_ff=128, share_embeddings=True)
    )
    separate = at.count_parameters(at.make_model(1000, 1000, N=1, d_model=64, d_ff=128))
    assert separate - shared == 2 * 1000 * 64


# ---- post-LN ---------------------------------------------------------------------------


def layer_norm(x, norm):
    """LayerNorm from its formula (Ba et al., 2016), in float64: (x - mean) / sqrt(var + eps),
    scaled and shifted by the norm's weight and bias."""
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()


def _sublayer_calls(model):
    """Record (input, sub-layer output, block output) for every residual block that runs."""
    calls = []

    def hook(block, args, output):
        x, sublayer = args
        inner = layer_norm(x, block.norm).float() if block.pre_norm else x
        calls.append((block, x, sublayer(inner), output))

    for block in model.modules():
        if isinstance(block, at.SublayerConnection):
            block.register_forward_hook(hook)
    return calls


def test_post_ln_by_default_every_block_is_layernorm_of_the_sum():
    model = tiny_model()
    calls = _sublayer_calls(model)
    with torch.no_grad():
        model(*toy_batch())
    assert len(calls) == 2 * 2 + 2 * 3  # N=2 encoder layers x 2 blocks + N=2 decoder layers x 3
    for block, x, sub, output in calls:
        assert not block.pre_norm
        torch.testing.assert_close(
            output.double(), layer_norm(x + sub, block.norm), atol=1e-5, rtol=0
        )
    assert isinstance(model.encoder.norm, torch.nn.Identity)
    assert isinstance(model.decoder.norm, torch.nn.Identity)


def test_every_layer_output_is_normalised_under_post_ln():
    model = tiny_model()
    outputs = []
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        layer.register_forward_hook(lambda module, args, out: outputs.append(out))
    with torch.no_grad():
        model(*toy_batch())
    for out in outputs:
        torch.testing.assert_close(out.mean(-1), torch.zeros(out.shape[:-1]), atol=1e-5, rtol=0)


def test_pre_ln_is_an_option_with_a_final_norm():
    model = tiny_model(pre_norm=True)
    calls = _sublayer_calls(model)
    with torch.no_grad():
        model(*toy_batch())
    for block, x, sub, output in calls:
        assert block.pre_norm  # sub: the sub-layer of the formula's LayerNorm(x)
        torch.testing.assert_close(output, x + sub, atol=1e-5, rtol=0)
    assert isinstance(model.encoder.norm, torch.nn.LayerNorm)
    assert isinstance(model.decoder.norm, torch.nn.LayerNorm)


# ---- validation and edge cases ---------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"d_model": 30, "h": 4}, "d_model=30 is not divisible by h=4"),
        ({"N": 0}, "N must be a positive integer"),
        ({"d_ff": -1}, "d_ff must be a positive integer"),
        ({"h": 0}, "h must be a positive integer"),
        ({"dropout": 1.5}, "dropout must be a probability"),
        ({"max_len": 0}, "max_len must be a positive integer"),
        ({"d_k": 0}, r"d_k must be a positive integer or None \(d_model / h\), got 0"),
        ({"d_v": 2.0}, "d_v must be a positive integer or None"),
        ({"dropout": "0.1"}, "dropout must be a probability in \\[0, 1\\), got '0.1'"),
        ({"relu_dropout": True}, "relu_dropout must be a probability"),  # True is no rate
        ({"positions": "rope"}, "positions must be 'sinusoidal' .* got 'rope'"),
        ({"d_model": 15, "h": 5}, "d_model=15 must be even for the sinusoids"),
    ],
)
def test_bad_sizes_raise_value_error_naming_the_argument(options, named):
    with pytest.raises(ValueError, match=named):
        at.make_model(13, 13, **options)


def test_model_and_train_configs_check_their_fields_alike():
    """Both refuse a bad field with the same words, from their own rules (check_rules)."""
    import checks

    for config, field, value in ((at.ModelConfig, "N", 0), (at.TrainConfig, "max_steps", 0)):
        with pytest.raises(checks.InputError) as refused:
            config(**{field: value})
        assert str(refused.value) == f"{field} must be a positive integer, got 0"
    assert at.InputError is checks.InputError  # the one error every layer raises


def test_bad_vocabularies_raise_value_error():
    with pytest.raises(ValueError, match="src_vocab=100 != tgt_vocab=120"):
        at.make_model(100, 120, N=1, share_embeddings=True)
    with pytest.raises(ValueError, match="tgt_vocab must be a positive integer"):
        at.make_model(100, 0, N=1)
    # True is an int to Python; refused here rather than deep inside torch's embedding
    with pytest.raises(ValueError, match="src_vocab must be a positive integer, got True"):
        at.build_model(True, True, at.SMALL)


def test_explicit_d_k_and_d_v_size_the_projections():
    attention = at.MultiHeadedAttention(7, 512, d_k=64, d_v=32)
    assert attention.w_q.out_features == attention.w_k.out_features == 7 * 64
    assert attention.w_v.out_features == attention.w_o.in_features == 7 * 32
    x = torch.randn(2, 3, 512)
    assert attention(x, x, x).shape == (2, 3, 512)


@pytest.mark.parametrize("fused", [True, False])
def test_a_float_mask_is_refused_on_both_attention_paths(fused):
    model = at.make_model(20, 20, N=1, d_model=16, d_ff=32, h=2, fused=fused).eval()
    src = torch.randint(4, 20, (2, 5))
    mask = at.padding_mask(src, at.PAD_ID)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        model.encode(src, mask.float())
    model.encode(src, mask)  # the bool mask works


@pytest.mark.parametrize("fused", [True, False])
def test_a_query_that_sees_nothing_outputs_zeros_on_both_paths(fused, monkeypatch):
    fused_kernel = F.scaled_dot_product_attention

    def nan_where_nothing_is_seen(query, key, value, attn_mask=None, **options):
        """Some backends of the fused kernel return NaN (0/0) for a query that may attend to
        nothing, as softmax over -inf alone would; this CPU one returns zeros. Act as they do."""
        out = fused_kernel(query, key, value, attn_mask=attn_mask, **options)
        return out.masked_fill(~attn_mask.any(-1, keepdim=True), float("nan"))

    monkeypatch.setattr(at.F, "scaled_dot_product_attention", nan_where_nothing_is_seen)
    attention = at.MultiHeadedAttention(4, 32, fused=fused).eval()
    x = torch.randn(2, 3, 32)
    mask = torch.ones(2, 3, 3, dtype=torch.bool)
    mask[1, 2] = False  # query 2 of sentence 1 may attend to nothing
    with torch.no_grad():
        out = attention(x, x, x, mask=mask)
    assert torch.equal(out[1, 2], torch.zeros(32))  # W^O has no bias: zeros stay zeros
    assert (out[0].abs().sum(-1) > 0).all() and (out[1, :2].abs().sum(-1) > 0).all()


@pytest.mark.parametrize("fused", [True, False])
def test_empty_source_gives_finite_outputs(fused):
    model = tiny_model(fused=fused)
    tgt = torch.tensor([[1, 4, 5]])
    for src in (torch.zeros(1, 0, dtype=torch.long), torch.full((1, 4), PAD)):
        with torch.no_grad():
            out = model.generator(
                model(src, tgt, at.padding_mask(src, PAD), at.target_mask(tgt, PAD))
            )
        assert out.shape == (1, 3, 13) and torch.isfinite(out).all()


def test_fully_masked_row_gives_zero_weights_not_nan():
    scores_mask = torch.tensor([[True, True], [False, False]]).unsqueeze(0)
    output, weights = at.attention(
        torch.randn(1, 2, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 4), mask=scores_mask
    )
    assert torch.equal(weights[0, 1], torch.zeros(2)) and torch.equal(output[0, 1], torch.zeros(4))


def test_half_precision_masking_neither_overflows_nor_gives_nan():
    query, key, value = (torch.randn(1, 2, 5, 8, dtype=torch.float16) * 30 for _ in range(3))
    mask = at.subsequent_mask(5).unsqueeze(1)
    output, weights = at.attention(query, key, value, mask=mask)
    assert torch.isfinite(output).all() and torch.isfinite(weights).all()
    assert (weights.float().sum(-1) - 1).abs().max() < 1e-2


# ---- feed-forward network, embeddings and generator -------------------------------------


def test_feed_forward_is_equation_2_at_every_position():
    ffn = at.PositionwiseFeedForward(d_model=8, d_ff=32).eval()
    x = torch.randn(2, 5, 8)
    expected = torch.relu(x @ ffn.w_1.weight.T + ffn.w_1.bias) @ ffn.w_2.weight.T + ffn.w_2.bias
    torch.testing.assert_close(ffn(x), expected)
    changed = x.clone()
    changed[:, 2] += 1.0
    moved = (ffn(changed) - ffn(x)).abs().amax(dim=(0, 2))
    assert moved.nonzero().flatten().tolist() == [2]  # positions never mix


def test_embeddings_are_scaled_and_generator_gives_log_probabilities():
    embed, generator = at.Embeddings(16, 50), at.Generator(16, 50)
    tokens = torch.tensor([[3, 7, 49]])
    torch.testing.assert_close(embed(tokens), embed.embedding.weight[tokens] * 4.0)  # sqrt(16)
    log_probs = generator(torch.randn(1, 3, 16))
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(1, 3))
    assert generator.projection.bias is None  # so that it can be the embedding matrix


def test_generator_log_probabilities_stay_finite_where_probabilities_underflow():
    # chapter 3.4: log(softmax) of a logit 200 below the largest is log(0) = -inf in float32
    generator = at.Generator(2, 2)
    with torch.no_grad():
        generator.projection.weight.copy_(torch.tensor([[0.0, 0.0], [-200.0, 0.0]]))
    log_probs = generator(torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(log_probs, torch.tensor([[0.0, -200.0]]))


def test_learned_positions_are_table_3_row_e():
    sinusoidal = at.make_model(50, 50, N=1, d_model=16, d_ff=32, h=2, max_len=40)
    learned = at.make_model(50, 50, N=1, d_model=16, d_ff=32, h=2, max_len=40, positions="learned")
    # one trained table for the source and one for the target
    assert at.count_parameters(learned) - at.count_parameters(sinusoidal) == 2 * 40 * 16
    table = learned.src_embed[1].table
    assert 0.6 < table.std().item() < 0.8  # not shrunk by the Xavier initialisation
    x = torch.zeros(1, 5, 16)
    learned.eval()
    torch.testing.assert_close(
        learned.tgt_embed[1](x[:, :1], offset=3), learned.tgt_embed[1](x)[:, 3:4]
    )
    with pytest.raises(ValueError, match="positions must be 'sinusoidal'"):
        at.ModelConfig(positions="rotary")
    with pytest.raises(ValueError, match="longer than the positional table"):
        learned.src_embed[1](torch.zeros(1, 41, 16))


def test_each_module_is_initialised_by_its_own_rule_and_no_two_layers_start_equal():
    torch.manual_seed(0)
    d_model, vocab = 64, 3000
    model = at.make_model(vocab, vocab, N=2, d_model=d_model, d_ff=256, h=4)
    # Xavier-uniform: bound sqrt(6 / (fan_in + fan_out)), so std = bound / sqrt(3)
    w_1 = model.encoder.layers[0].feed_forward.w_1.weight
    xavier_std = (6 / (d_model + 256)) ** 0.5 / 3**0.5
    assert abs(w_1.std().item() / xavier_std - 1) < 0.05
    assert w_1.abs().max().item() <= (6 / (d_model + 256)) ** 0.5
    # embeddings: std d_model^-0.5 (§3.4), not Xavier's sqrt(2 / (vocab + d_model))
    for embedding in (model.src_embed[0].embedding, model.tgt_embed[0].embedding):
        assert abs(embedding.weight.std().item() * d_model**0.5 - 1) < 0.02
    # the deep copies of one layer were each initialised afresh
    first, second = (layer.feed_forward.w_1.weight for layer in model.encoder.layers)
    assert not torch.equal(first, second)
    shared = at.make_model(vocab, vocab, N=1, d_model=d_model, d_ff=256, h=4, share_embeddings=True)
    weight = shared.src_embed[0].embedding.weight
    assert (
        shared.generator.projection.weight is weight
        and shared.tgt_embed[0].embedding.weight is weight
    )
    assert abs(weight.std().item() * d_model**0.5 - 1) < 0.02


# ---- stacks and heads (§3.1, §3.2.2) ---------------------------------------------------


def test_clones_are_independent_deep_copies():
    layers = at.clones(torch.nn.Linear(4, 4), 6)
    assert len(layers) == 6 and len({layer.weight.data_ptr() for layer in layers}) == 6
    with torch.no_grad():
        layers[0].weight.add_(1.0)  # training one copy leaves the others alone
    assert not torch.equal(layers[0].weight, layers[1].weight)


# ---- chapters 3.3 to 3.6: what their pages show in short --------------------------------


@pytest.mark.parametrize("fused", [True, False])
def test_self_attention_and_feed_forward_are_permutation_equivariant(fused):
    # chapter 3.5: without positions, the model cannot tell word order; chapter 3.3: the
    # feed-forward network is applied to each position separately and identically
    self_attn = at.MultiHeadedAttention(4, 32, fused=fused).eval()
    ffn = at.PositionwiseFeedForward(32, 64).eval()
    x, order = torch.randn(2, 6, 32), torch.tensor([3, 0, 5, 1, 4, 2])
    shuffled = x[:, order]
    torch.testing.assert_close(
        self_attn(shuffled, shuffled, shuffled), self_attn(x, x, x)[:, order]
    )
    torch.testing.assert_close(ffn(shuffled), ffn(x)[:, order])


def test_positional_encoding_adds_the_table_in_eval_mode_and_drops_in_training():
    # chapter 3.5, dropout on the sums (§5.4): the table alone in eval mode, inverted dropout
    # (zeros, the rest scaled by 1 / (1 - P_drop)) in training mode
    layer = at.PositionalEncoding(d_model=16, dropout=0.5, max_len=10)
    embeddings = torch.ones(1, 10, 16)
    expected = embeddings + at.positional_encoding(10, 16)
    torch.testing.assert_close(layer.eval()(embeddings), expected, rtol=0, atol=0)
    dropped = layer.train()(embeddings)
    kept = dropped != 0
    assert 0.3 < 1 - kept.float().mean().item() < 0.7
    torch.testing.assert_close(dropped[kept], 2 * expected[kept])


@pytest.mark.parametrize("fused", [True, False])
def test_multi_head_attention_equals_h_separate_heads(fused):
    # Eq. of §3.2.2 taken literally: each head's own W_i^Q, W_i^K, W_i^V sliced from the
    # stacked matrices, attention per head, the outputs concatenated and multiplied by W^O
    layer = at.MultiHeadedAttention(4, 32, fused=fused, d_k=6, d_v=5).eval()
    query, key, value = torch.randn(2, 5, 32), torch.randn(2, 7, 32), torch.randn(2, 7, 32)
    W_Q, W_K, W_V, W_O = (w.weight.T for w in (layer.w_q, layer.w_k, layer.w_v, layer.w_o))
    heads = [
        at.attention(
            query @ W_Q[:, i * 6 : (i + 1) * 6],
            key @ W_K[:, i * 6 : (i + 1) * 6],
            value @ W_V[:, i * 5 : (i + 1) * 5],
        )[0]
        for i in range(4)
    ]
    with torch.no_grad():
        torch.testing.assert_close(
            layer(query, key, value), torch.cat(heads, dim=-1) @ W_O, atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("h", [1, 8, 16, 32])
def test_multi_head_parameters_do_not_depend_on_h(h):
    layer = at.MultiHeadedAttention(h, 512)
    assert layer.d_k == layer.d_v == 512 // h
    assert sum(p.numel() for p in layer.parameters()) == 4 * 512**2
