"""§6.1 and the fast-decoding page: greedy decoding, beam search with length penalty, the
key/value cache and its fast paths, checkpoint averaging, translate, and scoring."""

import ast
import csv
import itertools
import json
import math
import pathlib
import re

import pytest
import torch

import annotated_transformer as at
import fast_decoding as fd
import run_folder
import training_runs as training
from toy import TINY, quiet, toy_pairs

ROOT = pathlib.Path(__file__).resolve().parent.parent


def small_model(seed=0, **options):
    torch.manual_seed(seed)
    return at.make_model(12, 12, N=2, d_model=32, d_ff=64, h=4, **options).eval()


def sources(seed=0, batch=5, seq=7, vocab=12):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, seq), generator=generator)
    src[1, 4:] = at.PAD_ID  # a shorter sentence
    src[2, :] = at.PAD_ID  # an empty one
    return src, at.padding_mask(src, at.PAD_ID)


@pytest.mark.parametrize(
    "options",
    [{}, {"pre_norm": True}, {"positions": "learned"}, {"fused": False}, {"d_k": 4, "d_v": 6}],
)
def test_each_cached_step_equals_the_full_decoder(options):
    model = small_model(**options)
    src, src_mask = sources()
    tgt = torch.randint(4, 12, (src.size(0), 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cache = fd.KeyValueCache(model, memory, src_mask)
        for t in range(tgt.size(1)):
            step = cache.next_log_probs(tgt[:, : t + 1])
            full = model.decode(
                memory, src_mask, tgt[:, : t + 1], tgt_mask=at.subsequent_mask(t + 1)
            )
            torch.testing.assert_close(step, model.generator(full[:, -1]), atol=1e-5, rtol=1e-5)
    assert cache.length == tgt.size(1)
    assert all(kept.keys.size(2) == tgt.size(1) for kept in cache.self_attn)


def test_the_self_attention_cache_grows_in_place_and_when_full_keeps_what_it_had():
    cache = fd.AttentionCache()
    cache.room = 3  # full after 4 positions, then after 8: two regrowths in 9 steps
    keys, values = torch.randn(3, 4, 9, 8), torch.randn(3, 4, 9, 6)
    buffers = []
    for t in range(9):
        kept = cache.append(keys[:, :, t : t + 1], values[:, :, t : t + 1])
        assert torch.equal(kept[0], keys[:, :, : t + 1])
        assert torch.equal(kept[1], values[:, :, : t + 1])
        buffers.append(cache.keys.data_ptr())
    assert buffers == [buffers[0]] * 4 + [buffers[4]] * 4 + [buffers[8]]
    assert len(set(buffers)) == 3  # one buffer for steps 1-4, one for 5-8, one from step 9


@pytest.mark.parametrize("masked", [False, True])
def test_grouped_queries_read_one_copy_of_the_memory(masked):
    """Beam search's case: 3 hypotheses per sentence, each with one new position, read their
    sentence's one memory as a group and get what each gets with its own copy of it."""
    attention = at.MultiHeadedAttention(4, 32).eval()
    x, memory = torch.randn(6, 1, 32), torch.randn(2, 7, 32)
    tokens = torch.tensor([[5, 5, 5, 5, 5, 5, 5], [5, 5, 5, 5, at.PAD_ID, at.PAD_ID, at.PAD_ID]])
    mask = at.padding_mask(tokens, at.PAD_ID) if masked else None
    repeat = lambda t: None if t is None else t.repeat_interleave(3, dim=0)  # noqa: E731
    with torch.no_grad():
        key = attention.split_heads(attention.w_k(memory), attention.d_k)
        value = attention.split_heads(attention.w_v(memory), attention.d_v)
        grouped = fd.grouped_attention(attention, x, key, value=value, mask=mask)
        copied = attention(x, repeat(memory), repeat(memory), mask=repeat(mask))
    torch.testing.assert_close(grouped, copied, atol=1e-5, rtol=0)


def test_decoding_builds_no_graph_even_outside_no_grad():
    model = small_model()
    src, src_mask = sources()
    graphs = []
    model.generator.register_forward_hook(lambda module, args, out: graphs.append(out.grad_fn))
    for search in (fd.fast_greedy_decode, fd.fast_beam_search):
        for cache in (True, False):
            search(model, src, src_mask, max_len=4, cache=cache)
    assert len(graphs) == 16 and graphs == [None] * 16  # 4 searches of 4 steps


def test_beam_slots_keep_first_extensions_in_place_and_fill_dropped_rows():
    # one sentence, k = 4, six candidates best first: rows 2, 2, 0, 2, 1, 3 extended
    parent = torch.tensor([[2, 2, 0, 2, 1, 3]])
    kept = torch.tensor([[True, True, True, True, False, False]])
    slot = fd.beam_slots(kept, parent, 4)
    # the first extension of row 2 stays in row 2, of row 0 in row 0; the second and third
    # extensions of row 2 take rows 1 and 3, whose hypotheses nothing extends
    assert slot.tolist() == [[2, 1, 0, 3, 4, 4]]
    # fewer than k kept: the rows nothing fills stay empty (slot k for the rest)
    kept = torch.tensor([[True, False, True, False, False, False]])
    assert fd.beam_slots(kept, parent, 4).tolist() == [[2, 4, 0, 4, 4, 4]]


def test_beam_search_copies_only_the_rows_of_second_extensions(monkeypatch):
    model = small_model()
    src, src_mask = sources()
    copies, original = [], fd.AttentionCache.copy_rows

    def recording(self, source, target):
        assert not set(target.tolist()) & set(source.tolist())  # beam_slots: into unextended rows
        copies.append(target.numel())
        return original(self, source, target)

    monkeypatch.setattr(fd.AttentionCache, "copy_rows", recording)
    fd.fast_beam_search(model, src, src_mask, max_len=12, beam_size=4)
    rows = src.size(0) * 4
    assert copies and max(copies) < rows and sum(copies) < rows * len(copies) / 2


def ends_often(model):
    """Make the end symbol likely enough that sentences end at different lengths."""
    with torch.no_grad():
        model.generator.projection.weight[at.EOS_ID] *= 3
    return model


@pytest.mark.parametrize(
    "seed, options", [(1, {}), (5, {"pre_norm": True, "positions": "learned"})]
)
def test_the_cached_and_the_plain_decoder_give_the_same_tokens(seed, options):
    model = small_model(seed, **options)
    src, src_mask = sources(seed)
    searches = [(fd.fast_greedy_decode, {})] + [
        (fd.fast_beam_search, {"beam_size": k}) for k in (2, 4)
    ]
    lengths = []
    for search, settings in searches:
        cached = search(model, src, src_mask, max_len=15, cache=True, **settings)
        plain = search(model, src, src_mask, max_len=15, cache=False, **settings)
        assert torch.equal(cached, plain), (search.__name__, settings)
        lengths += (cached[:, 1:] != at.PAD_ID).sum(-1).tolist()
    assert min(lengths) < 15 and max(lengths) == 15  # sentences end early, and at the limit


def test_output_length_is_at_most_input_length_plus_50():
    model = small_model()
    src, src_mask = sources()
    greedy = fd.fast_greedy_decode(model, src, src_mask, end_symbol=-1)
    beam = fd.fast_beam_search(model, src, src_mask, end_symbol=-1, beam_size=2)
    expected = [7 + 50, 4 + 50, 0 + 50, 7 + 50, 7 + 50]  # real source tokens + 50, by hand
    assert (greedy[:, 1:] != at.PAD_ID).sum(-1).tolist() == expected
    assert (beam[:, 1:] != at.PAD_ID).sum(-1).tolist() == expected
    assert fd.fast_greedy_decode(model, src, src_mask, max_len=3, end_symbol=-1).size(1) == 4


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, s, k: fd.fast_beam_search(m, s, k, beam_size=0), "beam_size must be a positive"),
        (
            lambda m, s, k: fd.fast_beam_search(m, s, k, beam_size=2.0),
            "beam_size must be a positive",
        ),
        (lambda m, s, k: fd.fast_greedy_decode(m, s, k, max_len=0), "max_len must be a positive"),
        (lambda m, s, k: fd.fast_beam_search(m, s, k, max_len=True), "max_len must be a positive"),
    ],
)
def test_decoding_refuses_bad_sizes_naming_them(call, message):
    model = small_model()
    src, src_mask = sources()
    with pytest.raises(ValueError, match=message):
        call(model, src, src_mask)


