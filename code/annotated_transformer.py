"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), annotated.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export` in chapters/, in the order of _toc.yml; change a chapter, then run
`python code/export.py` (or `python code/export.py --execute`, which also re-executes).
"""

import contextlib
import copy
import gzip
import math
import pathlib
from dataclasses import KW_ONLY, dataclass, fields, replace

import sacrebleu
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from torch import nn

from checks import InputError, check_rules, is_positive_int, numeric, positive_int
from safe_files import atomic_file

# --------------------------------------------------------------------------------------
# 3.1 Encoder and Decoder Stacks, from chapters/03_1_encoder_decoder_stacks.ipynb
# --------------------------------------------------------------------------------------

class EncoderDecoder(nn.Module):
    """§3.1, Figure 1: the encoder maps the source symbols (x_1..x_n) to a sequence of
    continuous representations, the memory z; given z, the decoder produces the target
    one symbol at a time, auto-regressively.

    forward(src (batch, seq_src), tgt (batch, seq_tgt), src_mask (batch, 1, seq_src),
    tgt_mask (batch, seq_tgt, seq_tgt)) -> decoder states (batch, seq_tgt, d_model);
    `generator` turns them into log-probabilities.
    """

    def __init__(self, encoder, decoder, src_embed, *, tgt_embed, generator):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(self, src, tgt, src_mask, tgt_mask):
        memory = self.encode(src, src_mask)
        return self.decode(memory, src_mask, tgt, tgt_mask=tgt_mask)

    def encode(self, src, src_mask):
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory, src_mask, tgt, *, tgt_mask):
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)


def clones(module, N):
    """N independent (deep) copies of `module`: the N = 6 identical layers of §3.1."""
    return nn.ModuleList(copy.deepcopy(module) for _ in range(N))


class SublayerConnection(nn.Module):
    """§3.1 and §5.4: the output of each sub-layer is LayerNorm(x + Dropout(Sublayer(x))).

    That is post-LN, the paper's arrangement and the default. pre_norm=True gives the
    later pre-LN variant, x + Dropout(Sublayer(LayerNorm(x))), which the stacks then
    close with one final LayerNorm.
    """

    def __init__(self, d_model, dropout, pre_norm=False):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x, sublayer):
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """§3.1: multi-head self-attention, then a position-wise feed-forward network,
    each wrapped in a SublayerConnection. (batch, seq, d_model) -> same shape."""

    def __init__(self, d_model, self_attn, feed_forward, *, dropout, pre_norm=False):
        super().__init__()
        self.d_model = d_model
        self.pre_norm = pre_norm
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(d_model, dropout, pre_norm), 2)

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class Encoder(nn.Module):
    """§3.1: a stack of N identical encoder layers."""

    def __init__(self, layer, N):
        super().__init__()
        self.layers = clones(layer, N)
        # Post-LN layers already end in a LayerNorm; pre-LN ones leave the residual
        # stream un-normalised, so only they need a final one.
        self.norm = nn.LayerNorm(layer.d_model) if layer.pre_norm else nn.Identity()

    def forward(self, x, mask):
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class DecoderLayer(nn.Module):
    """§3.1: masked self-attention, encoder-decoder attention over the memory, and a
    feed-forward network, each wrapped in a SublayerConnection. (batch, seq, d_model) ->
    same shape."""

    def __init__(self, d_model, self_attn, src_attn, *, feed_forward, dropout, pre_norm=False):
        super().__init__()
        self.d_model = d_model
        self.pre_norm = pre_norm
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(d_model, dropout, pre_norm), 3)

    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))
        x = self.sublayer[1](x, lambda x: self.src_attn(x, memory, memory, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class Decoder(nn.Module):
    """§3.1: a stack of N identical decoder layers."""

    def __init__(self, layer, N):
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = nn.LayerNorm(layer.d_model) if layer.pre_norm else nn.Identity()

    def forward(self, x, memory, src_mask, tgt_mask):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


def subsequent_mask(size, device=None):
    """§3.1: position i of the decoder may attend to positions <= i only.
    Returns a bool tensor (1, size, size) on `device`, True where attending is allowed."""
    return torch.tril(torch.ones(1, size, size, dtype=torch.bool, device=device))


# --------------------------------------------------------------------------------------
# 3.2.1 Scaled Dot-Product Attention, from chapters/03_2_1_scaled_dot_product_attention.ipynb
# --------------------------------------------------------------------------------------

def attention(query, key, value, *, mask=None, dropout=None):
    """Eq. (1): Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, the reference version.

    query (..., seq_q, d_k), key (..., seq_k, d_k), value (..., seq_k, d_v); mask is
    boolean, broadcastable to (..., seq_q, seq_k), True where attending is allowed.
    Returns (output (..., seq_q, d_v), weights (..., seq_q, seq_k)).
    """
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        # -inf rather than -1e9: -1e9 overflows float16 (its largest value is 65504)
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if mask is not None:
        # a query that may attend to nothing (an empty source) gets zero weights, not 0/0 = NaN
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value, weights


# --------------------------------------------------------------------------------------
# 3.2.2 Multi-Head Attention, from chapters/03_2_2_multi_head_attention.ipynb
# --------------------------------------------------------------------------------------

class MultiHeadedAttention(nn.Module):
    """§3.2.2: MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), the h projections stacked in one matrix.

    query (batch, seq_q, d_model), key and value (batch, seq_k, d_model), mask bool (batch,
    1 or seq_q, seq_k), True where attending is allowed -> (batch, seq_q, d_model). fused:
    Eq. (1) by torch's scaled_dot_product_attention, else by the reference `attention`,
    which keeps its weights in `self.weights`. A query that sees nothing outputs zeros.
    """

    def __init__(self, h, d_model, dropout=0.0, *, fused=True, d_k=None, d_v=None):
        super().__init__()
        self.h, self.d_k, self.d_v = h, d_k or d_model // h, d_v or d_model // h
        # The paper's projections are plain matrices W (no bias), as in tensor2tensor.
        self.w_q = nn.Linear(d_model, h * self.d_k, bias=False)
        self.w_k = nn.Linear(d_model, h * self.d_k, bias=False)
        self.w_v = nn.Linear(d_model, h * self.d_v, bias=False)
        self.w_o = nn.Linear(h * self.d_v, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.fused = fused
        self.weights = None

    def forward(self, query, key, value, mask=None):
        query = self.split_heads(self.w_q(query), self.d_k)  # (batch, h, seq_q, d_k)
        key = self.split_heads(self.w_k(key), self.d_k)  # (batch, h, seq_k, d_k)
        value = self.split_heads(self.w_v(value), self.d_v)  # (batch, h, seq_k, d_v)
        if mask is not None:
            if mask.dtype != torch.bool:  # the fused path would add a float mask to the scores
                raise TypeError("mask must be a bool tensor, True where attending is allowed")
            mask = mask.unsqueeze(1)  # one mask for all heads
        if self.fused:
            p = self.dropout.p if self.training else 0.0
            x = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=p)
            if mask is not None:  # as in `attention`: a query that sees nothing outputs zeros
                x = x.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
            self.weights = None
        else:
            x, weights = attention(query, key, value, mask=mask, dropout=self.dropout)
            self.weights = weights.detach()
        # Concat(head_1, ..., head_h): (batch, h, seq_q, d_v) -> (batch, seq_q, h * d_v)
        return self.w_o(x.transpose(1, 2).flatten(2))

    def split_heads(self, x, d):
        """(batch, seq, h * d) -> (batch, h, seq, d): the h projections side by side."""
        return x.view(x.size(0), -1, self.h, d).transpose(1, 2)


# --------------------------------------------------------------------------------------
# 3.2.3 Applications of Attention in our Model, from chapters/03_2_3_applications_of_attention.ipynb
# --------------------------------------------------------------------------------------

def padding_mask(tokens, pad_id):
    """(batch, seq) token ids -> (batch, 1, seq) bool, True at real tokens. Used by encoder
    self-attention and by encoder-decoder attention, so no query attends to padding."""
    return (tokens != pad_id).unsqueeze(-2)


def target_mask(tgt, pad_id):
    """(batch, seq) target ids -> (batch, seq, seq) bool for masked decoder
    self-attention: neither padding nor later positions may be attended to."""
    return padding_mask(tgt, pad_id) & subsequent_mask(tgt.size(-1), tgt.device)


# --------------------------------------------------------------------------------------
# 3.3 Position-wise Feed-Forward Networks, from chapters/03_3_position_wise_feed_forward.ipynb
# --------------------------------------------------------------------------------------

class PositionwiseFeedForward(nn.Module):
    """Eq. (2): FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, the same two linear maps at every
    position. (batch, seq, d_model) -> same shape, through d_ff hidden units.

    dropout acts on the hidden ReLU units; the paper names no such dropout, so the
    default is 0 (the Annotated Transformer uses P_drop here)."""

    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu()))


# --------------------------------------------------------------------------------------
# 3.4 Embeddings and Softmax, from chapters/03_4_embeddings_and_softmax.ipynb
# --------------------------------------------------------------------------------------

class Embeddings(nn.Module):
    """§3.4: learned embeddings of size d_model, multiplied by sqrt(d_model).
    (batch, seq) token ids -> (batch, seq, d_model)."""

    def __init__(self, d_model, vocab):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        self.d_model = d_model
        self.reset_parameters()

    def reset_parameters(self):
        # std d_model^-0.5, so that after the sqrt(d_model) below embeddings have unit scale
        nn.init.normal_(self.embedding.weight, std=self.d_model**-0.5)

    def forward(self, tokens):
        return self.embedding(tokens) * math.sqrt(self.d_model)


class Generator(nn.Module):
    """§3.4: the pre-softmax linear transformation and softmax that turn decoder states
    (batch, seq, d_model) into next-token log-probabilities (batch, seq, vocab)."""

    def __init__(self, d_model, vocab):
        super().__init__()
        # no bias, so that this matrix can be the embedding matrix itself (weight sharing)
        self.projection = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x):
        return F.log_softmax(self.projection(x), dim=-1)


# --------------------------------------------------------------------------------------
# 3.5 Positional Encoding, from chapters/03_5_positional_encoding.ipynb
# --------------------------------------------------------------------------------------

def positional_encoding(max_len, d_model):
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i / d_model)), PE(pos, 2i+1) = cos(same).
    Returns the (max_len, d_model) float32 table; d_model is even (ModelConfig checks it),
    as dimensions come in (sin, cos) pairs."""
    # float64, so the table is exact to float32 even at pos ~ 10^4
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    wavelength = 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.empty(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position / wavelength)
    table[:, 1::2] = torch.cos(position / wavelength)
    return table.float()


