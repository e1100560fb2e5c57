"""code/table1.py, the measuring tools of §4: small cases worked out by hand."""

import math

import pytest
import torch

import table1


@pytest.mark.parametrize(
    ("layer_type", "n", "options", "expected"),
    [
        ("self-attention", 8, {}, 1),  # every position reads every position
        ("recurrent", 8, {}, 7),  # x_0 reaches h_7 after 7 further steps
        ("convolutional", 8, {"k": 3}, 7),  # +-1 position per layer
        ("convolutional", 8, {"k": 5}, 4),  # +-2 per layer: ceil(7 / 2)
        ("dilated convolutional", 8, {"k": 2}, 3),  # sees 2, 4, 8 positions back
        ("dilated convolutional", 9, {"k": 3}, 2),  # sees 3, then 9 positions back
        ("dilated convolutional", 10, {"k": 3}, 3),
        ("restricted self-attention", 8, {"r": 3}, 7),
        ("restricted self-attention", 8, {"r": 5}, 4),
        ("self-attention", 1, {}, 0),
    ],
)
def test_max_path_length_small_cases(layer_type, n, options, expected):
    assert table1.max_path_length(layer_type, n, **options) == expected


def test_path_lengths_grow_as_table_1_says():
    for n in (16, 64, 256):
        assert table1.max_path_length("recurrent", n) == n - 1
        assert table1.max_path_length("convolutional", n, k=3) == n - 1
        assert table1.max_path_length("dilated convolutional", n, k=3) == math.ceil(
            math.log(n, 3) - 1e-9
        )
        assert table1.max_path_length("restricted self-attention", n, r=9) == math.ceil((n - 1) / 4)


@pytest.mark.parametrize(
    ("layer_type", "module", "n", "d"),
    [
        ("self-attention", table1.SelfAttentionLayer(), 4, 3),  # 4 * 16 * 3 = 192
        ("recurrent", table1.RecurrentLayer(3), 5, 3),  # 4 * 5 * 9 = 180
        ("convolutional", table1.ConvolutionalLayer(2, 3), 6, 2),  # 2 * 3 * 6 * 4 = 144
        ("restricted self-attention", table1.RestrictedSelfAttentionLayer(3), 6, 4),  # 4*3*6*4
    ],
)
def test_flop_counter_agrees_with_the_analytic_count(layer_type, module, n, d):
    by_hand = {"self-attention": 192, "recurrent": 180, "convolutional": 144}
    expected = by_hand.get(layer_type, 288)
    assert table1.analytic_flops(layer_type, n, d) == expected
    assert table1.count_flops(module, torch.randn(1, n, d)) == expected


def test_fitted_exponent_recovers_a_power_law():
    sizes = [8, 16, 32, 64]
    assert table1.fitted_exponent(sizes, [3 * s**2 for s in sizes]) == pytest.approx(2.0)
    assert table1.fitted_exponent(sizes, [5 * s for s in sizes]) == pytest.approx(1.0)


def test_restricted_attention_equals_masked_full_attention():
    x = torch.randn(2, 7, 4)
    near = (torch.arange(7)[:, None] - torch.arange(7)[None]).abs() <= 2
    scores = (x @ x.transpose(-2, -1) / 2).masked_fill(~near, float("-inf"))
    expected = scores.softmax(-1) @ x
    torch.testing.assert_close(table1.RestrictedSelfAttentionLayer(5)(x), expected)
    with pytest.raises(ValueError, match="r must be a positive odd number"):
        table1.RestrictedSelfAttentionLayer(4)


def test_sequential_depth_grows_with_n_only_for_the_recurrent_layer():
    def depth(module, n):
        x = torch.randn(1, n, 4, requires_grad=True)
        return table1.graph_depth(module(x).sum())

    recurrent = table1.RecurrentLayer(4)
    assert depth(recurrent, 16) - depth(recurrent, 8) == 2 * (
        depth(recurrent, 8) - depth(recurrent, 4)
    )
    assert depth(recurrent, 16) > depth(recurrent, 8)
    for module in (table1.SelfAttentionLayer(), table1.ConvolutionalLayer(4, 3)):
        assert depth(module, 4) == depth(module, 16)


def test_largest_intermediate_is_the_score_matrix_for_attention():
    n, d = 100, 8
    assert table1.largest_intermediate_bytes(table1.SelfAttentionLayer(), torch.randn(1, n, d)) == (
        n * n * 4
    )
    # the recurrent layer's largest tensor is its stacked output, n x d
    assert table1.largest_intermediate_bytes(table1.RecurrentLayer(d), torch.randn(1, n, d)) == (
        n * d * 4
    )
