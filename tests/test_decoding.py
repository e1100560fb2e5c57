"""§6.1: the key/value cache, greedy decoding, beam search with length penalty, checkpoint
averaging, translate, and scoring."""

import csv
import dataclasses
import itertools
import json
import math
import pathlib

import pytest
import torch

import annotated_transformer as at
from toy import TINY, quiet, toy_pairs


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
        cache = at.KeyValueCache(model, memory)
        for t in range(tgt.size(1)):
            step = at.decode_step(model, src_mask, tgt[:, t : t + 1], cache)
            full = model.decode(memory, src_mask, tgt[:, : t + 1], at.subsequent_mask(t + 1))
            torch.testing.assert_close(step, model.generator(full[:, -1]), atol=1e-5, rtol=1e-5)
    assert cache.length == tgt.size(1)
    assert all(layer.self_attn.keys.size(2) == tgt.size(1) for layer in cache.layers)


def test_the_self_attention_cache_grows_in_place_and_when_full_keeps_what_it_had():
    torch.manual_seed(0)
    attention = at.MultiHeadedAttention(4, 32).eval()
    x = torch.randn(3, 9, 32)
    cache = at.AttentionCache(growing=True)
    cache.room = 3  # full after 4 positions, then after 8: two regrowths in 9 steps
    buffers = []
    with torch.no_grad():
        full = attention(x, x, x, at.subsequent_mask(9))
        for t in range(9):
            step = attention(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], cache=cache)
            torch.testing.assert_close(step, full[:, t : t + 1], atol=1e-5, rtol=0)
            buffers.append(cache.keys.data_ptr())
    assert cache.keys.shape == (3, 4, 9, 8)
    assert len(set(buffers)) == 3  # one buffer for steps 1-4, one for 5-8, one from step 9


def test_the_cache_refuses_to_keep_tensors_that_need_gradients():
    attention = at.MultiHeadedAttention(4, 32)
    x = torch.randn(2, 1, 32)
    with pytest.raises(RuntimeError, match="decode under torch.no_grad"):
        attention(x, x, x, cache=at.AttentionCache(growing=True))


def test_decoding_needs_no_no_grad_block_and_returns_no_graph():
    model = small_model()
    src, src_mask = sources()
    for search in (at.greedy_decode, at.beam_search):
        out = search(model, src, src_mask, max_len=10)
        with torch.no_grad():
            assert torch.equal(out, search(model, src, src_mask, max_len=10))
        assert not out.requires_grad


def test_beam_slots_keep_first_extensions_in_place_and_fill_dropped_rows():
    # one sentence, k = 4, six candidates best first: rows 2, 2, 0, 2, 1, 3 extended
    parent = torch.tensor([[2, 2, 0, 2, 1, 3]])
    kept = torch.tensor([[True, True, True, True, False, False]])
    slot = at.beam_slots(kept, parent, 4)
    # the first extension of row 2 stays in row 2, of row 0 in row 0; the second and third
    # extensions of row 2 take rows 1 and 3, whose hypotheses nothing extends
    assert slot.tolist() == [[2, 1, 0, 3, 4, 4]]
    # fewer than k kept: the rows nothing fills stay empty (slot k for the rest)
    kept = torch.tensor([[True, False, True, False, False, False]])
    assert at.beam_slots(kept, parent, 4).tolist() == [[2, 4, 0, 4, 4, 4]]


def test_beam_search_copies_only_the_rows_of_second_extensions(monkeypatch):
    model = small_model()
    src, src_mask = sources()
    copies, original = [], at.KeyValueCache.copy_rows

    def recording(self, source, target):
        assert not set(target.tolist()) & set(source.tolist())  # in place: never read after written
        copies.append(target.numel())
        return original(self, source, target)

    monkeypatch.setattr(at.KeyValueCache, "copy_rows", recording)
    with torch.no_grad():
        cached = at.beam_search(model, src, src_mask, max_len=12, beam_size=4)
        uncached = at.beam_search(model, src, src_mask, max_len=12, beam_size=4, cache=False)
    assert torch.equal(cached, uncached)
    rows = src.size(0) * 4
    assert copies and max(copies) < rows and sum(copies) < rows * len(copies) / 2