class PositionalEncoding(nn.Module):
    """§3.5 and §5.4: adds the sinusoidal table to the embeddings, then dropout.
    (batch, seq, d_model) -> same shape; seq may not exceed max_len."""

    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.make_table(max_len, d_model)

    def make_table(self, max_len, d_model):
        # a buffer moves with .to(device) but is no parameter; not saved, as it is a formula
        self.register_buffer("table", positional_encoding(max_len, d_model), persistent=False)

    @property
    def max_len(self):
        return self.table.size(0)

    def forward(self, x, offset=0):
        # offset: the position of x's first row, so that a decoder fed one token at a time
        # (the back-matter page "Fast decoding"), reusing what earlier steps computed,
        # adds its own position's encoding
        seq = x.size(1)
        if offset + seq > self.max_len:
            raise InputError(
                f"sequence of length {offset + seq} is longer than the positional table "
                f"(max_len={self.max_len}); build the model with a larger max_len"
            )
        return self.dropout(x + self.table[offset : offset + seq])


class LearnedPositionalEmbedding(PositionalEncoding):
    """Table 3 row (E): a trained (max_len, d_model) table instead of the sinusoids, added to
    the embeddings, then dropout, as PositionalEncoding does. (batch, seq, d_model) -> same."""

    def make_table(self, max_len, d_model):
        self.table = nn.Parameter(torch.empty(max_len, d_model))
        self.reset_parameters()

    def reset_parameters(self):
        # the root-mean-square of the sinusoids' components, so neither term swamps the other
        nn.init.normal_(self.table, std=2**-0.5)