@pytest.mark.parametrize("seed", range(2))
def test_beam_of_one_without_length_penalty_is_greedy(seed):
    model = ends_often(small_model(seed))
    src, src_mask = sources(seed)
    greedy = fd.fast_greedy_decode(model, src, src_mask, max_len=15)
    beam = fd.fast_beam_search(model, src, src_mask, max_len=15, beam_size=1, alpha=0.0)
    assert torch.equal(beam, greedy)


class TableModel:
    """A made-up model for the plain decoder: the next word's probabilities after each
    prefix come from a table, as in chapter 6.1's example worked by hand. Its 'decoder
    state' at the last position is the whole prefix, so that the generator can look it up."""

    def __init__(self, table, vocab=8):
        self.table, self.vocab = table, vocab

    def encode(self, src, src_mask):
        return torch.zeros(src.size(0), src.size(1), 1)

    def decode(self, memory, src_mask, ys, tgt_mask):
        return ys.unsqueeze(1).expand(-1, ys.size(1), -1)  # every position: the prefix

    def generator(self, prefixes):
        probs = torch.full((prefixes.size(0), self.vocab), 1e-9)
        for row, prefix in enumerate(prefixes.tolist()):
            for token, p in self.table.get(tuple(prefix[1:]), {at.EOS_ID: 1.0}).items():
                probs[row, token] = p
        return probs.log()


