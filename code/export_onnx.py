"""Export the book's translator to ONNX, for the "Try the translator" page, which runs it in
the reader's browser with ONNX Runtime Web.

    python code/export_onnx.py                       # the shipped weights -> _static/translator/
    python code/export_onnx.py --checkpoint runs/x/averaged.pt --out some/folder

Two graphs, exported with torch.onnx's dynamo exporter (the TorchScript tracer bakes the
prefix length into the causal mask, so its graphs are wrong for any other length):

- encoder.onnx: src (batch, src_len) int64 ids -> memory (batch, src_len, d_model);
- decoder.onnx: memory, src, tgt (batch, tgt_len) -> log_probs (batch, vocab) of the token
  after the prefix, and attention (batch, h, tgt_len, src_len): the last decoder layer's
  encoder-decoder attention weights, the picture the page draws once a translation is done.

The decoder runs over the whole prefix at every step (no key/value cache: at these lengths
the page does not need one). Masks are built inside the graphs from the padding id and the
prefix length. Weights are stored in float16 and cast to float32 when a session loads, which
halves the files; the arithmetic stays float32. Beside the graphs: the tokenizer
(tokenizer.json, read by @huggingface/tokenizers on the page) and translator.json (special
ids, decoding settings, the longest source, a few validation sentences to click). Every file
is written to a temporary name and renamed, so a reader never meets half a file.
"""

import argparse
import json
import pathlib
import sys
import warnings

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import annotated_transformer as at
import safe_files
import script_helpers as helpers

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "_static" / "translator"
EXAMPLES = 8  # validation sentences offered on the page
NODE_MODULES = ROOT / "node_modules"
ENGINE = {  # npm package -> the files of its dist/ folder that the page loads
    "onnxruntime-web": [
        "ort.wasm.min.mjs",
        "ort-wasm-simd-threaded.mjs",
        "ort-wasm-simd-threaded.wasm",
    ],
    "@huggingface/tokenizers": ["tokenizers.min.mjs"],
}
POSITIONS = 256  # rows of the positional tables kept: sources of up to 206 tokens


class Encoder(torch.nn.Module):
    """src ids -> memory, the source's padding mask made inside the graph."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src):
        return self.model.encode(src, at.padding_mask(src, at.PAD_ID))


class DecoderStep(torch.nn.Module):
    """(memory, src, prefix) -> log-probabilities of the next token, and the last layer's
    encoder-decoder attention weights, (batch, h, tgt_len, src_len)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, memory, src, tgt):
        src_mask = at.padding_mask(src, at.PAD_ID)
        length = tgt.size(1)
        causal = torch.ones(length, length, dtype=torch.bool, device=tgt.device).tril()
        states = self.model.decode(memory, src_mask, tgt, tgt_mask=causal.unsqueeze(0))
        weights = self.model.decoder.layers[-1].src_attn.weights  # (batch, h, tgt, src)
        return self.model.generator(states[:, -1]), weights


def exportable(payload):
    """The model of a checkpoint's payload (at.read_checkpoint) with positional tables of
    POSITIONS rows, and its tokenizer."""
    model, tokenizer = at.translator_from(payload)
    for module in model.modules():
        if isinstance(module, at.PositionalEncoding) and module.max_len > POSITIONS:
            module.make_table(POSITIONS, module.table.size(1))  # a formula: rows cost bytes
    return model, tokenizer


def weights_in_float16(graph_proto):
    """Store every float32 weight of 1024 or more values as float16 and cast it back to
    float32 at the start of the graph. A weight that appears twice (the tied embedding and
    generator) is stored once."""
    graph = graph_proto.graph
    kept, casts, seen = [], [], {}
    for init in graph.initializer:
        array = numpy_helper.to_array(init)
        if init.data_type != TensorProto.FLOAT or array.size < 1024:
            kept.append(init)
            continue
        half = array.astype(np.float16)
        key = (half.shape, half.tobytes())
        if key not in seen:
            seen[key] = f"{init.name}.float16"
            kept.append(numpy_helper.from_array(half, seen[key]))
        casts.append(helper.make_node("Cast", [seen[key]], [init.name], to=TensorProto.FLOAT))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for node in reversed(casts):
        graph.node.insert(0, node)
    onnx.checker.check_model(graph_proto)
    return graph_proto