# --------------------------------------------------------------------------------------
# 3.6 (ours) The Full Model, from chapters/03_6_full_model.ipynb
# --------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The architecture's hyperparameters, named as in Table 3: the base model's by default.

    Attributes:
        N: identical layers in the encoder and in the decoder (§3.1)
        d_model: width of every sub-layer's output and of the embeddings (§3.1)
        d_ff: inner width of the position-wise feed-forward network (§3.3)
        h: attention heads (§3.2.2)
        d_k: width of each head's queries and keys (default d_model / h)
        d_v: width of each head's values (default d_model / h)
        dropout: residual dropout on sub-layer outputs and embedding sums (§5.4)
        max_len: rows of the positional table: the longest sequence the model reads
        share_embeddings: one matrix for the embeddings and the output projection (§3.4; off)
        pre_norm: LayerNorm before each sub-layer instead of after (not the paper's)
        fused: PyTorch's fused attention kernel instead of the reference Eq. (1)
        positions: "sinusoidal" (§3.5) or "learned" (Table 3 row E)
        attention_dropout: dropout on attention weights (beyond §5.4; §6.3 mentions it)
        relu_dropout: dropout inside the feed-forward network (beyond §5.4)
    """

    N: int = 6
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8
    d_k: int | None = None
    d_v: int | None = None
    dropout: float = 0.1
    max_len: int = 5000
    share_embeddings: bool = False
    pre_norm: bool = False
    fused: bool = True
    positions: str = "sinusoidal"
    attention_dropout: float = 0.0
    relu_dropout: float = 0.0

    def rules(self):
        """{field: (what it must be, a test)}, which check_rules reads (TrainConfig's too)."""
        count = ("a positive integer", is_positive_int)
        width = ("a positive integer or None (d_model / h)", lambda v: v is None or count[1](v))
        probability = ("a probability in [0, 1)", lambda v: numeric(v) and 0 <= v < 1)
        shape = "'sinusoidal' (§3.5) or 'learned' (Table 3 row E)"
        return (
            dict.fromkeys(("N", "d_model", "d_ff", "h", "max_len"), count)
            | dict.fromkeys(("d_k", "d_v"), width)
            | {"positions": (shape, lambda v: v in ("sinusoidal", "learned"))}
            | dict.fromkeys(("dropout", "attention_dropout", "relu_dropout"), probability)
        )

    def __post_init__(self):
        check_rules(self)  # each field on its own, then how they fit together
        if (self.d_k is None or self.d_v is None) and self.d_model % self.h:
            raise InputError(
                f"d_model={self.d_model} is not divisible by h={self.h}: the paper uses "
                f"d_k = d_v = d_model / h; pick an h that divides d_model or set d_k and d_v"
            )
        if self.d_model % 2:
            raise InputError(f"d_model={self.d_model} must be even for the sinusoids (§3.5)")


BASE = ModelConfig()
BIG = replace(BASE, d_model=1024, d_ff=4096, h=16, dropout=0.3)
# small enough to train for a few minutes on two CPU cores
SMALL = replace(BASE, N=2, d_model=256, d_ff=1024, h=4)


def build_model(src_vocab, tgt_vocab, config=BASE):
    """The full Transformer of Figure 1 from a ModelConfig; see make_model."""
    positive_int("src_vocab", src_vocab)
    positive_int("tgt_vocab", tgt_vocab)
    if config.share_embeddings and src_vocab != tgt_vocab:
        raise InputError(
            f"share_embeddings=True ties both embeddings to one matrix, so it needs one "
            f"shared vocabulary, but src_vocab={src_vocab} != tgt_vocab={tgt_vocab}; "
            f"build a joint vocabulary (§5.1) or set share_embeddings=False"
        )
    c = config  # the hyperparameters (Harvard's c = copy.deepcopy is `copied` here)
    sizes = {"fused": c.fused, "d_k": c.d_k, "d_v": c.d_v}
    attn = MultiHeadedAttention(c.h, c.d_model, c.attention_dropout, **sizes)
    ff = PositionwiseFeedForward(c.d_model, c.d_ff, c.relu_dropout)
    encoding = PositionalEncoding if c.positions == "sinusoidal" else LearnedPositionalEmbedding
    position = encoding(c.d_model, c.dropout, c.max_len)
    copied, layer = copy.deepcopy, {"dropout": c.dropout, "pre_norm": c.pre_norm}
    model = EncoderDecoder(
        Encoder(EncoderLayer(c.d_model, copied(attn), copied(ff), **layer), c.N),
        Decoder(
            DecoderLayer(c.d_model, copied(attn), copied(attn), feed_forward=copied(ff), **layer),
            c.N,
        ),
        nn.Sequential(Embeddings(c.d_model, src_vocab), copied(position)),
        tgt_embed=nn.Sequential(Embeddings(c.d_model, tgt_vocab), copied(position)),
        generator=Generator(c.d_model, tgt_vocab),
    )
    # after the deep copies, so that no two layers start with the same matrices
    model.apply(initialise)
    if c.share_embeddings:
        # §3.4: one matrix for both embeddings and the pre-softmax linear transformation
        shared = model.src_embed[0].embedding.weight
        model.tgt_embed[0].embedding.weight = shared
        model.generator.projection.weight = shared
    model.config = c
    return model


def initialise(module):
    """Each module's own initialisation: Xavier-uniform for the weights of linear maps (as
    the Annotated Transformer), the tables' own reset_parameters for the embeddings (§3.4)
    and learned positions (Table 3 row E). Biases and layer norms keep PyTorch's defaults."""
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
    elif isinstance(module, Embeddings | LearnedPositionalEmbedding):
        module.reset_parameters()


def make_model(src_vocab, tgt_vocab, N=6, *, d_model=512, d_ff=2048, h=8, dropout=0.1, **options):
    """The Transformer with the familiar Annotated Transformer keywords. Any other ModelConfig
    field (share_embeddings, fused, pre_norm, max_len, d_k, d_v, ...) is a keyword too."""
    config = ModelConfig(N=N, d_model=d_model, d_ff=d_ff, h=h, dropout=dropout, **options)
    return build_model(src_vocab, tgt_vocab, config)


@contextlib.contextmanager
def use_fused_attention(model, fused=True):
    """Inside the block, every attention layer of `model` takes the fused or reference path."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadedAttention)]
    saved = [layer.fused for layer in layers]
    try:
        for layer in layers:
            layer.fused = fused
        yield model
    finally:
        for layer, was in zip(layers, saved):
            layer.fused = was


def count_parameters(model):
    """Number of distinct trainable parameters (a shared matrix counts once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------
# 5 Training, from chapters/05_training.ipynb
# --------------------------------------------------------------------------------------

MULTI30K_SPLITS = {"train": "train", "val": "val", "test2016": "test_2016_flickr"}  # file stems


def read_multi30k(folder, split, src_lang="de", *, tgt_lang="en"):
    """§5.1 on Multi30k: the (source, target) sentence pairs of one split (train: 29000,
    val: 1014, test2016: 1000), read from its two aligned .gz files in `folder`."""
    if split not in MULTI30K_SPLITS:
        raise InputError(f"split must be one of {sorted(MULTI30K_SPLITS)}, got {split!r}")
    if {src_lang, tgt_lang} != {"de", "en"}:
        raise InputError(
            "src_lang and tgt_lang must be 'de' and 'en', in either order, got "
            f"src_lang={src_lang!r}, tgt_lang={tgt_lang!r}"
        )
    sides = []
    for lang in (src_lang, tgt_lang):
        path = pathlib.Path(folder) / f"{MULTI30K_SPLITS[split]}.{lang}.gz"
        with gzip.open(path, "rt", encoding="utf-8") as file:
            sides.append([line.rstrip("\n") for line in file])
    return list(zip(*sides, strict=True))  # the published files are aligned line by line


PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]  # ids 0, 1, 2, 3 in this order
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)


def train_bpe(pairs, vocab_size=8000):
    """§5.1: one byte-pair encoding shared by source and target, learned from both sides of
    the training pairs. Same pairs, same vocabulary."""
    if not isinstance(vocab_size, int) or vocab_size <= len(SPECIAL_TOKENS):
        raise InputError(
            f"vocab_size must be an integer > {len(SPECIAL_TOKENS)}, got {vocab_size!r}"
        )
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.NFC()
    # ▁ marks word starts, so decoding restores the spaces exactly; punctuation stays apart
    # so that "Holz." and "Holz" share a token
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation(behavior="isolated")]
    )
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    tokenizer.train_from_iterator((sentence for pair in pairs for sentence in pair), trainer)
    return tokenizer