def test_beam_search_on_a_made_up_model_gives_the_search_worked_by_hand():
    A, THE, DOG, MAN, EOS = 4, 5, 6, 7, at.EOS_ID
    model = TableModel(
        {
            (): {A: 0.4, THE: 0.3, EOS: 0.3},
            (A,): {DOG: 0.5, MAN: 0.3, EOS: 0.2},
            (THE,): {DOG: 0.9, EOS: 0.1},
        }
    )  # after two words, </s> is certain
    src = torch.tensor([[4, 4]])
    src_mask = at.padding_mask(src, at.PAD_ID)
    search = lambda **options: fd.fast_beam_search(  # noqa: E731
        model, src, src_mask, max_len=3, cache=False, **options
    )[0].tolist()
    BOS = at.BOS_ID
    # greedy: A (0.4), then dog (0.5), then </s>: p = 0.2
    assert search(beam_size=1, alpha=0.0) == [BOS, A, DOG, EOS]
    assert fd.fast_greedy_decode(model, src, src_mask, max_len=3, cache=False)[0].tolist() == [
        BOS,
        A,
        DOG,
        EOS,
    ]
    # a beam of 2 without penalty: "</s>" at once (0.3) beats "The dog </s>" (0.27), and
    # after step 2 no live hypothesis can beat 0.3 any more: the search stops
    assert search(beam_size=2, alpha=0.0) == [BOS, EOS]
    # alpha = 1: log 0.27 / (8/6) = -0.98 ranks above log 0.3 / 1 = -1.20
    assert math.log(0.27) / at.length_penalty(3, 1.0) > math.log(0.3) / at.length_penalty(1, 1.0)
    assert search(beam_size=2, alpha=1.0) == [BOS, THE, DOG, EOS]


def sequence_score(model, src, src_mask, tokens, alpha):
    ys = torch.tensor([[at.BOS_ID, *tokens]])
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        out = model.decode(memory, src_mask, ys[:, :-1], tgt_mask=at.subsequent_mask(len(tokens)))
        log_probs = model.generator(out)[0].gather(-1, ys[0, 1:].unsqueeze(-1)).sum()
    return log_probs.item() / at.length_penalty(len(tokens), alpha)


