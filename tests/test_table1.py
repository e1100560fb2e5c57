"""code/table1.py, the measuring tools of §4: small cases worked out by hand."""

import math

import pytest
import torch

import table1


def reads_by_definition(layer_type, n, layer, k=3, r=3):
    """Output i's inputs in one layer, written from the layers' definitions (not from the
    layers themselves): the graphs the path search should find."""

    def inside(offsets, i):
        return {i + o for o in offsets if 0 <= i + o < n}

    if layer_type == "self-attention":
        return [set(range(n)) for _ in range(n)]
    if layer_type == "recurrent":  # h_i reads h_{i-1} and x_i
        return [inside((-1, 0), i) for i in range(n)]
    if layer_type == "dilated convolutional":  # causal, dilation k^layer
        return [inside([-m * k**layer for m in range(k)], i) for i in range(n)]
    width = k if layer_type == "convolutional" else r
    return [inside(range(-(width // 2), width // 2 + 1), i) for i in range(n)]


def brute_force_path_length(reads, n, most_layers):
    """For every pair (input j, output i), the fewest stacked layers through which a path
    from j reaches i, by a breadth-first search from each j over the nodes (layer, position);
    the largest of these over the pairs that are ever connected."""
    fewest = {}
    for j in range(n):
        frontier = {j}
        for layers in range(1, most_layers + 1):
            graph = reads(layers - 1)
            frontier = {i for i in range(n) if graph[i] & frontier}
            for i in frontier:
                fewest.setdefault((j, i), layers if i != j else 0)
    return max(fewest.values(), default=0)


CASES = [
    ("self-attention", 1, {}),
    ("self-attention", 8, {}),
    ("recurrent", 8, {}),
    ("convolutional", 8, {"k": 3}),
    ("convolutional", 9, {"k": 5}),
    ("convolutional", 12, {"k": 7}),
    ("dilated convolutional", 8, {"k": 2}),
    ("dilated convolutional", 9, {"k": 3}),
    ("dilated convolutional", 10, {"k": 3}),
    ("dilated convolutional", 17, {"k": 4}),
    ("restricted self-attention", 8, {"r": 3}),
    ("restricted self-attention", 8, {"r": 5}),
    ("restricted self-attention", 13, {"r": 9}),
]


@pytest.mark.parametrize(("layer_type", "n", "options"), CASES)
def test_the_search_agrees_with_a_brute_force_search_on_the_definitions(layer_type, n, options):
    expected = brute_force_path_length(
        lambda layer: reads_by_definition(layer_type, n, layer, **options), n, most_layers=2 * n
    )
    assert table1.max_path_length(layer_type, n, **options) == expected


@pytest.mark.parametrize(("layer_type", "n", "options"), CASES)
def test_the_graphs_read_off_the_layers_are_their_definitions(layer_type, n, options):
    for layer in range(3):
        graph = table1.layer_graph(layer_type, n, layer, **options)
        expected = reads_by_definition(layer_type, n, layer, **options)
        assert [set(row.nonzero().flatten().tolist()) for row in graph] == expected


def test_the_recurrent_steps_connect_what_the_recurrent_layer_connects():
    n = 7
    steps = table1.layer_graph("recurrent", n).int()
    closure = torch.eye(n, dtype=torch.int)
    for _ in range(n - 1):
        closure = ((steps @ closure) > 0).int()
    layer = table1.connections(table1.RecurrentLayer(2), n)
    assert torch.equal(closure.bool(), layer)
    assert torch.equal(layer, torch.ones(n, n, dtype=torch.bool).tril())  # the past, all of it


def test_the_search_runs_on_the_graph_it_is_given(monkeypatch):
    """Self-attention's path length comes out of the search, not the layer's name: given a
    banded graph instead of self-attention's, the search finds the band's path."""
    offset = torch.arange(8)[:, None] - torch.arange(8)[None, :]
    monkeypatch.setattr(table1, "layer_graph", lambda *args, **kwargs: offset.abs() <= 1)
    assert table1.max_path_length("self-attention", 8) == 7


def test_the_search_agrees_with_brute_force_on_random_graphs():
    generator = torch.Generator().manual_seed(0)
    for trial in range(20):
        n = 3 + trial % 6
        graph = (torch.rand(n, n, generator=generator) < 0.25) | torch.eye(n, dtype=torch.bool)
        reads = [set(row.nonzero().flatten().tolist()) for row in graph]
        expected = brute_force_path_length(lambda layer, reads=reads: reads, n, most_layers=2 * n)
        assert table1.stacked_path_length(lambda layer, graph=graph: graph, n) == expected


def test_the_search_refuses_a_position_that_forgets_itself():
    with pytest.raises(ValueError, match="must read itself"):
        table1.stacked_path_length(lambda layer: torch.zeros(3, 3, dtype=torch.bool), 3)


@pytest.mark.parametrize("n", [16, 64, 100])
def test_path_lengths_follow_table_1_in_n_k_and_r(n):
    assert table1.max_path_length("self-attention", n) == 1
    assert table1.max_path_length("recurrent", n) == n - 1
    for width in (3, 5, 9):
        reach = width // 2  # positions each way per centred layer
        assert table1.max_path_length("convolutional", n, k=width) == math.ceil((n - 1) / reach)
        assert table1.max_path_length("restricted self-attention", n, r=width) == math.ceil(
            (n - 1) / reach
        )
        assert table1.max_path_length("dilated convolutional", n, k=width) == next(
            layers
            for layers in range(n)
            if width**layers >= n  # ceil(log_k n)
        )


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


@pytest.mark.parametrize("width", [3, 5, 9])
def test_flop_counts_grow_with_k_and_r(width):
    n, d = 12, 4
    conv = table1.count_flops(table1.ConvolutionalLayer(d, width), torch.randn(1, n, d))
    assert conv == table1.analytic_flops("convolutional", n, d, k=width) == 2 * width * n * d * d
    restricted = table1.count_flops(
        table1.RestrictedSelfAttentionLayer(width), torch.randn(1, n, d)
    )
    assert restricted == table1.analytic_flops("restricted self-attention", n, d, r=width)
    assert restricted == 4 * width * n * d


def test_convolutions_centred_and_causal():
    with pytest.raises(ValueError, match="odd width"):
        table1.ConvolutionalLayer(2, 4)
    layer = table1.ConvolutionalLayer(1, 3, dilation=2, causal=True)
    x = torch.randn(1, 9, 1)
    w = layer.conv.weight.flatten()  # taps at i - 4, i - 2, i
    padded = torch.cat([torch.zeros(4), x.flatten()])
    expected = torch.stack(
        [padded[i] * w[0] + padded[i + 2] * w[1] + padded[i + 4] * w[2] for i in range(9)]
    )
    torch.testing.assert_close(layer(x).flatten(), expected)


def test_the_recurrent_arithmetic_at_once_matches_the_steps():
    layer, x = table1.RecurrentLayer(4), torch.randn(2, 6, 4)
    states = layer(x)
    previous = torch.cat([torch.zeros(2, 1, 4), states[:, :-1]], dim=1)
    torch.testing.assert_close(layer.at_once(x, previous), states)


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


def test_views_allocate_nothing():
    n, d, r = 100, 8, 5
    assert table1.largest_intermediate_bytes(lambda x: x.transpose(1, 2), torch.randn(1, n, d)) == 0
    # unfold's n x r x d windows are a view: the padded input, (n + r - 1) x d, is the largest
    restricted = table1.RestrictedSelfAttentionLayer(r)
    assert (
        table1.largest_intermediate_bytes(restricted, torch.randn(1, n, d)) == (n + r - 1) * d * 4
    )
    # with more than one sentence the products copy the windows: batch x n x r x d floats
    assert table1.largest_intermediate_bytes(restricted, torch.randn(2, n, d)) == 2 * n * r * d * 4