def test_greedy_decoding_with_and_without_the_cache_agree():
    model = small_model()
    src, src_mask = sources()
    with torch.no_grad():
        cached = at.greedy_decode(model, src, src_mask, max_len=20, cache=True)
        uncached = at.greedy_decode(model, src, src_mask, max_len=20, cache=False)
    assert torch.equal(cached, uncached)
    assert (cached[:, 0] == at.BOS_ID).all()


def test_output_length_is_at_most_input_length_plus_50():
    model = small_model()
    src, src_mask = sources()
    with torch.no_grad():
        greedy = at.greedy_decode(model, src, src_mask, end_symbol=-1)
        beam = at.beam_search(model, src, src_mask, end_symbol=-1, beam_size=2)
    produced = (greedy[:, 1:] != at.PAD_ID).sum(-1)
    assert produced.tolist() == [7 + 50, 4 + 50, 0 + 50, 7 + 50, 7 + 50]
    assert ((beam[:, 1:] != at.PAD_ID).sum(-1) <= src_mask.sum(-1).squeeze(-1) + 50).all()
    assert at.greedy_decode(model, src, src_mask, max_len=3, end_symbol=-1).size(1) == 4
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        at.greedy_decode(model, src, src_mask, max_len=0)


def ends_often(model):
    """Make the end symbol likely enough that sentences end at different lengths."""
    with torch.no_grad():
        model.generator.projection.weight[at.EOS_ID] *= 3
    return model


@pytest.mark.parametrize("seed", range(4))
def test_beam_of_one_without_length_penalty_is_greedy(seed):
    model = ends_often(small_model(seed))
    src, src_mask = sources(seed)
    with torch.no_grad():
        greedy = at.greedy_decode(model, src, src_mask, max_len=15)
        beam = at.beam_search(model, src, src_mask, max_len=15, beam_size=1, alpha=0.0)
    assert torch.equal(beam, greedy)


def test_beam_search_with_and_without_the_cache_agree():
    model = ends_often(small_model(3))
    src, src_mask = sources(3)
    with torch.no_grad():
        cached = at.beam_search(model, src, src_mask, max_len=15, beam_size=4, alpha=0.6)
        uncached = at.beam_search(
            model, src, src_mask, max_len=15, beam_size=4, alpha=0.6, cache=False
        )
    assert torch.equal(cached, uncached)


def sequence_score(model, src, src_mask, tokens, alpha):
    ys = torch.tensor([[at.BOS_ID, *tokens]])
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        out = model.decode(memory, src_mask, ys[:, :-1], at.subsequent_mask(len(tokens)))
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
    with torch.no_grad():
        found = at.beam_search(model, src, src_mask, max_len=limit, beam_size=6**limit, alpha=alpha)
    assert tuple(found[0, 1:].tolist()) == best


def test_length_penalty_is_wu_et_al():
    assert at.length_penalty(1, 0.6) == 1.0
    assert at.length_penalty(20, 0.0) == 1.0
    assert math.isclose(at.length_penalty(20, 0.6), (25 / 6) ** 0.6)


def test_a_bad_beam_size_is_refused():
    model = small_model()
    src, src_mask = sources()
    with pytest.raises(ValueError, match="beam_size must be a positive integer"):
        at.beam_search(model, src, src_mask, beam_size=0)


# ---- beam search: the vectorised search gives the previous implementation's outputs --------


