"""code/export_onnx.py: the shipped translator as two ONNX graphs, run here with ONNX Runtime
(the engine the browser page runs as WebAssembly). The graphs must give the PyTorch model's
log-probabilities and attention weights, and the book's own greedy decoding and beam search,
run over the graphs instead of the model, must give the same translations.

Reads the files that set-up exports into _static/translator when they are newer than the
weights and the script; otherwise exports into a temporary folder first (a minute or two)."""

import json
import os
import pathlib

import numpy as np
import onnx
import pytest
import torch

import annotated_transformer as at
import export_onnx
import fast_decoding as fd
import script_helpers as helpers

ort = pytest.importorskip("onnxruntime")
ROOT = pathlib.Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "results" / "multi30k" / "averaged.pt"
SENTENCES = 12  # validation sentences decoded both ways


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    built = export_onnx.OUT
    names = ("encoder.onnx", "decoder.onnx", "tokenizer.json", "translator.json")
    sources = (
        SHIPPED,
        ROOT / "code" / "export_onnx.py",
        ROOT / "code" / "annotated_transformer.py",
    )
    newest_source = max(p.stat().st_mtime for p in sources)
    if all((built / n).is_file() and (built / n).stat().st_mtime > newest_source for n in names):
        return built
    out = tmp_path_factory.mktemp("translator")
    export_onnx.export(SHIPPED, out, examples=["Ein Hund rennt."])
    return out


class OnnxTranslator:
    """The two graphs behind the interface the book's decoders call (`encode`, `decode`,
    `generator`), so that greedy_decode and beam_search run them unchanged."""

    def __init__(self, folder):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.encoder = ort.InferenceSession(folder / "encoder.onnx", options)
        self.decoder = ort.InferenceSession(folder / "decoder.onnx", options)
        self.generator = lambda log_probs: log_probs  # the graph ends with log-softmax
        self.attention = None

    def encode(self, src, src_mask):
        return torch.from_numpy(self.encoder.run(None, {"src": src.numpy()})[0])

    def decode(self, memory, src_mask, tgt, tgt_mask):
        # the graph reads the source only for its padding: any real id stands for a token
        src = torch.where(src_mask.squeeze(1), at.EOS_ID, at.PAD_ID)
        feed = {"memory": memory.numpy(), "src": src.numpy(), "tgt": tgt.numpy()}
        log_probs, self.attention = self.decoder.run(None, feed)
        return torch.from_numpy(log_probs).unsqueeze(1)  # decode's (rows, tgt_len, ...) shape


@pytest.fixture(scope="module")
def models(folder):
    torch.set_num_threads(1)
    model, tokenizer = export_onnx.exportable(at.read_checkpoint(SHIPPED))
    with at.use_fused_attention(model, False):  # the graphs' path
        yield model, tokenizer, OnnxTranslator(folder)


@pytest.fixture(scope="module")
def val(models):
    model, tokenizer, _ = models
    sources = [german for german, _ in helpers.load_multi30k("val")[:SENTENCES]]
    encoded = at.encode_sentences(model, tokenizer, sources)
    src = at.pad_ids([encoded[i] for i in range(len(sources))])
    return src, at.padding_mask(src, at.PAD_ID)


def half_rounded(model):
    """A copy of `model` whose weights and tables are rounded to float16 and back, as the
    graphs store them."""
    rounded = export_onnx.exportable(at.read_checkpoint(SHIPPED))[0]
    with torch.no_grad():
        for p in [*rounded.parameters(), *rounded.buffers()]:  # the positional table too
            if p.is_floating_point() and p.numel() >= 1024:
                p.copy_(p.half().float())
    return rounded