def export_graph(module, inputs, names, *, dynamic, path):
    """One module to one self-contained ONNX file with float16 weights, written atomically."""
    with warnings.catch_warnings():
        # the exporter's advice (register `weights` as a buffer, ...) does not apply here
        warnings.simplefilter("ignore")
        program = torch.onnx.export(  # no file: the graph stays in memory until it is final
            module.eval(),
            inputs,
            input_names=names[0],
            output_names=names[1],
            dynamic_shapes=dynamic,
            dynamo=True,
            verbose=False,
        )
        graph = weights_in_float16(program.model_proto)
    with safe_files.atomic_file(path, "wb") as file:
        file.write(graph.SerializeToString())


def export(checkpoint, out, examples):
    """encoder.onnx, decoder.onnx, tokenizer.json and translator.json into `out`."""
    payload = at.read_checkpoint(checkpoint)
    model, tokenizer = exportable(payload)
    out.mkdir(parents=True, exist_ok=True)
    src = torch.tensor([[5, 6, 7, 8, at.EOS_ID], [9, 10, at.EOS_ID, at.PAD_ID, at.PAD_ID]])
    tgt = torch.tensor([[at.BOS_ID, 11, 12], [at.BOS_ID, 13, 14]])
    batch, src_len, tgt_len = (torch.export.Dim(n) for n in ("batch", "src_len", "tgt_len"))
    # the reference attention path: it keeps the weights that the page draws
    with torch.no_grad(), at.use_fused_attention(model, False):
        memory = model.encode(src, at.padding_mask(src, at.PAD_ID))
        export_graph(
            Encoder(model),
            (src,),
            (["src"], ["memory"]),
            dynamic={"src": {0: batch, 1: src_len}},
            path=out / "encoder.onnx",
        )
        export_graph(
            DecoderStep(model),
            (memory, src, tgt),
            (["memory", "src", "tgt"], ["log_probs", "attention"]),
            dynamic={
                "memory": {0: batch, 1: src_len},
                "src": {0: batch, 1: src_len},
                "tgt": {0: batch, 1: tgt_len},
            },
            path=out / "decoder.onnx",
        )
    settings = {
        "pad_id": at.PAD_ID,
        "bos_id": at.BOS_ID,
        "eos_id": at.EOS_ID,
        "beam_size": 4,
        "alpha": helpers.recorded_alpha(payload),  # the one val chose for it
        "extra_length": 50,  # §6.1: at most input length + 50 output tokens
        "max_source_tokens": min(model.src_embed[1].max_len, model.tgt_embed[1].max_len - 50),
        "heads": model.decoder.layers[-1].src_attn.h,
        "examples": examples,
    }
    safe_files.write_text(out / "tokenizer.json", tokenizer.to_str())
    safe_files.write_text(
        out / "translator.json", json.dumps(settings, ensure_ascii=False, indent=1)
    )
    return {p.name: p.stat().st_size for p in sorted(out.iterdir())}


def copy_engine(out):
    """The page's engine and tokenizer, from the npm packages that `npm ci` installs, into
    out/vendor (the page loads nothing from elsewhere). -> the files copied, or [] without
    node_modules: the rest of the book builds, and the page says what is missing."""
    if not all((NODE_MODULES / package).is_dir() for package in ENGINE):
        return []
    vendor = out / "vendor"
    vendor.mkdir(parents=True, exist_ok=True)
    copied = []
    for package, names in ENGINE.items():
        for name in names:
            with safe_files.atomic_file(vendor / name, "wb") as file:
                file.write((NODE_MODULES / package / "dist" / name).read_bytes())
            copied.append(vendor / name)
    return copied


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    helpers.add_checkpoint_flag(parser)
    parser.add_argument(
        "--out",
        type=helpers.given_path,
        metavar="FOLDER",
        default=OUT,
        help="where the files go (default: _static/translator, which the book's build copies)",
    )
    helpers.add_data_dir_flag(parser)
    return parser.parse_args(argv)


@helpers.user_errors_exit_2("export_onnx.py")
def main(argv=None):
    args = parse_args(argv)
    examples = [
        german for german, _ in helpers.load_multi30k("val", data_dir=args.data_dir)[:EXAMPLES]
    ]
    sizes = export(args.checkpoint, args.out, examples)
    for name, size in sizes.items():
        print(f"{args.out / name}: {size / 2**20:.1f} MiB")
    copied = copy_engine(args.out)
    if copied:
        print(f"the page's engine and tokenizer: {len(copied)} files in {args.out / 'vendor'}")
    else:
        print("node_modules is missing: run `npm ci` first, or the page says it cannot run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