def load_tokenizer(path):
    return Tokenizer.from_file(str(path))


def encode_pairs(pairs, tokenizer):
    """Sentence pairs -> (source ids, target ids) with </s> on the source and <s> ... </s>
    around the target (the decoder's input is the target shifted right, §3.1)."""
    sources = tokenizer.encode_batch([src for src, _ in pairs])
    targets = tokenizer.encode_batch([tgt for _, tgt in pairs])
    return [(s.ids + [EOS_ID], [BOS_ID] + t.ids + [EOS_ID]) for s, t in zip(sources, targets)]


def pad_ids(sequences, pad_id=PAD_ID):
    """Lists of token ids -> one (len(sequences), longest) tensor, padded with pad_id."""
    return nn.utils.rnn.pad_sequence(
        [torch.tensor(ids) for ids in sequences], batch_first=True, padding_value=pad_id
    )


@dataclass
class Batch:
    """One training batch: source, the shifted target the decoder reads (tgt_in), the tokens
    it must predict (tgt_y), both masks, and the number of real target tokens."""

    src: torch.Tensor  # (batch, seq_src)
    tgt_in: torch.Tensor  # (batch, seq_tgt): <s> y_1 ... y_{m-1}
    tgt_y: torch.Tensor  # (batch, seq_tgt): y_1 ... y_m </s>
    _: KW_ONLY  # the rest by name
    src_mask: torch.Tensor  # (batch, 1, seq_src)
    tgt_mask: torch.Tensor  # (batch, seq_tgt, seq_tgt)
    ntokens: int | torch.Tensor

    @classmethod
    def from_tensors(cls, src, tgt, ntokens=None, *, pad_id=PAD_ID):
        """A Batch from padded source and target ids (the target with <s> and </s>);
        ntokens, the real target tokens, counted if not given."""
        tgt_in, tgt_y = tgt[:, :-1], tgt[:, 1:]
        if ntokens is None:
            ntokens = (tgt_y != pad_id).sum()
        src_mask, tgt_mask = padding_mask(src, pad_id), target_mask(tgt_in, pad_id)
        return cls(src, tgt_in, tgt_y, src_mask=src_mask, tgt_mask=tgt_mask, ntokens=ntokens)

    @classmethod
    def from_ids(cls, pairs, pad_id=PAD_ID):
        """Pad a non-empty list of (source ids, target ids) into one Batch."""
        src, tgt = (pad_ids([pair[side] for pair in pairs], pad_id) for side in (0, 1))
        return cls.from_tensors(src, tgt, sum(len(t) - 1 for _, t in pairs), pad_id=pad_id)


def batch_by_tokens(lengths, max_tokens, seed=0, *, shuffle=True):
    """§5.1: "Sentence pairs were batched together by approximate sequence length."
    lengths: (source length, target length) per pair. Returns lists of pair indices whose
    padded source and padded target each hold at most max_tokens tokens (a pair longer than
    that gets a batch of its own). Pairs are sorted by length (ties broken at random by
    `seed`), cut greedily, and the batches shuffled."""
    generator = torch.Generator().manual_seed(seed)
    jitter = torch.rand(len(lengths), generator=generator).tolist()
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i][0], lengths[i][1], jitter[i]))
    batches, current, longest_src, longest_tgt = [], [], 0, 0
    for i in order:
        src_len, tgt_len = lengths[i]
        grown_src, grown_tgt = max(longest_src, src_len), max(longest_tgt, tgt_len)
        if current and (len(current) + 1) * max(grown_src, grown_tgt) > max_tokens:
            batches.append(current)
            current, grown_src, grown_tgt = [], src_len, tgt_len
        current.append(i)
        longest_src, longest_tgt = grown_src, grown_tgt
    batches.append(current)
    if shuffle:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