def test_graphs_give_the_models_log_probabilities_and_attention(models, val):
    model, _, onnx_model = models
    src, src_mask = val
    tgt = torch.randint(4, 1000, (src.size(0), 9), generator=torch.Generator().manual_seed(0))
    tgt[:, 0] = at.BOS_ID
    decoded = onnx_model.decode(onnx_model.encode(src, src_mask), src_mask, tgt, tgt_mask=None)[
        :, 0
    ]
    # against the model with the graphs' float16-rounded weights: the same arithmetic
    rounded = half_rounded(model)
    with torch.no_grad(), at.use_fused_attention(rounded, False):
        states = rounded.decode(
            rounded.encode(src, src_mask), src_mask, tgt, tgt_mask=at.subsequent_mask(9)
        )
        expected = rounded.generator(states[:, -1])
    weights = rounded.decoder.layers[-1].src_attn.weights  # (batch, h, tgt, src)
    assert (decoded - expected).abs().max() < 1e-4
    assert np.abs(onnx_model.attention - weights.numpy()).max() < 1e-5
    assert onnx_model.attention.shape == (
        src.size(0),
        model.decoder.layers[-1].src_attn.h,
        9,
        src.size(1),
    )
    assert np.allclose(onnx_model.attention.sum(-1), 1, atol=1e-5)  # each row a distribution
    # against the float32 model: float16 storage moves a log-probability by little
    with torch.no_grad():
        states = model.decode(
            model.encode(src, src_mask), src_mask, tgt, tgt_mask=at.subsequent_mask(9)
        )
        full = model.generator(states[:, -1])
    assert (decoded - full).abs().max() < 0.05
    assert (decoded.argmax(-1) == full.argmax(-1)).float().mean() >= 0.95


@pytest.mark.parametrize("beam_size", [1, 4])
def test_greedy_and_beam_translations_are_the_models(models, val, beam_size):
    model, tokenizer, onnx_model = models
    src, src_mask = val
    decode = {1: fd.fast_greedy_decode, 4: fd.fast_beam_search}[beam_size]
    with torch.no_grad():
        expected = decode(model, src, src_mask, cache=False)
    got = decode(onnx_model, src, src_mask, cache=False)
    text = [tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in got]
    reference = [tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in expected]
    same = sum(a == b for a, b in zip(text, reference))
    assert same == len(reference), [(a, b) for a, b in zip(text, reference) if a != b]


def test_weights_are_stored_in_float16_once(folder, models):
    model = models[0]
    float32_bytes = 4 * sum(p.numel() for p in model.parameters())
    for name in ("encoder.onnx", "decoder.onnx"):
        graph = onnx.load(folder / name)
        large = [i for i in graph.graph.initializer if np.prod(i.dims) >= 1024]
        assert large and all(i.data_type == onnx.TensorProto.FLOAT16 for i in large)
        assert len({i.name for i in large}) == len(large)
        assert os.path.getsize(folder / name) < 0.6 * float32_bytes
    # the decoder's tied embedding and generator matrix: stored once
    tied = model.generator.projection.weight.detach().half().numpy()
    decoder = onnx.load(folder / "decoder.onnx").graph.initializer
    copies = [i.name for i in decoder if np.array_equal(onnx.numpy_helper.to_array(i), tied)]
    assert len(copies) == 1, copies


def test_settings_name_the_modules_ids_and_the_papers_decoding(folder, models):
    settings = json.loads((folder / "translator.json").read_text())
    assert (settings["pad_id"], settings["bos_id"], settings["eos_id"]) == (
        at.PAD_ID,
        at.BOS_ID,
        at.EOS_ID,
    )
    # beam 4 and at most 50 tokens more than the input (§6.1); the length penalty val chose
    # for the shipped weights, as chapter 6.1's table reports it, not §6.1's 0.6
    chosen = json.loads((SHIPPED.parent / "evaluation.json").read_text())["alpha"]
    assert (settings["beam_size"], settings["alpha"], settings["extra_length"]) == (4, chosen, 50)
    assert chosen != 0.6
    tokenizer = at.Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tokenizer.to_str() == models[1].to_str()
    assert settings["examples"] and all(isinstance(s, str) and s for s in settings["examples"])