def test_a_wide_enough_beam_finds_the_best_output_by_exhaustive_search():
    torch.manual_seed(0)
    model = ends_often(at.make_model(6, 6, N=1, d_model=16, d_ff=32, h=2).eval())
    src = torch.tensor([[4, 5, 4]])
    src_mask = at.padding_mask(src, at.PAD_ID)
    limit, alpha = 3, 0.6
    candidates = [
        (*prefix, at.EOS_ID)
        for n in range(limit)
        for prefix in itertools.product([t for t in range(6) if t != at.EOS_ID], repeat=n)
    ] + list(itertools.product(range(6), repeat=limit))  # the limit ends these
    best = max(candidates, key=lambda c: sequence_score(model, src, src_mask, c, alpha))
    found = fd.fast_beam_search(
        model, src, src_mask, max_len=limit, beam_size=6**limit, alpha=alpha
    )
    assert tuple(found[0, 1:].tolist()) == best


def test_length_penalty_is_wu_et_al():
    assert at.length_penalty(1, 0.6) == 1.0
    assert at.length_penalty(20, 0.0) == 1.0
    assert math.isclose(at.length_penalty(20, 0.6), (25 / 6) ** 0.6)


@pytest.fixture(scope="module")
def copy_model():
    """A model trained 60 steps on the copy task (6 symbols, then </s>): it emits </s>
    after about 6 tokens, so its searches stop long before the paper's length limit."""
    generator = torch.Generator().manual_seed(0)
    config = at.TrainConfig(
        model=at.ModelConfig(N=1, d_model=32, d_ff=64, h=2, dropout=0.0, share_embeddings=False),
        vocab_size=12,
        warmup_steps=100,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small gains nothing from two, and busy cores slow it
    try:
        run = training.RunState.new(config, 12)
        for _ in range(60):
            batch = at.Batch.from_ids(at.copy_task_pairs(32, 12, 6, generator=generator))
            at.train_step(run.model, batch, run.optimizer, scheduler=run.scheduler, smoothing=0.0)
    finally:
        torch.set_num_threads(threads)
    return run.model.eval()


def copy_sources(seed):
    """Copy-task sources of several lengths, ending in </s>, padded, with an empty one."""
    generator = torch.Generator().manual_seed(seed)
    rows = [torch.randint(4, 12, (n,), generator=generator).tolist() for n in (6, 3, 5, 1)]
    rows = [row + [at.EOS_ID] for row in rows]
    rows.insert(2, [])
    src = torch.full((len(rows), 7), at.PAD_ID)
    for i, row in enumerate(rows):
        src[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return src, at.padding_mask(src, at.PAD_ID)


def count_steps(monkeypatch):
    """Record each step of the cached decoder (one call of next_log_probs per step)."""
    calls, original = [], fd.KeyValueCache.next_log_probs

    def counting(self, ys):
        calls.append(1)
        return original(self, ys)

    monkeypatch.setattr(fd.KeyValueCache, "next_log_probs", counting)
    return calls


def test_beam_search_stops_once_no_live_hypothesis_can_win(copy_model, monkeypatch):
    """The copy model ends its outputs after about 7 tokens; the limit is 50 more than the
    input. Once every sentence's best finished hypothesis is out of reach, the search stops."""
    calls = count_steps(monkeypatch)
    for seed, beam_size in itertools.product(range(3), (2, 4)):
        src, src_mask = copy_sources(seed)
        out = fd.fast_beam_search(copy_model, src, src_mask, beam_size=beam_size, alpha=0.6)
        assert all(at.EOS_ID in row for row in out.tolist())
    assert len(calls) <= 12 * 6  # 6 searches, 12 steps each at most on average, of 50 or more


def test_beam_search_reads_the_device_once_per_step(copy_model, monkeypatch):
    """Every read of a tensor's value by Python (bool, int, float, item, tolist) waits for
    the device; the search makes one per step (are all sentences done, which rows moved?),
    plus three outside the loop. Reads inside torch's own kernels are not counted here."""
    src, src_mask = copy_sources(0)
    steps, reads = count_steps(monkeypatch), []
    for name in ("__bool__", "__int__", "__float__", "__index__", "item", "tolist"):
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _original=original):
            reads.append(1)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counting)
    fd.fast_beam_search(copy_model, src, src_mask, beam_size=4)
    assert 0 < len(steps) and len(reads) <= len(steps) + 3