class EncodedCorpus:
    """Sentence pairs encoded once: all sources and all targets padded into two tensors,
    with each pair's (source length, target length). batch(indices) cuts a Batch from them."""

    def __init__(self, data, pad_id=PAD_ID):
        self.lengths = [(len(s), len(t)) for s, t in data]
        self.pad_id = pad_id
        self.src, self.tgt = (pad_ids([pair[side] for pair in data], pad_id) for side in (0, 1))

    @classmethod
    def from_pairs(cls, pairs, tokenizer):
        return cls(encode_pairs(pairs, tokenizer))

    def __len__(self):
        return len(self.lengths)

    def target_tokens(self, indices):
        """Real target tokens of these pairs: what the loss is averaged over."""
        return sum(self.lengths[i][1] - 1 for i in indices)

    def batch(self, indices):
        """The Batch of these pairs, cut from the tables to their longest source and target."""
        rows = torch.tensor(indices, device=self.src.device)
        src_len, tgt_len = (max(self.lengths[i][side] for i in indices) for side in (0, 1))
        src, tgt = self.src[rows, :src_len], self.tgt[rows, :tgt_len]
        return Batch.from_tensors(src, tgt, self.target_tokens(indices), pad_id=self.pad_id)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The recipe of §5 for one training run: the architecture and how it is trained.

    Attributes:
        model: the architecture (a ModelConfig, chapter 3.6)
        vocab_size: size of the BPE vocabulary shared by both languages (§5.1: about 37000)
        max_tokens: source and target tokens per batch (§5.1: about 25000 each in the paper)
        warmup_steps: steps of linear warm-up in Eq. (3) (§5.3: 4000)
        lr_factor: a factor on the learning rate of Eq. (3) (the paper: 1)
        weight_decay: decoupled weight decay of AdamW (the paper: 0, which is Adam)
        smoothing: label smoothing epsilon_ls (§5.4: 0.1)
        seed: seeds the initial weights, the batch order and dropout
        max_steps: updates to train for (§5.2: 100000 for the base model)
    """

    model: ModelConfig = replace(SMALL, share_embeddings=True)
    vocab_size: int = 8000
    max_tokens: int = 2000
    warmup_steps: int = 4000
    lr_factor: float = 1.0
    weight_decay: float = 0.0
    smoothing: float = 0.1
    seed: int = 0
    max_steps: int = 1000

    def rules(self):
        """{field: (what it must be, a test)}; a subclass adds the rules of its own fields."""

        rules = {  # every integer field, a subclass's too, is a count
            f.name: ("a positive integer", is_positive_int) for f in fields(self) if f.type is int
        }
        rules["seed"] = ("an integer >= 0", lambda v: type(v) is int and v >= 0)
        rules["lr_factor"] = ("a positive finite number", lambda v: numeric(v) and 0 < v < math.inf)
        in_0_1 = ("in [0, 1)", lambda v: numeric(v) and 0 <= v < 1)
        rules["weight_decay"] = rules["smoothing"] = in_0_1
        return rules

    def __post_init__(self):
        check_rules(self)  # as ModelConfig's


def rate(step, d_model, lr_factor=1.0, *, warmup_steps=4000):
    """Eq. (3): lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), scaled by
    `lr_factor`; step 0 counts as step 1 (the formula is undefined at 0)."""
    step = max(step, 1)
    return lr_factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def make_optimizer(model, d_model, lr_factor=1.0, *, warmup_steps=4000, weight_decay=0.0, **adamw):
    """§5.3: AdamW(β1 = 0.9, β2 = 0.98, ε = 1e-9) with the learning rate of Eq. (3); with
    weight_decay=0 (the paper's) it is Adam. The scheduler's k-th step (k = 0, 1, ...)
    sets the rate of update k + 1. Returns (optimizer, scheduler)."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=weight_decay, **adamw
    )  # adamw: options beyond the paper's (the fused, capturable AdamW of CUDA graphs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: rate(k + 1, d_model, lr_factor, warmup_steps=warmup_steps)
    )
    return optimizer, scheduler


class LabelSmoothing(nn.Module):
    """§5.4: label smoothing of value `smoothing` as Szegedy et al. (2016) define it: the
    target is 1 - smoothing on the correct token plus smoothing / size on every token;
    positions whose target is pad_id contribute nothing. forward(log-probs (n, size),
    target (n,)) -> summed KL divergence from that distribution to the prediction."""

    def __init__(self, size, pad_id, smoothing=0.0):
        super().__init__()
        self.size, self.pad_id, self.smoothing = size, pad_id, smoothing

    def target_distribution(self, target, dtype=torch.float32):
        uniform = self.smoothing / self.size
        dist = torch.full((target.size(0), self.size), uniform, dtype=dtype, device=target.device)
        dist.scatter_(1, target.unsqueeze(1), 1.0 - self.smoothing + uniform)
        return dist.masked_fill((target == self.pad_id).unsqueeze(1), 0.0)

    def forward(self, log_probs, target):
        dist = self.target_distribution(target, log_probs.dtype)
        return nn.functional.kl_div(log_probs, dist, reduction="sum")


def label_smoothed_loss(logits, target, smoothing, *, pad_id=PAD_ID):
    """LabelSmoothing's fast path, summed over the positions whose target is not padding:
    one fused cross-entropy from the logits to the smoothed target. It equals
    LabelSmoothing's KL divergence plus the smoothed target's entropy per token."""
    logits = logits.flatten(0, -2)  # float16/bfloat16 logits are scored in float32
    return F.cross_entropy(
        logits.to(torch.promote_types(logits.dtype, torch.float32)),
        target.flatten(),
        ignore_index=pad_id,
        label_smoothing=smoothing,
        reduction="sum",
    )


def forward_loss(model, batch, smoothing):
    """(label-smoothed loss, negative log-likelihood), each summed over real target tokens."""
    states = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
    logits = model.generator.projection(states)
    loss = label_smoothed_loss(logits, batch.tgt_y, smoothing)
    if smoothing == 0:
        return loss, loss.detach()
    with torch.no_grad():
        return loss, label_smoothed_loss(logits, batch.tgt_y, 0.0)


def train_step(model, batch, optimizer, *, scheduler, smoothing):
    """One update (§5.3): the loss averaged over the batch's real target tokens, backward,
    Adam's step and the schedule's. Returns [loss, nll] summed over the batch."""
    loss, nll = forward_loss(model, batch, smoothing)
    (loss / batch.ntokens).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return torch.stack([loss.detach(), nll])


