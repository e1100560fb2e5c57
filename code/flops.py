"""FLOPs, counted by formula: the matrix products of the Transformer's forward pass and
training step (the FLOP counter of torch agrees: tests/test_benchmark.py), a recipe's mean
step, and the bf16 peaks of the GPUs that model FLOPs utilisation is measured against.

Written by hand (no page exports it): the speed benchmark, the CUDA graphs page and the
Performance page count with it.
"""

import torch

import annotated_transformer as at


def forward_flops(config, vocab, batch, *, src_len, tgt_len):
    """FLOPs of one forward pass of the encoder, decoder and generator on `batch` sentence
    pairs of src_len and tgt_len tokens, by part. Matrix products only, 2*m*n*k each (one
    multiply and one add per term); softmax, LayerNorm, dropout, residual additions and the
    loss are element-wise, O(tokens * d_model), and left out, as torch's FlopCounterMode
    leaves them out. Embedding lookups are no arithmetic."""
    d, d_ff, N = config.d_model, config.d_ff, config.N
    with torch.device("meta"):  # the head widths as the model derives them, without weights
        heads = at.MultiHeadedAttention(config.h, d, d_k=config.d_k, d_v=config.d_v)
    h, d_k, d_v = heads.h, heads.d_k, heads.d_v
    src, tgt = batch * src_len, batch * tgt_len  # tokens through encoder and decoder

    def linear(tokens, d_in, d_out):
        return 2 * tokens * d_in * d_out

    def attention(queries, keys):
        # Q K^T and weights @ V on every head of every sentence
        return 2 * batch * h * queries * keys * (d_k + d_v)

    # W^Q, W^K, W^V and W^O of each attention module; in encoder-decoder attention the
    # queries come from the decoder, keys and values from the encoder's output (the memory)
    encoder_self = linear(src, d, h * (2 * d_k + d_v)) + linear(src, h * d_v, d)
    decoder_self = linear(tgt, d, h * (2 * d_k + d_v)) + linear(tgt, h * d_v, d)
    encoder_decoder = (
        linear(tgt, d, h * d_k) + linear(src, d, h * (d_k + d_v)) + linear(tgt, h * d_v, d)
    )
    parts = {
        "projections": N * (encoder_self + decoder_self + encoder_decoder),
        "attention": N
        * (attention(src_len, src_len) + attention(tgt_len, tgt_len) + attention(tgt_len, src_len)),
        # W_1 and W_2 of Eq. (2), in every encoder and decoder layer
        "feed_forward": N * 2 * (linear(src, d, d_ff) + linear(tgt, d, d_ff)),
        "generator": linear(tgt, d, vocab),
    }
    parts["total"] = sum(parts.values())
    return parts


def training_flops(config, vocab, batch, *, src_len, tgt_len):
    """FLOPs of one training step: forward, plus a backward pass that computes two products
    for each forward one (gradients of both factors), so 3x the forward's. Adam's update is
    element-wise and not counted."""
    return 3 * forward_flops(config, vocab, batch, src_len=src_len, tgt_len=tgt_len)["total"]


def recipe_step_flops(config, corpus):
    """FLOPs of a mean training step of a recipe (a TrainConfig) on an EncodedCorpus: the
    batches of its first epoch hold this many sentences on average, of these mean source and
    decoder lengths (real tokens: padding is left out of the useful work)."""
    batches = at.batch_by_tokens(corpus.lengths, config.max_tokens, config.seed)
    lengths = torch.tensor(corpus.lengths, dtype=torch.float64)
    src_len, tgt_len = lengths[:, 0].mean().item(), lengths[:, 1].mean().item() - 1
    sentences = sum(map(len, batches)) / len(batches)
    return training_flops(
        config.model, config.vocab_size, sentences, src_len=src_len, tgt_len=tgt_len
    )


# Dense (no structured sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, in FLOP/s.
# The first entry whose words all occur in the device name wins; others get no MFU.
BF16_PEAK_FLOPS = {
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,  # SXM, named e.g. "NVIDIA H100 80GB HBM3"
    "H200 NVL": 835e12,
    "H200": 989e12,
    "A100": 312e12,
}


def bf16_peak_flops(device_name):
    """The bf16 dense peak of a GPU from its name, or None when it is not in the table."""
    for words, peak in BF16_PEAK_FLOPS.items():
        if all(word.lower() in device_name.lower() for word in words.split()):
            return peak
    return None


def real_token_flops(config, vocab, lengths, *, indices):
    """Training FLOPs of one step on these pairs for their real tokens: each pair at its own
    lengths (source with </s>; the decoder reads <s> y_1 ... y_m, one fewer than the target
    ids), so padding adds nothing. Equal to training_flops for pairs of equal lengths."""
    return sum(
        training_flops(config, vocab, 1, src_len=lengths[i][0], tgt_len=lengths[i][1] - 1)
        for i in indices
    )