def test_decoding_labels_are_those_of_the_stored_results():
    results = pathlib.Path(__file__).resolve().parents[1] / "results"
    evaluation = json.loads((results / "multi30k" / "evaluation.json").read_text())
    attention = json.loads((results / "multi30k" / "attention.json").read_text())
    with open(results / "table3" / "variations.csv", newline="") as file:
        variations = {row["decoding"] for row in csv.DictReader(file)}
    stored = {row["decoding"] for row in evaluation["results"]} | {attention["decoding"]}
    # the attention maps and Table 3's runs decode at §6.1's 0.6; the shipped translator's
    # table at the alpha val chose for it (chapter 6.1's one rule)
    expected = {at.decoding_label(1), at.decoding_label(4, 0.6)}
    assert stored | variations == expected | {at.decoding_label(4, evaluation["alpha"])}
    assert at.decoding_label(4) == "beam 4, alpha 0.6" and at.decoding_label(1, 0.0) == "greedy"
    assert at.decoding_label(2, 1.0) == "beam 2, alpha 1.0"


def test_the_shipped_translator_loads_and_reproduces_its_stored_translations():
    # the weights chapters 6.1 and 7 run on: averaged, float16, with their tokenizer, small
    # enough for the repository; in float32 after loading, they translate the stored samples
    # exactly as evaluate.py did (beam 4, at the alpha val chose, which the file records)
    results = pathlib.Path(__file__).resolve().parents[1] / "results" / "multi30k"
    path = results / "averaged.pt"
    assert path.stat().st_size <= 30 * 2**20
    payload = at.read_checkpoint(path)
    assert {t.dtype for t in payload["model"].values() if t.is_floating_point()} == {torch.float16}
    evaluation = json.loads((results / "evaluation.json").read_text())
    assert payload["averaged_steps"] == evaluation["averaged_steps"]
    model, tokenizer = at.load_checkpoint(path)
    assert next(model.parameters()).dtype == torch.float32
    samples = evaluation["samples"][:3]
    assert payload["alpha"] == evaluation["alpha"]
    sources = [s["source"] for s in samples]
    translations = at.translate(model, tokenizer, sources, alpha=evaluation["alpha"])
    assert translations == [s["hypothesis"] for s in samples]


# ---- checkpoints ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    model, tokenizer, _ = training.train(TINY, toy_pairs(), folder, log=quiet)
    return folder, model, tokenizer


def test_averaging_identical_checkpoints_is_the_identity(tiny_run):
    folder, _, _ = tiny_run
    last = run_folder.snapshot_paths(folder)[-1]
    averaged = at.average_checkpoints([last, last, last])
    weights = torch.load(last, weights_only=True)["model"]
    assert averaged["model"].keys() == weights.keys()
    assert all(torch.equal(averaged["model"][k], weights[k]) for k in weights)


def test_averaging_two_checkpoints_is_the_mean_of_their_weights(tiny_run, tmp_path):
    folder, _, _ = tiny_run
    paths = run_folder.snapshot_paths(folder)
    assert [p.name for p in paths] == ["checkpoint-0000003.pt", "checkpoint-0000006.pt"]
    a, b = (torch.load(p, weights_only=True)["model"] for p in paths)
    averaged = at.average_checkpoints(paths)
    for name in a:
        torch.testing.assert_close(averaged["model"][name], (a[name] + b[name]) / 2)
    assert averaged["averaged_steps"] == [3, 6]
    at.save_checkpoint(tmp_path / "averaged.pt", averaged)
    model, _ = at.load_checkpoint(tmp_path / "averaged.pt")
    torch.testing.assert_close(
        model.state_dict()["generator.projection.weight"],
        averaged["model"]["generator.projection.weight"],
    )


def test_an_average_stores_a_tied_matrix_once(tiny_run, tmp_path):
    folder, model, _ = tiny_run  # TINY shares its embeddings and pre-softmax weights (§3.4)
    tied = ["src_embed.0.embedding.weight", "tgt_embed.0.embedding.weight"]
    tied.append("generator.projection.weight")
    averaged = at.average_checkpoints(run_folder.snapshot_paths(folder))["model"]
    assert len({averaged[name].data_ptr() for name in tied}) == 1
    at.save_checkpoint(tmp_path / "averaged.pt", {"model": averaged})
    stored = torch.load(tmp_path / "averaged.pt", weights_only=True)["model"]
    unique = {tensor.data_ptr(): tensor.numel() for tensor in stored.values()}
    assert sum(unique.values()) == sum(p.numel() for p in model.parameters())