def fit(config, corpus, vocab, *, schedule=None):
    """§5 as a plain loop: train a model of config.model on an EncodedCorpus for
    config.max_steps updates. Returns (model, loss per target token of every update)."""
    torch.manual_seed(config.seed)
    model = build_model(vocab, vocab, config.model)
    adam = {"warmup_steps": config.warmup_steps, "weight_decay": config.weight_decay}
    optimizer, scheduler = make_optimizer(model, config.model.d_model, config.lr_factor, **adam)
    if schedule:  # schedule(step): a rate other than Eq. (3)'s, as the warm-up ablation tries
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: schedule(k + 1))
    losses, epoch = [], 0
    while len(losses) < config.max_steps:
        for indices in batch_by_tokens(corpus.lengths, config.max_tokens, config.seed + epoch):
            batch = corpus.batch(indices)
            sums = train_step(
                model, batch, optimizer, scheduler=scheduler, smoothing=config.smoothing
            )
            losses.append(sums[0].item() / batch.ntokens)
            if len(losses) == config.max_steps:
                break
        epoch += 1
    return model, losses


@torch.no_grad()
def validation_loss(model, corpus, max_tokens=4000):
    """Cross-entropy per real target token, without smoothing, over an EncodedCorpus whose
    tables are where the model is; math.exp of it is the perplexity. The mode is restored."""
    training, total = model.training, 0.0
    model.eval()
    for indices in batch_by_tokens(corpus.lengths, max_tokens, shuffle=False):
        total += forward_loss(model, corpus.batch(indices), 0.0)[1]
    model.train(training)
    return float(total) / corpus.target_tokens(range(len(corpus)))


def copy_task_pairs(n, vocab, length, *, generator):
    """Synthetic pairs whose target is the source: random symbols from 4..vocab-1."""
    data = torch.randint(4, vocab, (n, length), generator=generator).tolist()
    return [(seq + [EOS_ID], [BOS_ID] + seq + [EOS_ID]) for seq in data]


def output_limits(src_mask, max_len=None):
    """The most tokens each sentence may produce: max_len, or by default the paper's
    "input length + 50" (§6.1), counting the source's real (unpadded) tokens."""
    if max_len is None:
        return src_mask.reshape(src_mask.size(0), -1).sum(-1) + 50
    return torch.full((src_mask.size(0),), positive_int("max_len", max_len), device=src_mask.device)


def next_log_probs(model, memory, src_mask, *, ys):
    """log P(next token | source, prefix) for each prefix of ys (rows, t): the decoder of
    chapter 3 on the whole prefix. memory and src_mask hold one row, or one row per prefix."""
    rows = ys.size(0)
    memory, src_mask = memory.expand(rows, -1, -1), src_mask.expand(rows, -1, -1)
    out = model.decode(memory, src_mask, ys, tgt_mask=subsequent_mask(ys.size(1), ys.device))
    return model.generator(out[:, -1])


@torch.no_grad()  # decoding picks tokens: nothing to differentiate
def greedy_decode(model, src, src_mask, *, max_len=None, start_symbol=BOS_ID, end_symbol=EOS_ID):
    """Auto-regressive decoding (§3): append the most probable next token, one position at a
    time, until every sentence has produced end_symbol or its length limit (output_limits).
    src (batch, seq), src_mask (batch, 1, seq) -> (batch, 1 + produced) ids that start with
    start_symbol; after a sentence ends, its row is padded with PAD_ID."""
    limits = output_limits(src_mask, max_len)
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), start_symbol, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for t in range(int(limits.max())):
        next_token = next_log_probs(model, memory, src_mask, ys=ys).argmax(dim=-1)
        next_token = next_token.masked_fill(done, PAD_ID)
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)
        done |= (next_token == end_symbol) | (t + 1 >= limits)
        if done.all():
            break
    return ys


# --------------------------------------------------------------------------------------
# 6.1 Machine Translation, from chapters/06_1_machine_translation.ipynb
# --------------------------------------------------------------------------------------

def length_penalty(length, alpha):
    """The length penalty of Wu et al. (2016), which §6.1 uses with alpha = 0.6:
    lp(Y) = ((5 + |Y|) / (5 + 1))^alpha. Hypotheses are ranked by log P(Y) / lp(Y)."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()  # decoding picks tokens: nothing to differentiate
def beam_search(
    model,
    src,
    src_mask,
    *,
    beam_size=4,
    alpha=0.6,
    max_len=None,
    start_symbol=BOS_ID,
    end_symbol=EOS_ID,
):
    """§6.1: beam search for one sentence, src (1, seq), with beam_size hypotheses and length
    penalty alpha, stopping when no live hypothesis can still beat the best finished one.
    Returns (1, 1 + length) ids of the best finished hypothesis, from start_symbol."""
    k = positive_int("beam_size", beam_size)
    limit = int(output_limits(src_mask, max_len)[0])
    memory = model.encode(src, src_mask)
    ys = torch.full((1, 1), start_symbol, dtype=torch.long, device=src.device)  # live prefixes
    scores = torch.zeros(1, device=src.device)  # their log P
    best, best_score = None, -math.inf  # the best finished hypothesis and log P / lp
    for length in range(1, limit + 1):  # tokens after this step, the end included
        log_probs = next_log_probs(model, memory, src_mask, ys=ys).float()  # (rows, vocab)
        candidates = (scores.unsqueeze(1) + log_probs).flatten()
        top_scores, index = candidates.topk(min(2 * k, candidates.numel()))
        beam = []  # (row, token, log P) of the extensions that go on
        for score, i in zip(top_scores.tolist(), index.tolist()):
            row, token = divmod(i, log_probs.size(1))
            if token == end_symbol or length == limit:  # finished: ranked by log P / lp
                ranked = score / length_penalty(length, alpha)
                if ranked > best_score:
                    best, best_score = torch.cat([ys[row], ys.new_tensor([token])]), ranked
            else:
                beam.append((row, token, score))
            if len(beam) == k:
                break
        if not beam or best_score >= beam[0][2] / length_penalty(limit, alpha):
            break  # log P only falls as a hypothesis grows; lp is largest at the limit
        rows, tokens, beam_scores = zip(*beam)
        ys = torch.cat([ys[list(rows)], ys.new_tensor(tokens).unsqueeze(1)], dim=1)
        scores = torch.tensor(beam_scores, device=src.device)
    return best.unsqueeze(0)


def decode_batch(model, src, src_mask, *, beam_size=4, alpha=0.6):
    """The paper's decoding of a batch (§6.1): greedy_decode for beam_size 1, otherwise
    beam_search sentence by sentence. -> (batch, 1 + longest) ids, padded with PAD_ID."""
    if beam_size == 1:
        return greedy_decode(model, src, src_mask)
    outputs = [
        beam_search(model, src[i : i + 1], src_mask[i : i + 1], beam_size=beam_size, alpha=alpha)[0]
        for i in range(src.size(0))
    ]
    return pad_ids([out.tolist() for out in outputs]).to(src.device)


CHECKPOINT_FORMAT = 3  # every checkpoint records it; a resume refuses another


def save_checkpoint(path, payload):
    """torch.save of a payload stamped with CHECKPOINT_FORMAT, written whole or not at all
    (atomic_file: a temporary file beside `path`, renamed onto it once complete)."""
    with atomic_file(path, "wb") as file:
        torch.save({**payload, "format": CHECKPOINT_FORMAT}, file)


def read_checkpoint(path):
    """A checkpoint's payload (tensors and plain data only); errors name the file."""
    if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; train one with code/train.py")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        complete = isinstance(payload, dict) and {"config", "model", "tokenizer"} <= payload.keys()
        problem = None if complete else "it holds no config, model and tokenizer"
    except Exception as error:  # torch's messages can fill a page: keep the first sentence
        first = str(error).partition("\n")[0].partition(". ")[0]
        problem = type(error).__name__ + (f": {first}" if first else "")
    if problem:
        raise InputError(
            f"{path} cannot be read as a checkpoint ({problem}): it is damaged or not a "
            f"checkpoint written by train; use another snapshot of the run"
        )
    return payload