def old_beam_search(
    model,
    src,
    src_mask,
    max_len=None,
    start_symbol=at.BOS_ID,
    end_symbol=at.EOS_ID,
    beam_size=4,
    alpha=0.6,
    cache=True,
):
    """The previous beam_search of chapter 6.1, kept only to pin behaviour: it walked each
    sentence's candidates in Python at every step. The vectorised at.beam_search must give
    exactly its outputs (test_beam_search_equals_the_previous_implementation)."""
    if not isinstance(beam_size, int) or beam_size <= 0:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}")
    batch, k, device = src.size(0), beam_size, src.device
    limits = at.output_limits(src_mask, max_len).tolist()
    memory = model.encode(src, src_mask).repeat_interleave(k, dim=0)
    src_mask = src_mask.repeat_interleave(k, dim=0)
    kv = at.KeyValueCache(model, memory) if cache else None
    ys = torch.full((batch * k, 1), start_symbol, dtype=torch.long, device=device)
    # all k hypotheses start as the same empty prefix: keep only one of them alive at first
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    finished = [[] for _ in range(batch)]  # (log P / lp, tokens) of ended hypotheses
    done = [False] * batch
    for t in range(max(limits)):
        length = t + 1  # tokens in a hypothesis after this step, end_symbol included
        log_probs = at.next_log_probs(model, memory, src_mask, ys, kv).float()
        vocab = log_probs.size(-1)
        candidates = (scores.unsqueeze(-1) + log_probs.view(batch, k, vocab)).view(batch, -1)
        # 2k candidates: even if k of them end here, k others can go on
        top_scores, top_index = candidates.topk(min(2 * k, candidates.size(-1)), dim=-1)
        new_scores = torch.full((batch, k), float("-inf"), device=device)
        new_rows = torch.arange(batch, device=device).repeat_interleave(k) * k
        new_tokens = torch.full((batch, k), at.PAD_ID, dtype=torch.long, device=device)
        prefixes = ys[:, 1:].tolist()
        for b in range(batch):
            if done[b]:
                continue
            alive = 0
            for score, index in zip(top_scores[b].tolist(), top_index[b].tolist()):
                if score == float("-inf") or alive == k:
                    break
                row, token = b * k + index // vocab, index % vocab
                if token == end_symbol or length >= limits[b]:
                    hypothesis = prefixes[row] + [token]
                    finished[b].append((score / at.length_penalty(length, alpha), hypothesis))
                else:
                    new_scores[b, alive], new_tokens[b, alive] = score, token
                    new_rows[b * k + alive] = row
                    alive += 1
            # log P only falls as a hypothesis grows, and lp is largest at the length limit:
            # no live hypothesis can end above best_alive / lp(limit)
            best_finished = max((s for s, _ in finished[b]), default=float("-inf"))
            bound = new_scores[b, 0].item() / at.length_penalty(limits[b], alpha)
            done[b] = alive == 0 or best_finished >= bound
        if all(done):
            break
        ys = torch.cat([ys[new_rows], new_tokens.view(-1, 1)], dim=1)
        scores = new_scores
        if kv is not None:
            kv.reorder(new_rows)
    best = [max(hypotheses)[1] if hypotheses else [] for hypotheses in finished]
    out = torch.full((batch, 1 + max(map(len, best))), at.PAD_ID, dtype=torch.long, device=device)
    out[:, 0] = start_symbol
    for b, tokens in enumerate(best):
        out[b, 1 : 1 + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    return out


@pytest.fixture(scope="module")
def copy_model():
    """A model trained 60 steps on the copy task (6 symbols, then </s>): it emits </s>
    after about 6 tokens, so its searches finish hypotheses of several lengths, which the
    length penalty ranks differently, and stop long before the length limit."""
    generator = torch.Generator().manual_seed(0)
    config = at.TrainConfig(
        model=at.ModelConfig(N=1, d_model=32, d_ff=64, h=2, dropout=0.0, share_embeddings=False),
        vocab_size=12,
        warmup_steps=100,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small gains nothing from two, and busy cores slow it
    try:
        run = at.build_training(config, 12)
        # long enough to end sentences, short enough to stay unsure of where: trained
        # longer, its searches rank hypotheses alike with and without the length penalty
        for _ in range(60):
            batch = at.Batch.from_ids(at.copy_task_pairs(32, 12, 6, generator))
            at.train_step(run.model, batch, run.optimizer, run.scheduler, run.scaler, 0.0)
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
    """Record each call of at.next_log_probs (one per decoding step) in the returned list."""
    calls, original = [], at.next_log_probs

    def counting(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(at, "next_log_probs", counting)
    return calls


def pinned_cases(seed, copy_model):
    """(name, model, src, src_mask, max_len): untrained models whose end symbol is made
    likely (once or twice), and the copy-task model at the paper's limit, input length + 50."""
    return [
        ("end likely", ends_often(small_model(seed)), *sources(seed), 15),
        ("end very likely", ends_often(ends_often(small_model(seed + 10))), *sources(seed), 15),
        ("copy task", copy_model, *copy_sources(seed), None),
    ]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("beam_size", [1, 2, 4])
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_search_equals_the_previous_implementation(
    copy_model, monkeypatch, seed, beam_size, alpha
):
    calls = count_steps(monkeypatch)
    for name, model, src, src_mask, max_len in pinned_cases(seed, copy_model):
        for cache in (True, False) if beam_size == 4 else (True,):
            options = {"beam_size": beam_size, "alpha": alpha, "cache": cache}
            with torch.no_grad():
                new = at.beam_search(model, src, src_mask, max_len, **options)
                new_steps = len(calls)
                old = old_beam_search(model, src, src_mask, max_len, **options)
            assert torch.equal(new, old), (name, options)
            assert new_steps == len(calls) - new_steps, (name, options)  # stopped at the same step
            calls.clear()


def test_the_pinned_cases_reach_every_rule_of_the_search(copy_model, monkeypatch):
    """The cases above are not all alike: sentences end with </s> before the limit, the
    length penalty changes which hypothesis wins, and the early stop ends searches long
    before the limit (a beam never runs out of hypotheses that go on before it)."""
    with torch.no_grad():
        lengths = torch.cat(
            [
                (at.beam_search(model, src, src_mask, max_len)[:, 1:] != at.PAD_ID).sum(-1)
                for seed in range(3)
                for _, model, src, src_mask, max_len in pinned_cases(seed, copy_model)[:2]
            ]
        )
        assert (lengths < 15).any() and (lengths == 15).any()  # </s> before the limit, and at it
        changed = 0  # sentences whose best hypothesis differs between alpha 0 and 0.6
        for seed, beam_size in itertools.product(range(3), (2, 4)):
            for _, model, src, src_mask, max_len in pinned_cases(seed, copy_model):
                outputs = [
                    at.beam_search(model, src, src_mask, max_len, beam_size=beam_size, alpha=alpha)
                    for alpha in (0.0, 0.6)
                ]
                changed += sum(a != b for a, b in zip(*(out.tolist() for out in outputs)))
        assert changed > 0
        calls = count_steps(monkeypatch)
        for seed, beam_size in itertools.product(range(3), (2, 4)):
            src, src_mask = copy_sources(seed)
            out = at.beam_search(copy_model, src, src_mask, beam_size=beam_size, alpha=0.6)
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
    with torch.no_grad():
        at.beam_search(copy_model, src, src_mask, beam_size=4)
    assert 0 < len(steps) and len(reads) <= len(steps) + 3


def test_decoding_labels_are_those_of_the_stored_results():
    results = pathlib.Path(__file__).resolve().parents[1] / "results"
    evaluation = json.loads((results / "multi30k" / "evaluation.json").read_text())
    attention = json.loads((results / "multi30k" / "attention.json").read_text())
    with open(results / "table3" / "variations.csv", newline="") as file:
        variations = {row["decoding"] for row in csv.DictReader(file)}
    stored = {row["decoding"] for row in evaluation["results"]} | {attention["decoding"]}
    assert stored | variations == {at.decoding_label(1), at.decoding_label(4, 0.6)}
    assert at.decoding_label(4) == "beam 4, alpha 0.6" and at.decoding_label(1, 0.0) == "greedy"
    assert at.decoding_label(2, 1.0) == "beam 2, alpha 1.0"


def test_the_shipped_translator_loads_and_reproduces_its_stored_translations():
    # the weights chapters 6.1 and 7 run on: averaged, float16, with their tokenizer, small
    # enough for the repository; in float32 after loading, they translate the stored samples
    # exactly as evaluate.py did (beam 4, alpha 0.6)
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
    translations = at.translate(model, tokenizer, [s["source"] for s in samples])
    assert translations == [s["hypothesis"] for s in samples]


# ---- checkpoints ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    model, tokenizer, _ = at.train(TINY, toy_pairs(), folder, log=quiet)
    return folder, model, tokenizer


def test_averaging_identical_checkpoints_is_the_identity(tiny_run):
    folder, _, _ = tiny_run
    last = at.snapshot_paths(folder)[-1]
    averaged = at.average_checkpoints([last, last, last])
    weights = torch.load(last, weights_only=True)["model"]
    assert averaged["model"].keys() == weights.keys()
    assert all(torch.equal(averaged["model"][k], weights[k]) for k in weights)


def test_averaging_two_checkpoints_is_the_mean_of_their_weights(tiny_run, tmp_path):
    folder, _, _ = tiny_run
    paths = at.snapshot_paths(folder)
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


def test_checkpoints_of_different_runs_are_not_averaged(tiny_run, tmp_path):
    folder, _, _ = tiny_run
    other = dict(torch.load(at.snapshot_paths(folder)[-1], weights_only=True))
    other["config"] = {**other["config"], "smoothing": 0.3}
    torch.save(other, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="differently configured runs"):
        at.average_checkpoints([at.snapshot_paths(folder)[-1], tmp_path / "other.pt"])
    with pytest.raises(ValueError, match="at least one"):
        at.average_checkpoints([])


def test_load_checkpoint_restores_the_trained_model(tiny_run):
    folder, trained, tokenizer = tiny_run
    for path in (folder / "checkpoint.pt", at.snapshot_paths(folder)[-1]):
        model, loaded_tokenizer = at.load_checkpoint(path)
        assert not model.training
        assert loaded_tokenizer.to_str() == tokenizer.to_str()
        assert all(
            torch.equal(a, b)
            for a, b in zip(model.state_dict().values(), trained.state_dict().values())
        )


def test_load_checkpoint_says_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        at.load_checkpoint(tmp_path / "missing.pt")
    torch.save({"weights": torch.ones(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a checkpoint written by train"):
        at.load_checkpoint(tmp_path / "other.pt")


# ---- translate and BLEU --------------------------------------------------------------------


def test_translate_round_trips_a_batch_with_an_empty_string(tiny_run):
    folder, _, _ = tiny_run
    model, tokenizer = at.load_checkpoint(folder / "checkpoint.pt")
    sentence = "a man runs on the red street"
    for beam_size in (1, 4):
        outputs = at.translate(model, tokenizer, [sentence, "", sentence, "   "], beam_size)
        assert len(outputs) == 4 and all(isinstance(o, str) for o in outputs)
        assert outputs[1] == outputs[3] == "" and outputs[0] == outputs[2]
        assert outputs[0] == at.translate(model, tokenizer, [sentence], beam_size)[0]
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
    out = at.beam_search(model, src, at.padding_mask(src, at.PAD_ID), beam_size=4, alpha=0.6)
    expected = tokenizer.decode(out[0].tolist(), skip_special_tokens=True)
    assert at.translate(model, tokenizer, ["a ☃ dog"]) == [expected]
    assert "<unk>" not in expected
    with pytest.raises(TypeError, match="wrap a single one"):
        at.translate(model, tokenizer, "a dog")
    with pytest.raises(TypeError, match="sentence 1 is a int"):
        at.translate(model, tokenizer, ["a dog", 3])
    with pytest.raises(ValueError, match="sentence 0 is .* tokens long"):
        at.translate(model, tokenizer, ["dog " * 5000])


def test_evaluate_bleu_scores_with_sacrebleu(tiny_run, monkeypatch):
    folder, _, _ = tiny_run
    model, tokenizer = at.load_checkpoint(folder / "checkpoint.pt")
    pairs = [("ein hund", "A dog runs in the park."), ("zwei", "Two men are cooking.")]
    monkeypatch.setattr(at, "translate", lambda *args, **kwargs: [t for _, t in pairs])
    scores = at.evaluate_bleu(model, tokenizer, pairs)
    assert scores["bleu"] == 100.0 and scores["bleu_lowercase"] == 100.0
    assert scores["signature"].startswith("nrefs:1|case:mixed|")
    assert "case:lc" in scores["signature_lowercase"]
    lowercase_first = ["a dog runs in the park.", "Two men are cooking."]
    monkeypatch.setattr(at, "translate", lambda *args, **kwargs: lowercase_first)
    scores = at.evaluate_bleu(model, tokenizer, pairs)
    assert 0 < scores["bleu"] < 100 and scores["bleu_lowercase"] == 100.0


def test_evaluate_command_line_writes_the_table(tiny_run, tmp_path, monkeypatch):
    import evaluate

    folder, _, _ = tiny_run
    monkeypatch.setattr(at, "load_multi30k", lambda split, data_dir=None: toy_pairs(8, seed=2))
    # a 6-step model rarely ends a sentence: cap outputs at 5 tokens to keep this test fast
    capped = lambda src_mask, max_len=None: torch.full((src_mask.size(0),), 5)  # noqa: E731
    monkeypatch.setattr(at, "output_limits", capped)
    assert evaluate.main(["--run", str(folder), "--out", str(tmp_path), "--average", "2"]) == 0
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    assert evaluation["steps"] == 6 and evaluation["averaged_steps"] == [3, 6]
    seconds = torch.load(folder / "checkpoint.pt", weights_only=True)["seconds"]
    assert evaluation["train_hours"] == round(seconds / 3600, 2)  # kept by the checkpoint
    assert len(evaluation["results"]) == 8  # 2 weights x 2 sets x 2 decodings
    assert {r["decoding"] for r in evaluation["results"]} == {"greedy", "beam 4, alpha 0.6"}
    assert len(evaluation["samples"]) == 8
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["history"][0]["step"] == 6  # one window of 10 steps, ending at step 6
    assert (tmp_path / "averaged.pt").exists() and not (folder / "averaged.pt").exists()
    # the averaged weights are stored in float16, and load back into a float32 model
    stored = at.read_checkpoint(tmp_path / "averaged.pt")["model"]
    assert {t.dtype for t in stored.values() if t.is_floating_point()} == {torch.float16}
    expected = at.average_checkpoints(at.snapshot_paths(folder)[-2:])["model"]
    model, _ = at.load_checkpoint(tmp_path / "averaged.pt")
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, expected[name].half().float())


def test_evaluate_within_hours_scores_the_run_as_it_stood_then(tmp_path, monkeypatch):
    import evaluate

    # a run that validates at every snapshot, so each records its training time
    config = dataclasses.replace(TINY, eval_every=3, bleu_sentences=2)
    folder = tmp_path / "run"
    at.train(config, toy_pairs(), folder, val_pairs=toy_pairs(4, seed=3), log=quiet)
    # the tiny run takes well under a second: give its snapshots the training times of a
    # long one, half an hour and two hours, so that one hour falls between them
    for path, seconds in zip(at.snapshot_paths(folder), (1800.0, 7200.0)):
        payload = at.read_checkpoint(path)
        payload["validation"]["seconds"] = seconds
        at.save_checkpoint(path, payload)
    monkeypatch.setattr(at, "load_multi30k", lambda split, data_dir=None: toy_pairs(4, seed=2))
    capped = lambda src_mask, max_len=None: torch.full((src_mask.size(0),), 5)  # noqa: E731
    monkeypatch.setattr(at, "output_limits", capped)
    hours = "1"
    out = tmp_path / "early"
    assert evaluate.main(["--run", str(folder), "--out", str(out), "--within-hours", hours]) == 0
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert evaluation["steps"] == 3 and evaluation["averaged_steps"] == [3]
    assert evaluation["train_seconds"] == 1800.0
    metrics = json.loads((out / "metrics.json").read_text())
    assert [v["step"] for v in metrics["validation"]] == [3]
    assert max(h["step"] for h in metrics["history"]) <= 3


def test_evaluate_within_hours_refuses_snapshots_without_training_time(tiny_run, tmp_path, capsys):
    import evaluate

    folder, _, _ = tiny_run  # trained without validation pairs
    flags = ["--run", str(folder), "--out", str(tmp_path / "o"), "--within-hours", "1"]
    assert evaluate.main(flags) == 2
    assert "records no training time" in capsys.readouterr().err


def test_training_time_is_read_from_the_log_across_resumes(tmp_path):
    import evaluate

    log = tmp_path / "train.log"
    log.write_text(
        "training quick ...\nstep 200: loss 3.5, lr 1e-3, 290 s, checkpoint written\n"
        "step 400: loss 3.0, lr 1e-3, 580 s, checkpoint written\nresumed from x at step 400\n"
        "step 600: loss 2.9, lr 1e-3, 300 s, checkpoint written\n"
    )
    assert evaluate.training_seconds(log) == 880