def test_the_shipped_average_holds_each_parameter_once():
    path = ROOT / "results" / "multi30k" / "averaged.pt"
    stored = torch.load(path, weights_only=True)["model"]
    model, _ = at.load_checkpoint(path)
    unique = {tensor.data_ptr(): tensor.numel() for tensor in stored.values()}
    assert sum(unique.values()) == sum(p.numel() for p in model.parameters()) == 5_224_448


def test_checkpoints_of_different_runs_are_not_averaged(tiny_run, tmp_path):
    folder, _, _ = tiny_run
    last = run_folder.snapshot_paths(folder)[-1]
    other = dict(torch.load(last, weights_only=True))
    other["config"] = {**other["config"], "smoothing": 0.3}
    torch.save(other, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="have a different config: they come from different"):
        at.average_checkpoints([last, tmp_path / "other.pt"])
    # a run on other sentences: the same config, another vocabulary
    training.train(TINY, toy_pairs(seed=3), tmp_path / "b", log=quiet)
    second = run_folder.snapshot_paths(tmp_path / "b")[-1]
    assert json.loads(other["tokenizer"]) != json.loads(at.read_checkpoint(second)["tokenizer"])
    with pytest.raises(ValueError, match="have a different tokenizer: they come from different"):
        at.average_checkpoints([last, second])
    with pytest.raises(ValueError, match="at least one"):
        at.average_checkpoints([])


def test_load_checkpoint_restores_the_trained_model(tiny_run):
    folder, trained, tokenizer = tiny_run
    for path in (folder / "checkpoint.pt", run_folder.snapshot_paths(folder)[-1]):
        model, loaded_tokenizer = at.load_checkpoint(path)
        assert not model.training
        assert loaded_tokenizer.to_str() == tokenizer.to_str()
        assert all(
            torch.equal(a, b)
            for a, b in zip(model.state_dict().values(), trained.state_dict().values())
        )


def test_load_checkpoint_of_a_missing_file_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*; train one with"):
        at.load_checkpoint(tmp_path / "nothing.pt")


# ---- translate and BLEU --------------------------------------------------------------------


def test_translate_round_trips_a_batch_with_an_empty_string(tiny_run):
    folder, _, _ = tiny_run
    model, tokenizer = at.load_checkpoint(folder / "checkpoint.pt")
    sentence = "a man runs on the red street"
    for beam_size in (1, 4):
        outputs = at.translate(
            model, tokenizer, [sentence, "", sentence, "   "], beam_size=beam_size
        )
        assert len(outputs) == 4 and all(isinstance(o, str) for o in outputs)
        assert outputs[1] == outputs[3] == "" and outputs[0] == outputs[2]
        assert outputs[0] == at.translate(model, tokenizer, [sentence], beam_size=beam_size)[0]
    for special in at.SPECIAL_TOKENS:
        assert special not in outputs[0]
    assert at.translate(model, tokenizer, []) == []


def test_translate_handles_unknown_characters_and_refuses_bad_input(tiny_run):
    folder, _, _ = tiny_run
    model, tokenizer = at.load_checkpoint(folder / "checkpoint.pt")
    ids = tokenizer.encode("a ☃ dog").ids
    assert at.UNK_ID in ids
    # the same string as decoding the ids by hand: the unknown character became <unk>
    src = torch.tensor([ids + [at.EOS_ID]])
    out = fd.fast_beam_search(model, src, at.padding_mask(src, at.PAD_ID), beam_size=4, alpha=0.6)
    expected = tokenizer.decode(out[0].tolist(), skip_special_tokens=True)
    assert at.translate(model, tokenizer, ["a ☃ dog"]) == [expected]
    assert "<unk>" not in expected
    with pytest.raises(TypeError, match="wrap a single one"):
        at.translate(model, tokenizer, "a dog")
    with pytest.raises(TypeError, match="sentence 1 is a int"):
        at.translate(model, tokenizer, ["a dog", 3])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"batch_size": -1}, "batch_size must be a positive integer, got -1"),
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"beam_size": 0}, "beam_size must be a positive integer, got 0"),
        ({"alpha": float("nan")}, "alpha must be a finite number >= 0, got nan"),
        ({"alpha": -0.5}, "alpha must be a finite number >= 0, got -0.5"),
    ],
)
def test_translate_refuses_bad_decoding_settings(tiny_run, options, message):
    folder, _, _ = tiny_run
    model, tokenizer = at.load_checkpoint(folder / "checkpoint.pt")
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        at.translate(model, tokenizer, ["a dog"], **options)