def check_device(device):
    """Refuse a device this machine lacks before any work is done."""
    try:
        problem = None
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            problem = "this PyTorch sees no GPU (torch.cuda.is_available() is False); use "
            problem += "device='cpu' or install a CUDA build of PyTorch"
    except RuntimeError:
        problem = "it is not a device: use cpu, cuda or cuda:N"
    if problem:
        raise InputError(f"device={device!r}: {problem}")


def translator_from(payload, device="cpu"):
    """(model in evaluation mode on `device`, tokenizer) from a payload read_checkpoint read."""
    check_device(device)
    tokenizer = Tokenizer.from_str(payload["tokenizer"])
    vocab = tokenizer.get_vocab_size()
    model = build_model(vocab, vocab, ModelConfig(**payload["config"]["model"]))
    model.load_state_dict(payload["model"])
    return model.to(device).eval(), tokenizer


def load_checkpoint(path, device="cpu"):
    """A trained model, in evaluation mode on `device`, and its tokenizer, from any
    checkpoint `train` wrote (checkpoint.pt or a snapshot checkpoint-<step>.pt) or from
    average_checkpoints. Returns (model, tokenizer): what `translate` needs."""
    check_device(device)  # before the file is read
    return translator_from(read_checkpoint(path), device)


def average_checkpoints(paths):
    """§6.1: "a single model obtained by averaging the last 5 checkpoints". The element-wise
    mean of the weights of several checkpoints of one run, returned as a checkpoint payload
    (save it with save_checkpoint, load it with load_checkpoint)."""
    paths = [pathlib.Path(p) for p in paths]
    if not paths:
        raise InputError("average_checkpoints needs at least one checkpoint path")
    payloads = [read_checkpoint(p) for p in paths]
    for path, payload in zip(paths[1:], payloads[1:]):
        differ = [key for key in ("config", "tokenizer") if payload[key] != payloads[0][key]]
        if differ:
            raise InputError(
                f"{path} and {paths[0]} have a different {' and '.join(differ)}: they come "
                f"from different runs, and only checkpoints of one run can be averaged"
            )

    def mean(name, tensor):  # float64 sums: the order does not matter
        return torch.stack([p["model"][name].double() for p in payloads]).mean(0).to(tensor.dtype)

    weights = once_per_tensor(payloads[-1]["model"], mean)
    steps = [p.get("step") for p in payloads]
    last = {key: payloads[-1][key] for key in ("config", "tokenizer")}
    return last | {"step": steps[-1], "averaged_steps": steps, "model": weights}


def once_per_tensor(weights, change):
    """{name: change(name, tensor)} for a state dict, `change` called once per tensor: tied
    weights (§3.4), one tensor under several names, stay one tensor."""
    changed = {}
    for name, tensor in weights.items():
        if tensor.data_ptr() not in changed:
            changed[tensor.data_ptr()] = change(name, tensor)
    return {name: changed[tensor.data_ptr()] for name, tensor in weights.items()}


def translate(
    model, tokenizer, sentences, *, beam_size=4, alpha=0.6, batch_size=64, decode=decode_batch
):
    """Translate source sentences (a list of str) into detokenized strings, with the
    paper's decoding by default (§6.1: beam 4, alpha 0.6, output length at most input
    length + 50); beam_size=1 is greedy decoding. An empty (or all-blank) sentence
    translates to "". Characters the vocabulary has never seen become <unk> in the input,
    and special tokens never appear in the output. decode: how a batch is decoded
    (decode_batch's arguments; the fast one of the Fast decoding page gives the same)."""
    if isinstance(sentences, str):
        raise TypeError("translate takes a list of sentences; wrap a single one: [sentence]")
    positive_int("beam_size", beam_size)
    positive_int("batch_size", batch_size)
    if not (isinstance(alpha, int | float) and 0 <= alpha < math.inf):
        raise InputError(f"alpha must be a finite number >= 0, got {alpha!r}")
    encoded = encode_sentences(model, tokenizer, sentences)
    results = [""] * len(sentences)
    order = sorted(encoded, key=lambda i: len(encoded[i]))  # similar lengths, little padding
    device = next(model.parameters()).device
    model.eval()
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = pad_ids([encoded[i] for i in chunk]).to(device)
        src_mask = padding_mask(src, PAD_ID)
        out = decode(model, src, src_mask, beam_size=beam_size, alpha=alpha)
        for row, i in enumerate(chunk):
            results[i] = tokenizer.decode(out[row].tolist(), skip_special_tokens=True)
    return results