@pytest.mark.parametrize(
    "max_len, fits",
    [(5000, "at most 4950 tokens fit"), (40, "no sentence fits"), (54, "at most 4 tokens fit")],
)
def test_a_sentence_too_long_for_the_positional_tables_is_refused_with_possible_numbers(
    tiny_run, max_len, fits
):
    folder, _, _ = tiny_run
    _, tokenizer = at.load_checkpoint(folder / "checkpoint.pt")
    vocab = tokenizer.get_vocab_size()
    model = at.make_model(vocab, vocab, N=1, d_model=16, d_ff=32, h=2, max_len=max_len)
    sentence = "dog " * 5000 if max_len == 5000 else "a man runs on the red street"
    n = len(tokenizer.encode(sentence).ids) + 1  # and </s>
    with pytest.raises(ValueError) as refused:
        at.translate(model, tokenizer, [sentence])
    message = str(refused.value)
    assert f"sentence 0 is {n} tokens long" in message and fits in message
    assert f"tables of {n} (source) and {n + 50} (target) rows" in message
    assert not re.search(r"-\d", message)  # no negative count of tokens, ever


def test_evaluate_bleu_scores_with_sacrebleu(tiny_run, monkeypatch):
    folder, _, _ = tiny_run
    model, tokenizer = at.load_checkpoint(folder / "checkpoint.pt")
    pairs = [("ein hund", "A dog runs in the park."), ("zwei", "Two men are cooking.")]
    monkeypatch.setattr(at, "translate", lambda *args, **kwargs: [t for _, t in pairs])
    scores = at.evaluate_bleu(model, tokenizer, pairs)
    assert scores["bleu"] == 100.0 and scores["bleu_lowercase"] == 100.0
    assert scores["signature"].startswith("nrefs:1|case:mixed|")
    assert "case:lc" in scores["signature_lowercase"]
    assert scores["length_ratio"] == 1.0
    # one word short of the references' 7 + 5 tokens (13a splits off the full stops)
    shorter = ["A dog runs in the park.", "Two men cooking."]
    monkeypatch.setattr(at, "translate", lambda *args, **kwargs: shorter)
    assert at.evaluate_bleu(model, tokenizer, pairs)["length_ratio"] == round(11 / 12, 4)
    lowercase_first = ["a dog runs in the park.", "Two men are cooking."]
    monkeypatch.setattr(at, "translate", lambda *args, **kwargs: lowercase_first)
    scores = at.evaluate_bleu(model, tokenizer, pairs)
    assert 0 < scores["bleu"] < 100 and scores["bleu_lowercase"] == 100.0


@pytest.mark.parametrize("beam_size, alpha", [(1, 0.0), (2, 0.6), (4, 0.6), (4, 1.2)])
def test_the_one_sentence_beam_search_gives_the_batched_searchs_tokens(beam_size, alpha):
    """6.1's beam_search (one sentence, a Python walk over the candidates) and the fast
    decoding page's batched search, plain and cached, find the same hypothesis for every
    sentence of a padded batch; the model is made to end sentences at different lengths,
    so that finished hypotheses, the penalty and the early stop all take part."""
    torch.manual_seed(3)
    model = at.make_model(20, 20, N=2, d_model=32, d_ff=64, h=4).double().eval()
    with torch.no_grad():
        model.generator.projection.weight[at.EOS_ID] *= 3
    src = torch.randint(4, 20, (8, 7))
    src[2, 4:] = at.PAD_ID
    src_mask = at.padding_mask(src, at.PAD_ID)
    options = {"max_len": 15, "beam_size": beam_size, "alpha": alpha}
    batched = fd.fast_beam_search(model, src, src_mask, cache=False, **options)
    assert torch.equal(batched, fd.fast_beam_search(model, src, src_mask, **options))
    lengths = []
    for i in range(src.size(0)):
        one = at.beam_search(model, src[i : i + 1], src_mask[i : i + 1], **options)[0]
        assert torch.equal(batched[i, : one.numel()], one)
        assert (batched[i, one.numel() :] == at.PAD_ID).all()
        lengths.append(one.numel() - 1)
    assert min(lengths) < 15 == max(lengths) or beam_size == 1
    decoded = at.decode_batch(model, src, src_mask, beam_size=beam_size, alpha=alpha)
    assert torch.equal(
        decoded, fd.fast_decode_batch(model, src, src_mask, beam_size=beam_size, alpha=alpha)
    )


def test_the_papers_greedy_decode_gives_the_fast_paths_tokens():
    torch.manual_seed(4)
    model = at.make_model(20, 20, N=2, d_model=32, d_ff=64, h=4).eval()
    src = torch.randint(4, 20, (5, 9))
    src[1, 6:] = at.PAD_ID
    src_mask = at.padding_mask(src, at.PAD_ID)
    plain = at.greedy_decode(model, src, src_mask, max_len=12)
    assert torch.equal(plain, fd.fast_greedy_decode(model, src, src_mask, max_len=12))


def test_fast_translate_and_fast_evaluate_bleu_give_the_paper_decoders_translations():
    """The scripts' way to translate many sentences is chapter 6.1's translate with the fast
    decoder: on the shipped translator, greedy and beam search give the paper decoder's
    words, and the scores are those of the same translations."""
    model, tokenizer = at.load_checkpoint(ROOT / "results" / "multi30k" / "averaged.pt")
    pairs = [
        ("Ein Hund rennt über die Wiese.", "A dog runs across the meadow."),
        ("Zwei Männer spielen Fußball im Park.", "Two men play soccer in the park."),
        ("Eine Frau mit rotem Hut liest ein Buch auf einer Bank.", "A woman reads a book."),
    ]
    sources = [source for source, _ in pairs]
    for options in ({"beam_size": 1}, {"beam_size": 4, "alpha": 1.0}):
        paper = at.translate(model, tokenizer, sources, **options)  # decode_batch, one by one
        assert fd.fast_translate(model, tokenizer, sources, **options) == paper
        scores = fd.fast_evaluate_bleu(model, tokenizer, pairs, **options)
        assert scores["hypotheses"] == paper


def test_every_script_translates_many_sentences_on_the_fast_path():
    """Outside the paper's module, translate and evaluate_bleu are called as fast_translate
    and fast_evaluate_bleu (fast_decoding), or name their decoder: a script that forgot
    would decode sentence by sentence, many times slower, without a word."""
    slow = []
    for path in sorted((ROOT / "code").glob("*.py")):
        if path.name in ("annotated_transformer.py", "fast_decoding.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            named = {keyword.arg for keyword in node.keywords}
            if name in ("translate", "evaluate_bleu") and "decode" not in named:
                slow.append(f"{path.name}:{node.lineno}")
    assert not slow, f"call fd.fast_translate or fd.fast_evaluate_bleu instead: {slow}"


def test_once_per_tensor_changes_each_tensor_once_and_keeps_tied_weights_tied():
    shared, other = torch.ones(2), torch.zeros(3)
    weights = {"embedding": shared, "projection": shared, "bias": other}
    calls = []
    changed = at.once_per_tensor(weights, lambda name, tensor: calls.append(name) or tensor + 1)
    assert calls == ["embedding", "bias"]  # the tied matrix once, under its first name
    assert changed["embedding"] is changed["projection"]
    assert torch.equal(changed["projection"], torch.full((2,), 2.0))
    assert torch.equal(changed["bias"], torch.ones(3))