def encode_sentences(model, tokenizer, sentences):
    """{i: ids of sentence i, then </s>} for the sentences that are not blank. A sentence of
    n tokens needs n rows of the source's positional table and n + 50 of the target's (the
    output may be 50 tokens longer than the input): a longer one is refused."""
    tables = model.src_embed[1].max_len, model.tgt_embed[1].max_len
    longest = min(tables[0], tables[1] - 50)
    encoded = {}
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(f"sentence {i} is a {type(sentence).__name__}, not a str")
        if sentence.strip():
            encoded[i] = tokenizer.encode(sentence).ids + [EOS_ID]
            n = len(encoded[i])
            if n > longest:
                fits = f"at most {longest} tokens fit" if longest > 0 else "no sentence fits"
                problem = (
                    f"is {n} tokens long and needs positional tables of {n} (source) and "
                    f"{n + 50} (target) rows, as the output may be 50 tokens longer than the "
                    f"input; this model's have {tables[0]} and {tables[1]}, so {fits}"
                )
                error = InputError(f"sentence {i} {problem}")
                error.index, error.problem = i, problem  # for callers that number their own way
                raise error
    return encoded


def evaluate_bleu(
    model, tokenizer, pairs, *, beam_size=4, alpha=0.6, batch_size=64, decode=decode_batch
):
    """Translate the sources of (source, reference) pairs and score them with sacreBLEU
    (Post, 2018): `bleu` on detokenized, cased text (the standard, with its
    signature), and `bleu_lowercase`, case-insensitive, closer to the lowercased tokenized
    BLEU most Multi30k papers report. `length_ratio`: the hypotheses' length over the
    references' (sacreBLEU's tokens), which sets BLEU's brevity penalty when below 1."""
    sources = [s for s, _ in pairs]
    options = {"beam_size": beam_size, "alpha": alpha, "batch_size": batch_size}
    hypotheses = translate(model, tokenizer, sources, decode=decode, **options)
    references = [[t for _, t in pairs]]
    cased, lowercase = sacrebleu.BLEU(), sacrebleu.BLEU(lowercase=True)
    score = cased.corpus_score(hypotheses, references)
    lower = lowercase.corpus_score(hypotheses, references)
    return {
        "bleu": round(score.score, 2),
        "signature": str(cased.get_signature()),
        "bleu_lowercase": round(lower.score, 2),
        "signature_lowercase": str(lowercase.get_signature()),
        "length_ratio": round(score.sys_len / score.ref_len, 4),
        "hypotheses": hypotheses,
    }


def decoding_label(beam_size, alpha=0.6):
    """How tables of results name a decoding: "greedy" for beam_size 1, otherwise for
    example "beam 4, alpha 0.6"."""
    return "greedy" if beam_size == 1 else f"beam {beam_size}, alpha {alpha}"


# --------------------------------------------------------------------------------------
# 6.2 Model Variations, from chapters/06_2_model_variations.ipynb
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Table3Row:
    """One row of Table 3: its group (base, A to E, big), what it changes relative to the
    base row (ModelConfig fields, plus `smoothing`, a TrainConfig field), and the paper's
    results on newstest2013: perplexity per word-piece, BLEU, parameters in millions (None
    where the paper leaves the cell blank: as the base model), training steps."""

    group: str
    changes: dict
    _: KW_ONLY  # the paper's figures by name
    ppl: float
    bleu: float
    params_m: float | None = None
    steps: int = 100_000

    @property
    def label(self):
        """The row as the book names it, e.g. "(A) h=1, d_k=512, d_v=512"."""
        if self.group in ("base", "big"):
            return self.group
        return f"({self.group}) " + ", ".join(f"{k}={v}" for k, v in self.changes.items())


TABLE3_ROWS = (
    Table3Row("base", {}, ppl=4.92, bleu=25.8, params_m=65),
    Table3Row("A", {"h": 1, "d_k": 512, "d_v": 512}, ppl=5.29, bleu=24.9),
    Table3Row("A", {"h": 4, "d_k": 128, "d_v": 128}, ppl=5.00, bleu=25.5),
    Table3Row("A", {"h": 16, "d_k": 32, "d_v": 32}, ppl=4.91, bleu=25.8),
    Table3Row("A", {"h": 32, "d_k": 16, "d_v": 16}, ppl=5.01, bleu=25.4),
    Table3Row("B", {"d_k": 16}, ppl=5.16, bleu=25.1, params_m=58),
    Table3Row("B", {"d_k": 32}, ppl=5.01, bleu=25.4, params_m=60),
    Table3Row("C", {"N": 2}, ppl=6.11, bleu=23.7, params_m=36),
    Table3Row("C", {"N": 4}, ppl=5.19, bleu=25.3, params_m=50),
    Table3Row("C", {"N": 8}, ppl=4.88, bleu=25.5, params_m=80),
    Table3Row("C", {"d_model": 256, "d_k": 32, "d_v": 32}, ppl=5.75, bleu=24.5, params_m=28),
    Table3Row("C", {"d_model": 1024, "d_k": 128, "d_v": 128}, ppl=4.66, bleu=26.0, params_m=168),
    Table3Row("C", {"d_ff": 1024}, ppl=5.12, bleu=25.4, params_m=53),
    Table3Row("C", {"d_ff": 4096}, ppl=4.75, bleu=26.2, params_m=90),
    Table3Row("D", {"dropout": 0.0}, ppl=5.77, bleu=24.6),
    Table3Row("D", {"dropout": 0.2}, ppl=4.95, bleu=25.5),
    Table3Row("D", {"smoothing": 0.0}, ppl=4.67, bleu=25.3),
    Table3Row("D", {"smoothing": 0.2}, ppl=5.47, bleu=25.7),
    Table3Row("E", {"positions": "learned"}, ppl=4.92, bleu=25.7),
    Table3Row(
        "big",
        {"d_model": 1024, "d_ff": 4096, "h": 16, "dropout": 0.3},
        ppl=4.33,
        bleu=26.4,
        params_m=213,
        steps=300_000,
    ),
)


def validation_perplexity(model, data, max_tokens=2000):
    """Table 3's PPL: exp of the mean negative log-likelihood per target token (per BPE
    piece, </s> included) given the source and the reference prefix, without label
    smoothing and with padding excluded. data: (source ids, target ids) pairs as
    encode_pairs returns them, scored in batches of at most max_tokens tokens a side (or
    the longest sentence). Returns a float; the model is left in the mode it was in."""
    return math.exp(validation_loss(model, EncodedCorpus(data), max_tokens))
