"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), annotated.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export` in chapters/, in the order of _toc.yml; change a chapter, then run
`python code/export.py` (or `python code/export.py --execute`, which also re-executes).
"""


# --------------------------------------------------------------------------------------
# 3.1 Encoder and Decoder Stacks, from chapters/03_1_encoder_decoder_stacks.ipynb
# --------------------------------------------------------------------------------------

import copy
import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


class EncoderDecoder(nn.Module):
    """§3.1, Figure 1: the encoder maps the source symbols (x_1..x_n) to a sequence of
    continuous representations, the memory z; given z, the decoder produces the target
    one symbol at a time, auto-regressively.

    forward(src (batch, seq_src), tgt (batch, seq_tgt), src_mask (batch, 1, seq_src),
    tgt_mask (batch, seq_tgt, seq_tgt)) -> decoder states (batch, seq_tgt, d_model);
    `generator` turns them into log-probabilities.
    """

    def __init__(self, encoder, decoder, src_embed, tgt_embed, generator):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(self, src, tgt, src_mask, tgt_mask):
        memory = self.encode(src, src_mask)
        return self.decode(memory, src_mask, tgt, tgt_mask)

    def encode(self, src, src_mask):
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory, src_mask, tgt, tgt_mask):
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

    def __init__(self, d_model, self_attn, feed_forward, dropout, pre_norm=False):
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

    def __init__(self, d_model, self_attn, src_attn, feed_forward, dropout, pre_norm=False):
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

def attention(query, key, value, mask=None, dropout=None):
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

    def __init__(self, h, d_model, dropout=0.0, fused=True, d_k=None, d_v=None):
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
            x, weights = attention(query, key, value, mask, self.dropout)
            self.weights = weights.detach()
        # Concat(head_1, ..., head_h): (batch, h, seq_q, d_v) -> (batch, seq_q, h * d_v)
        return self.w_o(x.transpose(1, 2).flatten(2))

    def split_heads(self, x, d):
        """(batch, seq, h * d) -> (batch, h, seq, d): the h projections side by side."""
        return x.view(x.size(0), -1, self.h, d).transpose(1, 2)


# --------------------------------------------------------------------------------------
# 3.2.3 Applications of Attention in our Model, from chapters/03_2_3_applications_of_attention.ipynb
# --------------------------------------------------------------------------------------

def padding_mask(tokens, pad_idx):
    """(batch, seq) token ids -> (batch, 1, seq) bool, True at real tokens. Used by encoder
    self-attention and by encoder-decoder attention, so no query attends to padding."""
    return (tokens != pad_idx).unsqueeze(-2)


def target_mask(tgt, pad_idx):
    """(batch, seq) target ids -> (batch, seq, seq) bool for masked decoder
    self-attention: neither padding nor later positions may be attended to."""
    return padding_mask(tgt, pad_idx) & subsequent_mask(tgt.size(-1), tgt.device)


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
            raise ValueError(
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

@dataclass(frozen=True)
class ModelConfig:
    """The architecture's hyperparameters, named as in Table 3; defaults are the base model.

    Attributes:
        N: identical layers in the encoder and in the decoder (§3.1)
        d_model: width of every sub-layer's output and of the embeddings (§3.1)
        d_ff: inner width of the position-wise feed-forward network (§3.3)
        h: attention heads (§3.2.2)
        d_k: width of each head's queries and keys (default d_model / h)
        d_v: width of each head's values (default d_model / h)
        dropout: residual dropout on sub-layer outputs and embedding sums (§5.4)
        max_len: rows of the positional table: the longest sequence the model reads
        share_embeddings: one matrix for both embeddings and the output projection (§3.4)
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

    def __post_init__(self):
        for name in ("N", "d_model", "d_ff", "h", "max_len", "d_k", "d_v"):
            value = getattr(self, name)
            if value is None and name in ("d_k", "d_v"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if (self.d_k is None or self.d_v is None) and self.d_model % self.h:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by h={self.h}: the paper uses "
                f"d_k = d_v = d_model / h; pick an h that divides d_model or set d_k and d_v"
            )
        if self.d_model % 2:
            raise ValueError(
                f"d_model={self.d_model} must be even for the sinusoidal encoding (§3.5)"
            )
        if self.positions not in ("sinusoidal", "learned"):
            raise ValueError(
                f"positions must be 'sinusoidal' (§3.5) or 'learned' (Table 3 row E), "
                f"got {self.positions!r}"
            )
        for name in ("dropout", "attention_dropout", "relu_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1), got {value!r}")


BASE = ModelConfig()
BIG = replace(BASE, d_model=1024, d_ff=4096, h=16, dropout=0.3)
# small enough to train for a few minutes on two CPU cores
SMALL = replace(BASE, N=2, d_model=256, d_ff=1024, h=4)


def build_model(src_vocab, tgt_vocab, config=BASE):
    """The full Transformer of Figure 1 from a ModelConfig; see make_model."""
    for name, value in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if config.share_embeddings and src_vocab != tgt_vocab:
        raise ValueError(
            f"share_embeddings=True ties both embeddings to one matrix, so it needs one "
            f"shared vocabulary, but src_vocab={src_vocab} != tgt_vocab={tgt_vocab}; "
            f"build a joint vocabulary (§5.1) or set share_embeddings=False"
        )
    c = config
    attn = MultiHeadedAttention(c.h, c.d_model, c.attention_dropout, c.fused, c.d_k, c.d_v)
    ff = PositionwiseFeedForward(c.d_model, c.d_ff, c.relu_dropout)
    encoding = PositionalEncoding if c.positions == "sinusoidal" else LearnedPositionalEmbedding
    position = encoding(c.d_model, c.dropout, c.max_len)
    copied = copy.deepcopy
    model = EncoderDecoder(
        Encoder(EncoderLayer(c.d_model, copied(attn), copied(ff), c.dropout, c.pre_norm), c.N),
        Decoder(
            DecoderLayer(c.d_model, copied(attn), copied(attn), copied(ff), c.dropout, c.pre_norm),
            c.N,
        ),
        nn.Sequential(Embeddings(c.d_model, src_vocab), copied(position)),
        nn.Sequential(Embeddings(c.d_model, tgt_vocab), copied(position)),
        Generator(c.d_model, tgt_vocab),
    )
    # after the deep copies, so that no two layers start from the same weights
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


def make_model(
    src_vocab,
    tgt_vocab,
    N=6,
    d_model=512,
    d_ff=2048,
    h=8,
    dropout=0.1,
    share_embeddings=False,
    fused=True,
    **options,
):
    """The Transformer with the familiar Annotated Transformer keywords. Other ModelConfig
    fields (pre_norm, max_len, d_k, d_v, ...) go in **options."""
    config = ModelConfig(
        N=N,
        d_model=d_model,
        d_ff=d_ff,
        h=h,
        dropout=dropout,
        share_embeddings=share_embeddings,
        fused=fused,
        **options,
    )
    return build_model(src_vocab, tgt_vocab, config)


def use_fused_attention(model, fused=True):
    """Switch every attention layer of `model` between the fused and reference paths."""
    for module in model.modules():
        if isinstance(module, MultiHeadedAttention):
            module.fused = fused
    return model


def count_parameters(model):
    """Number of distinct trainable parameters (a shared matrix counts once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------
# 5 Training, from chapters/05_training.ipynb
# --------------------------------------------------------------------------------------

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]  # ids 0, 1, 2, 3 in this order
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)


def train_bpe(pairs, vocab_size=8000, path=None):
    """§5.1: one byte-pair encoding shared by source and target, learned from both sides of
    the training pairs. Saved to `path` (JSON) when given. Same pairs, same vocabulary."""
    if not isinstance(vocab_size, int) or vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(
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
    if path is not None:
        tokenizer.save(str(path))
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
    src_mask: torch.Tensor  # (batch, 1, seq_src)
    tgt_mask: torch.Tensor  # (batch, seq_tgt, seq_tgt)
    ntokens: int | torch.Tensor

    @classmethod
    def from_tensors(cls, src, tgt, ntokens=None, pad_id=PAD_ID):
        """A Batch from padded source and target ids (target with <s> and </s>). ntokens:
        the caller's count of real target tokens, else counted on the device, where it stays
        (an int() here would make the host wait for the device)."""
        tgt_in, tgt_y = tgt[:, :-1], tgt[:, 1:]
        if ntokens is None:
            ntokens = (tgt_y != pad_id).sum()
        masks = padding_mask(src, pad_id), target_mask(tgt_in, pad_id)
        return cls(src, tgt_in, tgt_y, *masks, ntokens)

    @classmethod
    def from_ids(cls, pairs, pad_id=PAD_ID):
        """Pad a non-empty list of (source ids, target ids) into one Batch."""
        src, tgt = (pad_ids([pair[side] for pair in pairs], pad_id) for side in (0, 1))
        return cls.from_tensors(src, tgt, sum(len(t) - 1 for _, t in pairs), pad_id)

    def to(self, device):
        tensors = (self.src, self.tgt_in, self.tgt_y, self.src_mask, self.tgt_mask)
        ntokens = self.ntokens
        if isinstance(ntokens, torch.Tensor):
            ntokens = ntokens.to(device)
        return Batch(*(t.to(device) for t in tensors), ntokens)


def batch_by_tokens(lengths, max_tokens, seed=0, shuffle=True):
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


def padding_fraction(batches, lengths):
    """Share of the padded (batch x longest) source+target cells that are padding."""
    real = padded = 0
    for batch in batches:
        for side in (0, 1):
            longest = max(lengths[i][side] for i in batch)
            real += sum(lengths[i][side] for i in batch)
            padded += longest * len(batch)
    return 1 - real / padded


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
        """Real target tokens of these pairs (what the loss is averaged over), on the host."""
        return sum(self.lengths[i][1] - 1 for i in indices)

    def to(self, device):
        """This corpus with its two tables on `device`; the lengths stay on the host, which
        needs them to know each batch's shape. Batches are then cut where the model is."""
        moved = copy.copy(self)
        moved.src, moved.tgt = self.src.to(device), self.tgt.to(device)
        return moved

    def batch(self, indices, device=None, multiple_of=1, rows=None):
        """The Batch of these pairs, cut to their longest source and target (rounded up to a
        multiple of `multiple_of`, which limits the shapes torch.compile sees), on `device`
        (default: the tables' device). rows: the same indices, already a tensor on the
        tables' device; given, the batch is cut without a copy from the host."""
        device = self.src.device if device is None else torch.device(device)
        if rows is None:
            rows = torch.tensor(indices, device=self.src.device)
        sides = []
        for side, table in enumerate((self.src, self.tgt)):
            longest = max(self.lengths[i][side] for i in indices) - side  # tgt: minus <s>/</s>
            longest = -(-longest // multiple_of) * multiple_of + side
            cut = table.narrow(1, 0, min(longest, table.size(1)))[rows]
            cut = F.pad(cut, (0, longest - cut.size(1)), value=self.pad_id)
            if cut.device.type == "cpu" and device.type == "cuda":
                cut = cut.pin_memory()  # the copy below then need not block
            sides.append(cut.to(device, non_blocking=True))
        return Batch.from_tensors(*sides, self.target_tokens(indices), self.pad_id)


import dataclasses

RUN_LENGTH_FIELDS = (
    *"max_steps max_seconds checkpoint_every keep_checkpoints".split(),
    *"eval_every bleu_sentences log_every".split(),
)


@dataclass(frozen=True)
class TrainConfig:
    """A training run besides its data: the architecture and the recipe of §5. The fields in
    RUN_LENGTH_FIELDS may change when a run is resumed; every other field must match.

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
        max_seconds: a time budget (0: none): the run ends at the last checkpoint that its
            pace so far puts within this many seconds of training
        checkpoint_every: save a checkpoint every this many steps
        keep_checkpoints: weight snapshots kept for averaging (§6.1 averages the last 5)
        eval_every: validation loss and BLEU every this many steps (given validation pairs)
        bleu_sentences: how many validation pairs (the first ones) are translated for BLEU
        log_every: read the loss from the device and log it every this many steps
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
    max_seconds: float = 0.0
    checkpoint_every: int = 500
    keep_checkpoints: int = 5
    eval_every: int = 500
    bleu_sentences: int = 200
    log_every: int = 10

    def __post_init__(self):
        def number(v):
            return isinstance(v, int | float) and not isinstance(v, bool)

        rules = {
            f.name: ("a positive integer", lambda v: type(v) is int and v > 0)
            for f in dataclasses.fields(self)
            if f.type is int
        }
        rules["seed"] = ("an integer >= 0", lambda v: type(v) is int and v >= 0)
        rules["lr_factor"] = ("a positive finite number", lambda v: number(v) and 0 < v < math.inf)
        in_0_1 = ("in [0, 1)", lambda v: number(v) and 0 <= v < 1)
        rules["weight_decay"] = rules["smoothing"] = in_0_1
        rules["max_seconds"] = ("a finite number >= 0", lambda v: number(v) and 0 <= v < math.inf)
        for name, (rule, holds) in rules.items():
            if not holds(getattr(self, name)):
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

    def identity(self):
        """The fields a checkpoint must agree on to be resumed."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in RUN_LENGTH_FIELDS}


MULTI30K_STEPS = 8000  # updates of the multi30k recipe's full run
PROFILES = {
    "tiny": TrainConfig(
        model=ModelConfig(N=1, d_model=32, d_ff=64, h=2, share_embeddings=True),
        vocab_size=200,
        max_tokens=200,
        warmup_steps=10,
        max_steps=6,
        checkpoint_every=3,
    ),
    "quick": TrainConfig(warmup_steps=200, max_steps=300, checkpoint_every=100, eval_every=100),
    "multi30k": TrainConfig(
        model=replace(SMALL, N=3, h=8, d_ff=512, share_embeddings=True),
        vocab_size=5000,
        warmup_steps=400,
        lr_factor=0.33,
        weight_decay=0.1,
        smoothing=0.2,
        max_steps=MULTI30K_STEPS,
        checkpoint_every=250,
        eval_every=250,
        bleu_sentences=500,
    ),
    # fifteen minutes on two CPU cores (chosen on val): multi30k's recipe with one layer less,
    # no dropout and half the batch; the reference attention is faster on a CPU for
    # sentences this short. As many steps as fit in 885 s of training (a margin under 900 s
    # for the pace to vary), ending at a snapshot; one every 100 steps, for averaging
    "fast": TrainConfig(
        model=replace(SMALL, N=2, h=8, d_ff=512, share_embeddings=True, dropout=0.0, fused=False),
        vocab_size=5000,
        max_tokens=1000,
        warmup_steps=400,
        lr_factor=0.33,
        weight_decay=0.1,
        smoothing=0.1,
        max_steps=6000,
        max_seconds=885.0,
        checkpoint_every=100,
        keep_checkpoints=10,
        eval_every=500,
        bleu_sentences=500,
    ),
    # the base architecture on one GPU: batches 4x multi30k's and a quarter of its steps,
    # but all of its 400 warm-up steps, which a 6-layer post-LN stack needs (§5.3)
    "base": TrainConfig(
        model=replace(BASE, share_embeddings=True),
        vocab_size=5000,
        max_tokens=8000,
        warmup_steps=400,
        lr_factor=0.23,
        weight_decay=0.1,
        smoothing=0.2,
        max_steps=MULTI30K_STEPS // 4,
        checkpoint_every=100,
        eval_every=100,
        bleu_sentences=500,
    ),
}


def apply_changes(config, changes):
    """`config` (a TrainConfig) with some fields changed: {name: value}, where a name is a
    TrainConfig field or a ModelConfig field (bare, "dropout", or "model.dropout")."""
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"model"}
    model_changes, train_changes = {}, {}
    for name, value in changes.items():
        bare = name.removeprefix("model.")
        if bare in model_fields and bare not in train_fields:
            model_changes[bare] = value
        elif name in train_fields:
            train_changes[name] = value
        else:
            raise ValueError(
                f"unknown field {name!r}: a change names a TrainConfig field "
                f"({', '.join(sorted(train_fields))}) or a ModelConfig field "
                f"({', '.join(sorted(model_fields))})"
            )
    return replace(config, model=replace(config.model, **model_changes), **train_changes)


def rate(step, model_size, factor=1.0, warmup=4000):
    """Eq. (3): lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), scaled by
    `factor`; step 0 counts as step 1 (the formula is undefined at 0)."""
    step = max(step, 1)
    return factor * model_size**-0.5 * min(step**-0.5, step * warmup**-1.5)


def make_optimizer(model, d_model, factor=1.0, warmup=4000, weight_decay=0.0):
    """§5.3: AdamW(β1 = 0.9, β2 = 0.98, ε = 1e-9) with the learning rate of Eq. (3); with
    weight_decay=0 (the paper's) it is Adam. The scheduler's k-th step (k = 0, 1, ...)
    sets the rate of update k + 1. Returns (optimizer, scheduler)."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: rate(k + 1, d_model, factor, warmup)
    )
    return optimizer, scheduler


class LabelSmoothing(nn.Module):
    """§5.4: label smoothing of value `smoothing` as Szegedy et al. (2016) define it: the
    target is 1 - smoothing on the correct token plus smoothing / size on every token;
    positions whose target is padding_idx contribute nothing. forward(log-probs (n, size),
    target (n,)) -> summed KL divergence from that distribution to the prediction."""

    def __init__(self, size, padding_idx, smoothing=0.0):
        super().__init__()
        self.size, self.padding_idx, self.smoothing = size, padding_idx, smoothing

    def target_distribution(self, target, dtype=torch.float32):
        uniform = self.smoothing / self.size
        dist = torch.full((target.size(0), self.size), uniform, dtype=dtype, device=target.device)
        dist.scatter_(1, target.unsqueeze(1), 1.0 - self.smoothing + uniform)
        return dist.masked_fill((target == self.padding_idx).unsqueeze(1), 0.0)

    def forward(self, log_probs, target):
        dist = self.target_distribution(target, log_probs.dtype)
        return nn.functional.kl_div(log_probs, dist, reduction="sum")


def label_smoothed_loss(logits, target, smoothing, pad_id=PAD_ID):
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


import contextlib


def unwrap(model):
    """The EncoderDecoder inside a DistributedDataParallel or torch.compile wrapper."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = model.module if hasattr(model, "module") else model._orig_mod
    return model


def forward_loss(model, batch, smoothing):
    """(label-smoothed loss, negative log-likelihood), each summed over real target tokens."""
    states = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
    logits = unwrap(model).generator.projection(states)
    loss = label_smoothed_loss(logits, batch.tgt_y, smoothing)
    if smoothing == 0:
        return loss, loss.detach()
    with torch.no_grad():
        return loss, label_smoothed_loss(logits, batch.tgt_y, 0.0)


def train_step(model, batch, optimizer, scheduler, scaler, smoothing, ntokens=None, amp=None):
    """One update (§5.3): the loss averaged over `ntokens` target tokens (the batch's own by
    default), backward, the optimizer's and the schedule's step. amp: an autocast dtype or
    None; scaler: a torch.amp.GradScaler (disabled unless amp is float16). Returns
    [loss, nll] summed over the batch, on the device."""
    precision = torch.autocast(batch.src.device.type, amp) if amp else contextlib.nullcontext()
    with precision:
        loss, nll = forward_loss(model, batch, smoothing)
    scaler.scale(loss / (ntokens or batch.ntokens)).backward()
    scale = scaler.get_scale() if scaler.is_enabled() else None
    scaler.step(optimizer)  # float16: skipped when a gradient overflowed,
    scaler.update()  # and then the scale is lowered
    optimizer.zero_grad(set_to_none=True)
    if scale is None or scaler.get_scale() >= scale:  # Eq. (3) counts the updates made
        scheduler.step()
    return torch.stack([loss.detach(), nll])


def fit(config, corpus, vocab):
    """§5 as a plain loop: train a model of config.model on an EncodedCorpus for
    config.max_steps updates. Returns (model, loss per target token of every update)."""
    torch.manual_seed(config.seed)
    model = build_model(vocab, vocab, config.model)
    d_model, decay = config.model.d_model, config.weight_decay
    optimizer, scheduler = make_optimizer(
        model, d_model, config.lr_factor, config.warmup_steps, decay
    )
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # float32: nothing to scale
    losses, epoch = [], 0
    while len(losses) < config.max_steps:
        for indices in batch_by_tokens(corpus.lengths, config.max_tokens, config.seed + epoch):
            batch = corpus.batch(indices)
            sums = train_step(model, batch, optimizer, scheduler, scaler, config.smoothing)
            losses.append(sums[0].item() / batch.ntokens)
            if len(losses) == config.max_steps:
                break
        epoch += 1
    return model, losses


def copy_task_pairs(n, vocab, length, generator):
    """Synthetic pairs whose target is the source: random symbols from 4..vocab-1."""
    data = torch.randint(4, vocab, (n, length), generator=generator).tolist()
    return [(seq + [EOS_ID], [BOS_ID] + seq + [EOS_ID]) for seq in data]


# --------------------------------------------------------------------------------------
# 6.1 Machine Translation, from chapters/06_1_machine_translation.ipynb
# --------------------------------------------------------------------------------------

def positive_int(name, value):
    """value, if it is a positive integer (a bool is not); otherwise a ValueError naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def output_limits(src_mask, max_len=None):
    """The most tokens each sentence may produce: max_len, or by default the paper's
    "input length + 50" (§6.1), counting the source's real (unpadded) tokens."""
    if max_len is None:
        return src_mask.reshape(src_mask.size(0), -1).sum(-1) + 50
    return torch.full((src_mask.size(0),), positive_int("max_len", max_len), device=src_mask.device)


class PrefixDecoder:
    """Decoding with the decoder of chapter 3: the whole prefix ys (rows, t) again at every
    step; rows may be k per sentence (beam search's hypotheses). next_log_probs -> (rows,
    vocab). KeyValueCache, the fast path (Fast decoding page), answers the same calls."""

    def __init__(self, model, memory, src_mask):
        self.model, self.memory, self.src_mask = model, memory, src_mask

    def next_log_probs(self, ys):
        group = ys.size(0) // self.memory.size(0)  # hypotheses per sentence
        memory, src_mask = (x.repeat_interleave(group, 0) for x in (self.memory, self.src_mask))
        out = self.model.decode(memory, src_mask, ys, subsequent_mask(ys.size(1), ys.device))
        return self.model.generator(out[:, -1])

    def slots(self, kept, parent, k):
        """Rows for beam search's kept candidates: rank order (this decoder keeps no rows)."""
        return torch.where(kept, kept.cumsum(-1) - 1, k)

    def follow(self, rows, moved):
        """Nothing to move: ys holds the prefixes, and every step reads them again."""


def start_decoding(model, src, src_mask, cache):
    """Encode the source once; return the decoder of each step, cached or plain."""
    decoder = KeyValueCache if cache else PrefixDecoder
    return decoder(model, model.encode(src, src_mask), src_mask)


@torch.no_grad()  # decoding picks tokens: nothing to differentiate
def greedy_decode(
    model, src, src_mask, max_len=None, start_symbol=BOS_ID, end_symbol=EOS_ID, cache=True
):
    """Auto-regressive decoding (§3): append the most probable next token, one position at a
    time, until every sentence has produced end_symbol or its length limit (output_limits).
    src (batch, seq), src_mask (batch, 1, seq) -> (batch, 1 + produced) ids that start with
    start_symbol; after a sentence ends, its row is padded with PAD_ID. cache=False runs the
    plain PrefixDecoder; cache=True the KeyValueCache of the Fast decoding page."""
    limits = output_limits(src_mask, max_len)
    decoder = start_decoding(model, src, src_mask, cache)
    ys = torch.full((src.size(0), 1), start_symbol, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for t in range(int(limits.max())):
        next_token = decoder.next_log_probs(ys).argmax(dim=-1).masked_fill(done, PAD_ID)
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)
        done |= (next_token == end_symbol) | (t + 1 >= limits)
        if done.all():
            break
    return ys


def length_penalty(length, alpha):
    """The length penalty of Wu et al. (2016), which §6.1 uses with alpha = 0.6:
    lp(Y) = ((5 + |Y|) / (5 + 1))^alpha. Hypotheses are ranked by log P(Y) / lp(Y)."""
    return ((5 + length) / 6) ** alpha


def best_extensions(scores, log_probs, k):
    """The 2k best one-token extensions of each sentence's hypotheses (scores (batch, rows),
    log P), best first -> their scores, the row each extends (parent) and its token."""
    batch, rows = scores.shape
    vocab = log_probs.size(-1)
    candidates = scores.unsqueeze(-1) + log_probs.float().view(batch, rows, vocab)
    top_scores, index = candidates.view(batch, -1).topk(min(2 * k, rows * vocab), dim=-1)
    return top_scores, index // vocab, index % vocab


def sort_candidates(top_scores, ends, done, k):
    """Walk down each sentence's candidates, best first, until k go on: those that end on
    the way (the end symbol, or the length limit) finish. -> kept, finishing (batch, 2k)."""
    valid = (top_scores != float("-inf")) & ~done.unsqueeze(1)
    going_on = valid & ~ends
    better_going_on = going_on.cumsum(dim=-1) - going_on.long()
    return going_on & (better_going_on < k), valid & ends & (better_going_on < k)


class FinishedHypotheses:
    """Per sentence, the best finished hypothesis so far: score log P / lp, tokens, length."""

    def __init__(self, batch, steps, device):
        self.score = torch.full((batch,), float("-inf"), dtype=torch.float64, device=device)
        self.tokens = torch.full((batch, steps), PAD_ID, dtype=torch.long, device=device)
        self.length = torch.zeros(batch, dtype=torch.long, device=device)

    def add(self, ys, rows, top_scores, tokens, finishing, alpha):
        """Keep each sentence's best candidate that finishes now if it beats the best so far."""
        length = ys.size(1)
        ranked = top_scores.double() / length_penalty(length, alpha)
        best, choice = ranked.masked_fill(~finishing, float("-inf")).max(dim=-1, keepdim=True)
        prefix = ys[rows.gather(1, choice).squeeze(1), 1:]
        ended = torch.cat([prefix, tokens.gather(1, choice)], dim=1)  # (batch, length)
        improved = best.squeeze(1) > self.score
        self.tokens[:, :length] = torch.where(improved[:, None], ended, self.tokens[:, :length])
        self.length = torch.where(improved, length, self.length)
        self.score = torch.where(improved, best.squeeze(1), self.score)

    def output(self, start_symbol):
        """(batch, 1 + longest) ids: start_symbol, each best hypothesis, PAD_ID after it."""
        width = int(self.length.max())
        start = torch.full_like(self.tokens[:, :1], start_symbol)
        return torch.cat([start, self.tokens[:, :width]], dim=1)


def fill_slots(slot, top_scores, tokens, rows, unchanged):
    """The next beam: kept candidate i goes to row slot[i] of its sentence's k (k: not kept);
    a row nothing fills keeps its unchanged prefix, scored -inf. -> scores, tokens, rows."""
    k = unchanged.size(1) - 1
    scores = top_scores.new_full((slot.size(0), k + 1), float("-inf")).scatter(1, slot, top_scores)
    new_tokens = torch.full_like(unchanged, PAD_ID).scatter(1, slot, tokens)
    new_rows = unchanged.scatter(1, slot, rows)
    return scores[:, :k], new_tokens[:, :k].flatten(), new_rows[:, :k].flatten()


@torch.no_grad()  # decoding picks tokens: nothing to differentiate
def beam_search(
    model,
    src,
    src_mask,
    max_len=None,
    start_symbol=BOS_ID,
    end_symbol=EOS_ID,
    beam_size=4,
    alpha=0.6,
    cache=True,
):
    """§6.1: beam search with beam_size hypotheses per sentence and length penalty alpha,
    batched over sentences; a sentence stops when no live hypothesis can still beat its best
    finished one, or at its length limit (output_limits). Inputs and output as greedy_decode.
    Rows b * k ... (b + 1) * k - 1 of ys hold sentence b's k hypotheses; each step waits for
    the device once (is every sentence done, which rows moved?)."""
    k, batch, device = positive_int("beam_size", beam_size), src.size(0), src.device
    limits = output_limits(src_mask, max_len)
    limit_penalty = length_penalty(limits.double(), alpha)  # the largest lp of each sentence
    decoder = start_decoding(model, src, src_mask, cache)
    ys = torch.full((batch, 1), start_symbol, dtype=torch.long, device=device)
    scores = torch.zeros(batch, 1, device=device)  # log P; at first one empty prefix each
    finished = FinishedHypotheses(batch, int(limits.max()), device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for length in range(1, int(limits.max()) + 1):  # tokens after this step, the end included
        per_sentence = scores.size(1)
        top_scores, parent, tokens = best_extensions(scores, decoder.next_log_probs(ys), k)
        first_row = torch.arange(batch, device=device).unsqueeze(1) * per_sentence
        rows = first_row + parent  # the row of ys each candidate extends
        ends = (tokens == end_symbol) | (length >= limits).unsqueeze(1)
        kept, finishing = sort_candidates(top_scores, ends, done, k)
        finished.add(ys, rows, top_scores, tokens, finishing, alpha)
        slot = decoder.slots(kept, parent, k)
        unchanged = first_row + torch.arange(k + 1, device=device).clamp(max=per_sentence - 1)
        scores, new_tokens, new_rows = fill_slots(slot, top_scores, tokens, rows, unchanged)
        # log P only falls as a hypothesis grows, and lp is largest at the length limit
        done |= ~kept.any(dim=-1) | (finished.score >= scores.max(-1).values / limit_penalty)
        # the step's one wait for the device: is every sentence done, and which rows moved
        moved = new_rows != torch.arange(new_rows.numel(), device=device)
        all_done, *moved = torch.cat([done.all().view(1), moved]).tolist()
        if all_done:
            break
        ys = torch.cat([ys[new_rows], new_tokens.unsqueeze(1)], dim=1)
        decoder.follow(new_rows, moved)
    return finished.output(start_symbol)


def load_checkpoint(path, device="cpu"):
    """A trained model, in evaluation mode on `device`, and its tokenizer, from any
    checkpoint `train` wrote (checkpoint.pt or a snapshot checkpoint-<step>.pt) or from
    average_checkpoints. Returns (model, tokenizer): what `translate` needs."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; train one with code/train.py")
    payload = read_checkpoint(path)
    config = ModelConfig(**payload["config"]["model"])
    tokenizer = Tokenizer.from_str(payload["tokenizer"])
    vocab = tokenizer.get_vocab_size()
    model = build_model(vocab, vocab, config)
    model.load_state_dict(payload["model"])
    return model.to(device).eval(), tokenizer


def average_checkpoints(paths):
    """§6.1: "a single model obtained by averaging the last 5 checkpoints". The element-wise
    mean of the weights of several checkpoints of one run, returned as a checkpoint payload
    (save it with save_checkpoint, load it with load_checkpoint)."""
    paths = [pathlib.Path(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint path")
    payloads = [read_checkpoint(p) for p in paths]
    for path, payload in zip(paths[1:], payloads[1:]):
        differ = [key for key in ("config", "tokenizer") if payload[key] != payloads[0][key]]
        if differ:
            raise ValueError(
                f"{path} and {paths[0]} have a different {' and '.join(differ)}: they come "
                f"from different runs, and only checkpoints of one run can be averaged"
            )
    weights = {
        # float64 for the sum, so the mean does not depend on the order of the checkpoints
        name: torch.stack([p["model"][name].double() for p in payloads]).mean(0).to(tensor.dtype)
        for name, tensor in payloads[-1]["model"].items()
    }
    steps = [p.get("step") for p in payloads]
    last = {key: payloads[-1][key] for key in ("config", "tokenizer")}
    return last | {"step": steps[-1], "averaged_steps": steps, "model": weights}


def translate(model, tokenizer, sentences, beam_size=4, alpha=0.6, batch_size=64):
    """Translate source sentences (a list of str) into detokenized strings, with the
    paper's decoding by default (§6.1: beam 4, alpha 0.6, output length at most input
    length + 50); beam_size=1 is greedy decoding. An empty (or all-blank) sentence
    translates to "". Characters the vocabulary has never seen become <unk> in the input,
    and special tokens never appear in the output."""
    if isinstance(sentences, str):
        raise TypeError("translate takes a list of sentences; wrap a single one: [sentence]")
    positive_int("beam_size", beam_size)
    positive_int("batch_size", batch_size)
    if not (isinstance(alpha, int | float) and 0 <= alpha < math.inf):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    encoded = encode_sentences(model, tokenizer, sentences)
    results = [""] * len(sentences)
    order = sorted(encoded, key=lambda i: len(encoded[i]))  # similar lengths, little padding
    device = next(model.parameters()).device
    model.eval()
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = pad_ids([encoded[i] for i in chunk]).to(device)
        src_mask = padding_mask(src, PAD_ID)
        if beam_size == 1:
            out = greedy_decode(model, src, src_mask)
        else:
            out = beam_search(model, src, src_mask, beam_size=beam_size, alpha=alpha)
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
                raise ValueError(
                    f"sentence {i} is {n} tokens long and needs positional tables of {n} "
                    f"(source) and {n + 50} (target) rows, as the output may be 50 tokens "
                    f"longer than the input; this model's have {tables[0]} and {tables[1]}, "
                    f"so {fits}"
                )
    return encoded


def evaluate_bleu(model, tokenizer, pairs, beam_size=4, alpha=0.6, batch_size=64):
    """Translate the sources of (source, reference) pairs and score them with sacreBLEU
    (Post, 2018): `bleu` on detokenized, cased text (the standard, with its
    signature), and `bleu_lowercase`, case-insensitive, closer to the lowercased tokenized
    BLEU most Multi30k papers report. `length_ratio`: the hypotheses' length over the
    references' (sacreBLEU's tokens), which sets BLEU's brevity penalty when below 1."""
    hypotheses = translate(model, tokenizer, [s for s, _ in pairs], beam_size, alpha, batch_size)
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
    Table3Row("base", {}, 4.92, 25.8, 65),
    Table3Row("A", {"h": 1, "d_k": 512, "d_v": 512}, 5.29, 24.9),
    Table3Row("A", {"h": 4, "d_k": 128, "d_v": 128}, 5.00, 25.5),
    Table3Row("A", {"h": 16, "d_k": 32, "d_v": 32}, 4.91, 25.8),
    Table3Row("A", {"h": 32, "d_k": 16, "d_v": 16}, 5.01, 25.4),
    Table3Row("B", {"d_k": 16}, 5.16, 25.1, 58),
    Table3Row("B", {"d_k": 32}, 5.01, 25.4, 60),
    Table3Row("C", {"N": 2}, 6.11, 23.7, 36),
    Table3Row("C", {"N": 4}, 5.19, 25.3, 50),
    Table3Row("C", {"N": 8}, 4.88, 25.5, 80),
    Table3Row("C", {"d_model": 256, "d_k": 32, "d_v": 32}, 5.75, 24.5, 28),
    Table3Row("C", {"d_model": 1024, "d_k": 128, "d_v": 128}, 4.66, 26.0, 168),
    Table3Row("C", {"d_ff": 1024}, 5.12, 25.4, 53),
    Table3Row("C", {"d_ff": 4096}, 4.75, 26.2, 90),
    Table3Row("D", {"dropout": 0.0}, 5.77, 24.6),
    Table3Row("D", {"dropout": 0.2}, 4.95, 25.5),
    Table3Row("D", {"smoothing": 0.0}, 4.67, 25.3),
    Table3Row("D", {"smoothing": 0.2}, 5.47, 25.7),
    Table3Row("E", {"positions": "learned"}, 4.92, 25.7),
    Table3Row(
        "big",
        {"d_model": 1024, "d_ff": 4096, "h": 16, "dropout": 0.3},
        4.33,
        26.4,
        213,
        300_000,
    ),
)


def validation_perplexity(model, data, max_tokens=2000):
    """Table 3's PPL: exp of the mean negative log-likelihood per target token (per BPE
    piece, </s> included) given the source and the reference prefix, without label
    smoothing and with padding excluded. data: (source ids, target ids) pairs as
    encode_pairs returns them, scored in batches of at most max_tokens tokens a side (or
    the longest sentence). Returns a float; the model is left in the mode it was in."""
    return math.exp(validation_loss(model, EncodedCorpus(data), max_tokens))


# --------------------------------------------------------------------------------------
# Engineering: runs that survive (ours), from chapters/engineering_runs.ipynb
# --------------------------------------------------------------------------------------

import gzip
import hashlib
import itertools
import json
import os
import pathlib
import platform
import shutil
import socket
import time
import typing
import urllib.request
import warnings
from dataclasses import field

import sacrebleu
from tqdm import tqdm


MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_SPLITS = {"train": "train", "val": "val", "test2016": "test_2016_flickr"}
# SHA-256 of the gzip files as published; a download or local copy that differs is refused
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}


class DatasetError(RuntimeError):
    """A data file is missing, corrupt or cannot be downloaded; the message says what to do."""


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_cache_dir():
    """Where downloads go: $XDG_CACHE_HOME (or ~/.cache)/annotated-transformer/multi30k."""
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "annotated-transformer" / "multi30k"


def download(url, path, sha256):
    """Fetch url to path, verified: the bytes go to a temporary file in the same folder,
    renamed into place only once their checksum matches; nothing else is left behind."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as file:
            shutil.copyfileobj(response, file)
        problem = None if sha256_of(part) == sha256 else f"its SHA-256 is not {sha256}"
        if problem is None:
            os.replace(part, path)
    except OSError as error:  # urllib's URLError is an OSError
        problem = str(error)
    finally:
        part.unlink(missing_ok=True)
    if problem:
        raise DatasetError(
            f"could not download {url} ({problem}); nothing was kept. Try again, or point "
            f"the loader at a verified local copy: set MULTI30K_DIR or pass data_dir"
        )
    return path


def multi30k_file(filename, data_dir=None, base_url=MULTI30K_URL):
    """The verified path of one Multi30k file: from data_dir (or $MULTI30K_DIR) when given,
    otherwise from the cache, downloading it there first if needed."""
    expected = MULTI30K_SHA256[filename]
    local = data_dir or os.environ.get("MULTI30K_DIR")
    if not local:
        path = default_cache_dir() / filename
        if path.is_file() and sha256_of(path) == expected:
            return path
        return download(base_url + filename, path, expected)
    path = pathlib.Path(local) / filename
    problem = "does not exist" if not path.is_file() else None
    if problem is None and sha256_of(path) != expected:
        problem = "has the wrong SHA-256: it is corrupt or not the published file"
    if problem:
        raise DatasetError(
            f"{path} {problem}; the local Multi30k copy (data_dir or MULTI30K_DIR={local}) "
            f"must hold {filename} with SHA-256 {expected}: download it from {base_url}{filename}"
        )
    return path


def load_multi30k(split, src_lang="de", tgt_lang="en", data_dir=None, base_url=MULTI30K_URL):
    """§5.1 on Multi30k: the aligned (source, target) sentence pairs of one split
    (train: 29000, val: 1014, test2016: 1000), each file verified against its SHA-256."""
    if split not in MULTI30K_SPLITS or {src_lang, tgt_lang} != {"de", "en"}:
        raise ValueError(
            f"split must be one of {sorted(MULTI30K_SPLITS)} and src_lang, tgt_lang 'de' and "
            f"'en' in either order; got split={split!r}, src_lang={src_lang!r}, "
            f"tgt_lang={tgt_lang!r}"
        )
    sides = []
    for lang in (src_lang, tgt_lang):
        path = multi30k_file(f"{MULTI30K_SPLITS[split]}.{lang}.gz", data_dir, base_url)
        with gzip.open(path, "rt", encoding="utf-8") as file:
            sides.append([line.rstrip("\n") for line in file])
    return list(zip(*sides, strict=True))  # the published files are aligned line by line


AMP_CHOICES = ("auto", "bf16", "fp16", "off", "fastest")
PRECISIONS = {None: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
AMP_OF_PRECISION = {"float32": "off", "bfloat16": "bf16", "float16": "fp16"}


def autocast_dtype(amp, device):
    """The autocast dtype that `amp` means on `device` (None: float32 throughout); for
    "fastest" on a CPU, see faster_precision."""
    if amp is None or amp == "off":
        return None
    if amp not in AMP_CHOICES:
        raise ValueError(f"amp must be one of {', '.join(AMP_CHOICES)}, got {amp!r}")
    device = torch.device(device)
    if amp in ("auto", "fastest"):
        if device.type != "cuda":
            return None
        return torch.bfloat16 if native_bf16(device) else torch.float16
    return torch.bfloat16 if amp == "bf16" else torch.float16


def native_bf16(device):
    """Whether `device` multiplies in bfloat16 natively: a GPU of compute capability 8.0
    (Ampere) or later, a CPU with AVX-512 BF16 or AMX. Elsewhere bfloat16 is emulated, and
    slower than float32 (torch.cuda.is_bf16_supported() says yes to an emulating T4)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    # torch's own cpuinfo, not mkldnn's check, which says yes to any AVX-512 CPU; these
    # helpers are private to torch: should they go, the answer is no
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):
        return False


def faster_precision(config, corpus, vocab, steps=3):
    """float32 (None) or bfloat16, whichever trains this recipe faster on this CPU: a
    scratch model takes one warm-up and `steps` timed updates in each, on the first
    batches of the run's first epoch (and without native bfloat16, float32 untimed). The
    random state is left as it was."""
    if not native_bf16("cpu"):
        return None
    plan = epoch_updates(corpus, config, epoch=0)[: steps + 1]
    batches = [corpus.batch(indices) for indices, *_ in plan]
    seconds = {}
    with torch.random.fork_rng():
        for amp in (None, torch.bfloat16):
            run = RunState.new(config, vocab, amp=amp)
            for i, batch in enumerate(batches):
                if i == 1:
                    started = time.perf_counter()
                args = run.optimizer, run.scheduler, run.scaler, config.smoothing
                train_step(run.model, batch, *args, amp=amp).tolist()
            seconds[amp] = time.perf_counter() - started
    return min(seconds, key=seconds.get)


def check_device(device):
    """Refuse a device this machine lacks before any work is done."""
    try:
        problem = None
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            problem = "this PyTorch sees no GPU (torch.cuda.is_available() is False); train "
            problem += "on device='cpu' or install a CUDA build of PyTorch"
    except RuntimeError:
        problem = "it is not a device: use cpu, cuda or cuda:N"
    if problem:
        raise ValueError(f"device={device!r}: {problem}")


def cpu_model():
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform knows of it."""
    try:
        with open("/proc/cpuinfo") as file:
            return next(line.split(":", 1)[1].strip() for line in file if "model name" in line)
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def hardware_description(device="cpu"):
    """One line naming the machine a result came from: GPU name, or CPU model and threads."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    threads = torch.get_num_threads()
    return f"{cpu_model()}, {threads} thread{'s' * (threads != 1)}, torch {torch.__version__}"


CHECKPOINT_FORMAT = 3  # checkpoints record it; another format is refused on resume


def save_checkpoint(path, payload):
    """torch.save to a temporary file beside `path`, then an atomic rename."""
    path = pathlib.Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path, data):
    """JSON written as atomically as a checkpoint (a reader never sees half a file)."""
    tmp = pathlib.Path(f"{path}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def read_checkpoint(path):
    """A checkpoint's payload (tensors and plain data only); errors name the file."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        complete = isinstance(payload, dict) and {"config", "model", "tokenizer"} <= payload.keys()
        problem = None if complete else "it holds no config, model and tokenizer"
    except Exception as error:  # torch's messages can fill a page: keep the first sentence
        first = str(error).partition("\n")[0].partition(". ")[0]
        problem = type(error).__name__ + (f": {first}" if first else "")
    if problem:
        raise ValueError(
            f"{path} cannot be read as a checkpoint ({problem}): it is damaged or not a "
            f"checkpoint written by train; use another snapshot of the run"
        )
    return payload


def snapshot_paths(out_dir):
    """The weight snapshots of a run, oldest first: out_dir/checkpoint-<step>.pt."""
    return sorted(pathlib.Path(out_dir).glob("checkpoint-*.pt"))


class RunFolderBusy(FileExistsError):
    """Another live process is training in this folder."""


class RunFolder:
    """with RunFolder(out, resume): out exists, holds no finished run unless resume, is
    locked by this process (out/.lock: host and pid), and holds no stale temporary files;
    owner=False (torchrun ranks > 0) touches nothing."""

    def __init__(self, out, resume=False, owner=True):
        self.out, self.resume, self.owner = pathlib.Path(out), resume, owner
        self.lock = self.out / ".lock"

    def __enter__(self):
        if not self.owner:
            return self
        if not self.resume and (self.out / "checkpoint.pt").exists():
            raise FileExistsError(
                f"{self.out / 'checkpoint.pt'} already exists; resume it (--resume) or "
                f"start the new run in another folder, so the earlier one is kept"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        me = f"{socket.gethostname()} {os.getpid()}"
        try:
            fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = self.lock.read_text().strip()
            host, _, pid = holder.partition(" ")
            if host != socket.gethostname() or process_alive(int(pid or 0)):
                raise RunFolderBusy(
                    f"{self.out} is in use by process {holder} (lock file {self.lock}); wait "
                    f"for it to finish or train into another folder"
                ) from None
            self.lock.write_text(me + "\n")  # the holder died: take the folder over
        else:
            with os.fdopen(fd, "w") as file:
                file.write(me + "\n")
        for stale in self.out.glob("*.tmp"):  # from a save that was killed
            stale.unlink()
        return self

    def __exit__(self, *exc):
        if self.owner:
            self.lock.unlink(missing_ok=True)


def process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


@dataclass
class RunState:
    """What a run has built and done so far: all that a checkpoint saves."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    step: int = 0
    epoch: int = 0
    position: int = 0  # updates of the current epoch already made
    tokens_seen: int = 0  # target tokens, all processes
    seconds: float = 0.0  # training time over all sessions, validation excluded
    history: list = field(default_factory=list)  # per step: loss, nll, lr, tokens
    validation: list = field(default_factory=list)  # per evaluation: step, seconds, figures

    @classmethod
    def new(cls, config, vocab, device="cpu", amp=None, cuda_graphs=False):
        """A fresh run: the model initialised with config.seed, AdamW with Eq. (3) (the
        capturable one of the CUDA graphs page when asked), and the gradient scaler
        (active only for float16 autocast)."""
        torch.manual_seed(config.seed)
        model = build_model(vocab, vocab, config.model).to(device)
        d_model, decay = config.model.d_model, config.weight_decay
        make = make_capturable_optimizer if cuda_graphs else make_optimizer
        optimizer, scheduler = make(model, d_model, config.lr_factor, config.warmup_steps, decay)
        scaler = torch.amp.GradScaler(torch.device(device).type, enabled=amp == torch.float16)
        return cls(model, optimizer, scheduler, scaler)


@dataclass
class RunSetup:
    """What stays fixed while a run trains: its recipe, folder, data and processes."""

    config: TrainConfig
    out: pathlib.Path
    tokenizer: Tokenizer
    corpus: EncodedCorpus
    val: tuple | None  # (EncodedCorpus of all val pairs, the pairs BLEU translates)
    device: str
    amp: torch.dtype | None
    rank: int = 0
    world: int = 1
    log: typing.Callable = print
    cuda_graphs: bool = False  # steps replayed as CUDA graphs (the CUDA graphs page)


def epoch_updates(corpus, config, epoch, world=1):
    """One epoch's updates, each a list of `world` batches (index lists), one per process,
    of max_tokens / world tokens a side; the order depends only on (seed, epoch)."""
    batches = batch_by_tokens(corpus.lengths, config.max_tokens // world, config.seed + epoch)
    return [batches[i : i + world] for i in range(0, len(batches) - world + 1, world)]


def distributed_rank_and_size():
    """(rank, world size) under torchrun's process group, (0, 1) in a single process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def gather_rng_states(device, world):
    """Every rank's random states (CPU, and its GPU's), gathered on all ranks."""
    state = {"cpu": torch.get_rng_state()}
    if torch.device(device).type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    if world == 1:
        return [state]
    states = [None] * world
    torch.distributed.all_gather_object(states, state)
    return states


def restore_rng_state(states, rank, world, device):
    """This rank's saved random state back in place; a different process count warns."""
    if len(states) != world:
        warnings.warn(
            f"the checkpoint was written by {len(states)} process(es) and resumes in {world}: "
            f"batches and dropout masks differ from an uninterrupted run from here on",
            stacklevel=2,
        )
    if rank >= len(states):
        return
    torch.set_rng_state(states[rank]["cpu"])
    if torch.device(device).type == "cuda":
        if "cuda" in states[rank]:
            torch.cuda.set_rng_state(states[rank]["cuda"], device)
        else:
            warnings.warn(
                "no GPU random state in the checkpoint: GPU dropout starts afresh", stacklevel=2
            )


def validation_loss(model, corpus, max_tokens=4000):
    """Cross-entropy per real target token, without smoothing, over an EncodedCorpus;
    math.exp of it is the perplexity. The model's train/eval mode is restored."""
    model = unwrap(model)
    device = next(model.parameters()).device
    training, total = model.training, torch.zeros((), device=device)
    model.eval()
    with torch.no_grad():
        for indices in batch_by_tokens(corpus.lengths, max_tokens, shuffle=False):
            total += forward_loss(model, corpus.batch(indices, device), 0.0)[1]
    model.train(training)
    return total.item() / corpus.target_tokens(range(len(corpus)))


def validate(model, corpus, pairs, tokenizer):
    """The validation figures logged during training and stored with each snapshot: the
    loss over the whole corpus and BLEU of greedy translations of `pairs`, mode restored."""
    model = unwrap(model)
    training, loss = model.training, validation_loss(model, corpus)
    hypotheses = translate(model, tokenizer, [src for src, _ in pairs], beam_size=1)
    model.train(training)
    return {
        "val_loss": round(loss, 4),
        "val_ppl": round(math.exp(loss), 2),
        "val_bleu": round(sacrebleu.corpus_bleu(hypotheses, [[r for _, r in pairs]]).score, 2),
        "bleu_sentences": len(pairs),
    }


def differing_fields(saved, wanted, prefix=""):
    """'name: saved -> wanted' for every field, nested ones dotted, that differs."""
    found = []
    for name in sorted(set(saved) | set(wanted)):
        a, b = saved.get(name, "<absent>"), wanted.get(name, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            found += differing_fields(a, b, f"{prefix}{name}.")
        elif a != b:
            found.append(f"{prefix}{name}: {a!r} -> {b!r}")
    return found


def checkpoint_to_resume(path, config, precision=None, cuda_graphs=False):
    """The payload of out/checkpoint.pt, refused if written in another format, with another
    recipe, in another precision (a name in PRECISIONS; None: take the checkpoint's), or
    with and without CUDA graphs (whose optimizer and schedule save other states)."""
    if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"no checkpoint at {path} to resume from; start without --resume")
    payload = read_checkpoint(path)
    saved = {"checkpoint format": payload.get("format", "<absent>"), **payload["config"]}
    saved["precision"] = payload.get("precision", "<absent>")
    saved["cuda_graphs"] = payload.get("cuda_graphs", False)
    wanted = {"checkpoint format": CHECKPOINT_FORMAT, **config.identity()}
    wanted["precision"] = saved["precision"] if precision is None else precision
    wanted["cuda_graphs"] = cuda_graphs
    differ = differing_fields(saved, wanted)
    if differ:
        hint = ""
        if saved["precision"] != wanted["precision"] and saved["precision"] in AMP_OF_PRECISION:
            hint = f" (amp={AMP_OF_PRECISION[saved['precision']]!r} trains in {saved['precision']})"
        raise ValueError(
            f"{path} was written with a different configuration ({'; '.join(differ)}); "
            f"resume with the same settings{hint} or start a new run in another folder"
        )
    return payload


def save_progress(state, setup):
    """Write the snapshot, checkpoint.pt and metrics.json (rank 0; every rank must call)."""
    rng = gather_rng_states(setup.device, setup.world)
    if setup.rank == 0:
        out, config, latest = setup.out, setup.config, state.validation[-1:]
        weights = {
            "format": CHECKPOINT_FORMAT,
            "config": config.identity(),
            "precision": PRECISIONS[setup.amp],
            "cuda_graphs": setup.cuda_graphs,
            "tokenizer": setup.tokenizer.to_str(),
            "step": state.step,
            "validation": latest[0] if latest and latest[0]["step"] == state.step else None,
            "model": state.model.state_dict(),
        }
        save_checkpoint(out / f"checkpoint-{state.step:07d}.pt", weights)
        for old in snapshot_paths(out)[: -config.keep_checkpoints]:
            old.unlink()
        counters = ("epoch", "position", "tokens_seen", "seconds", "history")
        resumable = {name: getattr(state, name) for name in counters}
        resumable["validations"] = state.validation  # "validation": this step's, above
        for name in ("optimizer", "scheduler", "scaler"):
            resumable[name] = getattr(state, name).state_dict()
        save_checkpoint(out / "checkpoint.pt", {**weights, **resumable, "rng": rng})
        metrics = {"config": config.identity(), "history": state.history}
        write_json(out / "metrics.json", {**metrics, "validation": state.validation})
    if setup.world > 1:
        torch.distributed.barrier()


def resume_or_start(setup, payload):
    """A fresh RunState, or the checkpointed one restored; each rank's own dropout stream."""
    vocab = setup.tokenizer.get_vocab_size()
    state = RunState.new(setup.config, vocab, setup.device, setup.amp, setup.cuda_graphs)
    if payload is not None:
        for name in ("model", "optimizer", "scheduler", "scaler"):
            if payload[name]:  # a float32 or bfloat16 run's scaler saved nothing
                getattr(state, name).load_state_dict(payload[name])
        for name in ("step", "epoch", "position", "tokens_seen", "seconds", "history"):
            setattr(state, name, payload[name])
        state.validation = payload["validations"]
        restore_rng_state(payload["rng"], setup.rank, setup.world, setup.device)
        if setup.rank == 0:
            setup.log(f"resumed from {setup.out / 'checkpoint.pt'} at step {state.step}")
    elif setup.rank > 0:
        torch.manual_seed(setup.config.seed + 1_000_003 * setup.rank)  # its own dropout
    return state


def tokenizer_for_run(config, pairs, out, tokenizer, payload, rank, world):
    """The checkpoint's vocabulary when resuming, else the one given, else one that rank 0
    learns from the training pairs; saved as out/tokenizer.json."""
    if payload is not None:
        saved = Tokenizer.from_str(payload["tokenizer"])
        if tokenizer is not None and tokenizer.to_str() != saved.to_str():
            raise ValueError(f"{out} was trained with another tokenizer; resume without one")
        return saved
    if tokenizer is None:
        if rank == 0:
            train_bpe(pairs, config.vocab_size, out / "tokenizer.json")
        if world > 1:
            torch.distributed.barrier()  # rank 0's vocabulary is on disk for every rank
        return load_tokenizer(out / "tokenizer.json")
    if tokenizer.get_vocab_size() > config.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.get_vocab_size()} tokens but config.vocab_size is "
            f"{config.vocab_size}; pass a tokenizer from train_bpe(pairs, {config.vocab_size})"
        )
    if rank == 0:
        tokenizer.save(str(out / "tokenizer.json"))
    return tokenizer


def record_losses(state, pending, world):
    """Read the summed [loss, nll] of the steps since the last read (all ranks' together)
    into state.history, per target token: the one point where the loop waits for the device."""
    sums = torch.stack([losses for losses, _, _ in pending])
    if world > 1:
        torch.distributed.all_reduce(sums)
    for (loss, nll), (_, lr, ntokens) in zip(sums.tolist(), pending):
        entry = {"step": len(state.history) + 1, "loss": round(loss / ntokens, 5)}
        entry.update(nll=round(nll / ntokens, 5), lr=lr, tokens=ntokens)
        state.history.append(entry)
    pending.clear()


def record_validate_save(state, setup, pending, done=False):
    """Every log_every steps: read the losses; every eval_every steps (with validation
    data): validate; every checkpoint_every steps: save. The last step (`done`) does all
    three."""
    config = setup.config
    record_losses(state, pending, setup.world)
    if setup.val and setup.rank == 0 and (state.step % config.eval_every == 0 or done):
        figures = validate(state.model, *setup.val, setup.tokenizer)
        when = {"step": state.step, "seconds": round(state.seconds, 1)}
        state.validation.append({**when, "tokens_seen": state.tokens_seen, **figures})
        setup.log(f"step {state.step}: validation {figures}")
    if state.step % config.checkpoint_every == 0 or done:
        save_progress(state, setup)
        last = state.history[-1]
        if setup.rank == 0:
            setup.log(
                f"step {state.step}: loss {last['loss']:.3f}, nll {last['nll']:.3f}, "
                f"lr {last['lr']:.2e}, {state.seconds:.0f} s, checkpoint written"
            )


def epoch_rows(updates, rank, device):
    """This process's row numbers for every update of `updates`, in one tensor on `device`
    (one copy per epoch), and the slice of it that belongs to each update."""
    mine = [group[rank] for group in updates]
    ends = list(itertools.accumulate(len(indices) for indices in mine))
    rows = torch.tensor([i for indices in mine for i in indices]).to(device, non_blocking=True)
    return rows, [slice(end - len(indices), end) for end, indices in zip(ends, mine)]


def train_epoch(state, setup, model, bar, multiple_of=1, runner=None):
    """The rest of the current epoch, or up to the run's end: max_steps, or max_seconds.
    `model` is state.model, wrapped in DistributedDataParallel under several processes and
    compiled when asked; runner: a GraphedTrainStep that makes the updates instead of
    train_step (one process). Returns whether the run has ended."""
    config, pending, started = setup.config, [], time.perf_counter()
    every = [config.log_every, config.checkpoint_every] + [config.eval_every] * bool(setup.val)
    updates = epoch_updates(setup.corpus, config, state.epoch, setup.world)[state.position :]
    rows, cuts = epoch_rows(updates, setup.rank, setup.device)
    for group, cut in zip(updates, cuts):
        ntokens = sum(setup.corpus.target_tokens(indices) for indices in group)  # host lengths
        if runner is None:
            batch = setup.corpus.batch(group[setup.rank], multiple_of=multiple_of, rows=rows[cut])
            lr = state.optimizer.param_groups[0]["lr"]
            losses = train_step(
                model, batch, state.optimizer, state.scheduler, state.scaler, config.smoothing,
                ntokens / setup.world, setup.amp,
            )  # fmt: skip
        else:  # the rate in the optimizer is a device tensor: the host computes its own copy
            lr = rate(state.step + 1, config.model.d_model, config.lr_factor, config.warmup_steps)
            losses = runner(*bucketed_ids(setup.corpus, group[0], rows=rows[cut]), ntokens)
        pending.append((losses, lr, ntokens))
        state.step, state.position = state.step + 1, state.position + 1
        state.tokens_seen += ntokens
        bar.update()
        done = state.step == config.max_steps
        if done or any(state.step % n == 0 for n in every):
            state.seconds += time.perf_counter() - started
            done = done or out_of_time(state, setup)
            record_validate_save(state, setup, pending, done)
            bar.set_postfix(loss=f"{state.history[-1]['loss']:.3f}")
            started = time.perf_counter()  # validation and saving are not training time
        if done:
            return True
    if pending:
        state.seconds += time.perf_counter() - started
        record_losses(state, pending, setup.world)
    state.epoch, state.position = state.epoch + 1, 0
    return False


def out_of_time(state, setup):
    """At a checkpoint of a run with max_seconds: whether checkpoint_every more steps, at the
    run's mean pace so far, would end past it. Under several processes rank 0's clock
    decides for all, so that they stop together."""
    config = setup.config
    if not config.max_seconds or state.step % config.checkpoint_every:
        return False
    late = state.seconds * (1 + config.checkpoint_every / state.step) > config.max_seconds
    if setup.world > 1:  # a checkpoint waits for the device anyway
        flag = torch.tensor(float(late), device=setup.device)
        torch.distributed.broadcast(flag, src=0)
        late = bool(flag.item())
    return late


def train(
    config,
    train_pairs,
    out_dir,
    tokenizer=None,
    val_pairs=None,
    device="cpu",
    resume=False,
    log=print,
    progress=False,
    amp=None,
    compile=False,
    cuda_graphs=False,
):
    """§5: train on (source, target) sentence pairs into out_dir; returns (model,
    tokenizer, history). With val_pairs, validates every config.eval_every steps. amp is
    one of AMP_CHOICES; resume=True continues out_dir/checkpoint.pt exactly. Under
    torchrun, each process trains on its share of every update (DistributedDataParallel)
    and only rank 0 writes files and logs. compile: True, or the name of a torch.compile
    backend; cuda_graphs: replay each step as a CUDA graph (one process; on a CPU the same
    step runs eagerly)."""
    check_device(device)
    measure = amp == "fastest" and torch.device(device).type == "cpu"
    amp = None if measure else autocast_dtype(amp, device)
    rank, world = distributed_rank_and_size()
    check_run(out_dir, train_pairs, cuda_graphs and (compile or world > 1 or amp is torch.float16))
    out = pathlib.Path(out_dir)
    with RunFolder(out, resume, owner=rank == 0), tf32_matmuls(device):
        precision, path = None if measure else PRECISIONS[amp], out / "checkpoint.pt"
        payload = checkpoint_to_resume(path, config, precision, cuda_graphs) if resume else None
        tokenizer = tokenizer_for_run(config, train_pairs, out, tokenizer, payload, rank, world)
        corpus = EncodedCorpus.from_pairs(train_pairs, tokenizer)
        if measure:
            amp = fastest_precision(config, corpus, tokenizer.get_vocab_size(), payload, log)
        val = None
        if val_pairs:
            val = EncodedCorpus.from_pairs(val_pairs, tokenizer), val_pairs[: config.bleu_sentences]
        corpus = corpus.to(device)
        setup = RunSetup(config, out, tokenizer, corpus, val, device, amp, rank, world, log,
                         cuda_graphs)  # fmt: skip
        state = resume_or_start(setup, payload)  # before any capture: graphs keep addresses
        step_parts = state.model, state.optimizer, state.scheduler, config.smoothing, amp
        runner = GraphedTrainStep(*step_parts) if cuda_graphs else None
        model = torch.nn.parallel.DistributedDataParallel(state.model) if world > 1 else state.model
        if compile:  # True: PyTorch's default compiler; a string names another backend
            model = torch.compile(model, **({} if compile is True else {"backend": compile}))
        bar = tqdm(
            total=config.max_steps, initial=state.step, unit="step", disable=not progress or rank
        )
        ended = state.step >= config.max_steps
        while not ended:
            ended = train_epoch(state, setup, model, bar, 8 if compile else 1, runner)
        bar.close()
    return state.model, tokenizer, state.history


def check_run(out_dir, train_pairs, graphs_refused):
    """Refuse what train cannot do, before anything is written."""
    if str(out_dir).strip() in ("", "."):  # pathlib.Path("") is "." too
        raise ValueError(
            f"out_dir={str(out_dir)!r} is the working directory: pass a folder of the run's "
            f"own, e.g. runs/quick"
        )
    if not train_pairs:
        raise ValueError("train_pairs is empty: pass (source, target) sentence pairs")
    if graphs_refused:
        raise ValueError(
            "cuda_graphs=True captures the step of one process, uncompiled, in float32 or "
            "bfloat16: drop compile, run one process, and use amp='bf16' or 'off' (float16 "
            "needs a gradient scaler, which reads the device at every step)"
        )


def fastest_precision(config, corpus, vocab, payload, log):
    """amp="fastest" on a CPU: the checkpoint's precision when resuming (a run keeps the
    precision it was measured to need), else faster_precision's; logged with the reason."""
    if payload:
        names = {name: dtype for dtype, name in PRECISIONS.items()}
        amp, how = names[payload["precision"]], "the checkpoint"
    else:
        amp = faster_precision(config, corpus, vocab)
        how = "timed: the faster here" if native_bf16("cpu") else "bfloat16 is emulated here"
    log(f"amp fastest: {PRECISIONS[amp]} ({how})")
    return amp


@contextlib.contextmanager
def tf32_matmuls(device):
    """On a GPU, float32 matrix products in TF32 for the duration, the old setting restored."""
    if torch.device(device).type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.fp32_precision = saved


# --------------------------------------------------------------------------------------
# Training with CUDA graphs (ours), from chapters/cuda_graphs.ipynb
# --------------------------------------------------------------------------------------

BUCKETS = (8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256)


def bucket(n, buckets=BUCKETS):
    """CUDA graphs: the smallest of `buckets` (ascending) that holds n; past the largest, the
    next multiple of the largest, so that any n has a bucket."""
    for size in buckets:
        if n <= size:
            return size
    return -(-n // buckets[-1]) * buckets[-1]


def bucketed_ids(corpus, indices, buckets=BUCKETS, rows=None):
    """CUDA graphs: the source ids (size, S) and target ids (size, T + 1) of these pairs of an
    EncodedCorpus, cut from its tables where they are: the longest source rounded up to a
    bucket S, the longest target without <s> to a bucket T, the number of pairs to a bucket
    `size`. The rows added are fillers that add nothing to the loss: a source of one </s>,
    a target of <s> alone, so that every query has a real key to attend to. rows: the
    indices as a tensor on the tables' device, when the caller has them there."""
    if rows is None:
        rows = torch.tensor(indices, device=corpus.src.device)
    real, size = len(indices), bucket(len(indices), buckets)
    sides = []
    for side, table, first in ((0, corpus.src, EOS_ID), (1, corpus.tgt, BOS_ID)):
        longest = max(corpus.lengths[i][side] for i in indices) - side  # target: less <s>
        length = bucket(longest, buckets) + side
        cut = table.narrow(1, 0, min(length, table.size(1))).index_select(0, rows)
        cut = F.pad(cut, (0, length - cut.size(1), 0, size - real), value=corpus.pad_id)
        cut[real:, 0].fill_(first)  # the fillers' one real token
        sides.append(cut)
    return sides


def bucketed_batch(corpus, indices, buckets=BUCKETS):
    """CUDA graphs: the Batch of bucketed_ids; its ntokens counts the real target tokens."""
    src, tgt = bucketed_ids(corpus, indices, buckets)
    return Batch.from_tensors(src, tgt, corpus.target_tokens(indices), corpus.pad_id)


def device_rate(step, model_size, factor=1.0, warmup=4000):
    """CUDA graphs: Eq. (3) as `rate` computes it, for a step count held in a tensor, computed
    where the tensor is; step 0 counts as step 1."""
    step = step.clamp(min=1)
    return factor * model_size**-0.5 * torch.minimum(step.rsqrt(), step * warmup**-1.5)


class DeviceSchedule:
    """CUDA graphs: the learning rate of Eq. (3), kept on the device where a captured step can
    set it. `steps` counts the updates made; `lr` is the tensor the optimizer reads, holding
    the rate of the next update (as make_optimizer's LambdaLR keeps it). step() advances
    both on the device; state_dict() reads the count back, for checkpoints."""

    def __init__(self, optimizer, d_model, factor=1.0, warmup=4000):
        self.lr = optimizer.param_groups[0]["lr"]
        if not all(group["lr"] is self.lr for group in optimizer.param_groups):
            raise ValueError("every parameter group must read the same learning-rate tensor")
        self.steps = torch.zeros((), dtype=torch.float32, device=self.lr.device)
        self.d_model, self.factor, self.warmup = d_model, factor, warmup
        self.step(advance=False)

    def step(self, advance=True):
        if advance:
            self.steps += 1
        self.lr.copy_(device_rate(self.steps + 1, self.d_model, self.factor, self.warmup))

    def state_dict(self):
        return {"steps": int(self.steps.item())}

    def load_state_dict(self, state):
        self.steps.fill_(state["steps"])
        self.step(advance=False)


def make_capturable_optimizer(model, d_model, factor=1.0, warmup=4000, weight_decay=0.0):
    """CUDA graphs: make_optimizer's AdamW and Eq. (3) for a step that can be captured: fused
    (one kernel updates every parameter), its learning rate a float32 tensor on the
    parameters' device that a DeviceSchedule sets, capturable on a GPU (its step counts
    stay there too). Returns (optimizer, schedule)."""
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=rate(1, d_model, factor, warmup),
        betas=(0.9, 0.98),
        eps=1e-9,
        weight_decay=weight_decay,
        fused=True,
        capturable=device.type == "cuda",
    )
    lr = torch.zeros((), dtype=torch.float32, device=device)  # the fused kernel reads a float
    for group in optimizer.param_groups:
        group["lr"] = lr
    return optimizer, DeviceSchedule(optimizer, d_model, factor, warmup)


def capturable_step(model, optimizer, schedule, smoothing, amp=None):
    """CUDA graphs: train_step as a function of tensors alone, that a CUDA graph can capture.
    step(src, tgt, ntokens, causal): source ids (batch, S), target ids with <s> and </s>
    (batch, T + 1), the real target tokens (a number, or a tensor on the device), and
    subsequent_mask(T) on the device. Forward, loss per real token, backward, the optimizer's
    and the schedule's step, gradients zeroed in place; returns [loss, nll] summed."""
    if amp == torch.float16:
        raise ValueError("float16 needs a gradient scaler, which reads the device: use bf16")

    def step(src, tgt, ntokens, causal):
        tgt_in, tgt_y = tgt[:, :-1], tgt[:, 1:]
        # target_mask, its causal part made once per length, outside the step
        masks = padding_mask(src, PAD_ID), padding_mask(tgt_in, PAD_ID) & causal
        batch = Batch(src, tgt_in, tgt_y, *masks, ntokens)
        precision = contextlib.nullcontext()
        if amp:  # no cache of cast weights in a capture (make_graphed_callables refuses it)
            precision = torch.autocast(src.device.type, amp, cache_enabled=False)
        with precision:
            loss, nll = forward_loss(model, batch, smoothing)
        (loss / ntokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the same gradient buffers in every replay
        schedule.step()
        return torch.stack([loss.detach(), nll])

    return step


@dataclass
class StaticStep:
    """CUDA graphs: a batch shape's input buffers, its output, and its graph once captured."""

    src: torch.Tensor
    tgt: torch.Tensor
    ntokens: torch.Tensor
    causal: torch.Tensor
    sums: torch.Tensor
    graph: typing.Any = None
    eager_steps: int = 0


class GraphedTrainStep:
    """CUDA graphs: a training step replayed as one CUDA graph per batch shape, for one
    process. runner(src, tgt, ntokens), with ids as bucketed_ids cuts them and the real
    target tokens (a number from the host), returns [loss, nll] summed over the batch, on the
    device, as train_step does. On a GPU the first `eager_steps` batches of a shape run
    eagerly on a side stream (warm-up, and real updates), the next is captured, and every
    later one is copied into the shape's buffers and replayed. A graph keeps the addresses of
    the parameters, gradients and optimizer state: load checkpoints before the first step.
    On a CPU (or `meta`) every batch runs the same step eagerly."""

    def __init__(self, model, optimizer, schedule, smoothing, amp=None, eager_steps=3):
        if eager_steps < 1:  # the optimizer's state must exist before a capture
            raise ValueError(f"eager_steps must be at least 1, got {eager_steps}")
        self.step = capturable_step(model, optimizer, schedule, smoothing, amp)
        self.device, self.eager_steps = schedule.lr.device, eager_steps
        self.graphed = self.device.type == "cuda"
        self.shapes, self.masks = {}, {}
        if self.graphed:
            self.stream = torch.cuda.Stream(self.device)  # warm-up and capture, one stream
            self.pool = torch.cuda.graph_pool_handle()  # one memory pool for every graph

    def causal(self, length):
        """subsequent_mask(length) on the device, made once per target length."""
        if length not in self.masks:
            self.masks[length] = subsequent_mask(length, self.device)
        return self.masks[length]

    def static(self, src, tgt):
        """The buffers of this batch shape, made at its first batch."""
        key = (*src.shape, tgt.size(1))
        if key not in self.shapes:
            ntokens, sums = torch.zeros((), device=self.device), torch.zeros(2, device=self.device)
            causal = self.causal(tgt.size(1) - 1)
            self.shapes[key] = StaticStep(
                torch.empty_like(src), torch.empty_like(tgt), ntokens, causal, sums
            )
        return self.shapes[key]

    def __call__(self, src, tgt, ntokens):
        if not self.graphed:
            return self.step(src, tgt, ntokens, self.causal(tgt.size(1) - 1))
        static = self.static(src, tgt)
        static.src.copy_(src)
        static.tgt.copy_(tgt)
        static.ntokens.fill_(ntokens)
        inputs = static.src, static.tgt, static.ntokens, static.causal
        if static.graph is None and static.eager_steps < self.eager_steps:
            current = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream), warnings.catch_warnings():
                # capturable=True warns when it runs uncaptured, as warm-up must
                warnings.filterwarnings("ignore", "This instance was constructed with capturable")
                static.sums.copy_(self.step(*inputs))
            current.wait_stream(self.stream)
            static.eager_steps += 1
            return static.sums.clone()
        if static.graph is None:  # capture records the step's kernels and runs none of them
            static.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(static.graph, pool=self.pool, stream=self.stream):
                static.sums.copy_(self.step(*inputs))
        static.graph.replay()
        return static.sums.clone()  # the next replay overwrites static.sums


# --------------------------------------------------------------------------------------
# Fast decoding (ours), from chapters/fast_decoding.ipynb
# --------------------------------------------------------------------------------------

class AttentionCache:
    """Fast decoding: the keys (rows, h, positions, d_k) and values (rows, h, positions, d_v)
    of one masked self-attention, kept while the decoder produces one token at a time. They
    are the filled part of buffers with room for more positions, written in place."""

    room = 32  # positions a new buffer holds beyond those it is made for

    def __init__(self):
        self.keys = self.values = self.buffers = None

    def append(self, key, value):
        """Add the new positions' keys and values after those kept; return all kept."""
        start = 0 if self.keys is None else self.keys.size(2)
        end = start + key.size(2)
        if self.buffers is None or end > self.buffers[0].size(2):
            # torch.cat would copy everything kept at every step: copy only when a buffer fills
            grown = [x.new_empty(*x.shape[:2], end + self.room, x.size(-1)) for x in (key, value)]
            if start:
                for buffer, old in zip(grown, (self.keys, self.values)):
                    buffer[:, :, :start] = old
            self.buffers = grown
        for buffer, new in zip(self.buffers, (key, value)):
            buffer[:, :, start:end] = new
        self.keys, self.values = (buffer[:, :, :end] for buffer in self.buffers)
        return self.keys, self.values

    def reorder(self, rows):
        """Row j becomes what row rows[j] was, in new buffers (beam search's first step)."""
        self.buffers = [buffer.index_select(0, rows) for buffer in self.buffers]
        self.keys, self.values = (b[:, :, : self.keys.size(2)] for b in self.buffers)

    def copy_rows(self, source, target):
        """Copy row source[i] over row target[i], in place; no target may be a source."""
        for kept in (self.keys, self.values):
            kept.index_copy_(0, target, kept.index_select(0, source))


def grouped_attention(attn, x, key, value, mask=None):
    """Fast decoding: MultiHeadedAttention `attn` for one new position per row, x (batch, 1,
    d_model), against keys (rows, h, seq_k, d_k) and values (rows, h, seq_k, d_v) already
    projected, mask (rows, 1, seq_k) or None -> (batch, 1, d_model). batch is a multiple of
    rows: queries b * group ... (b + 1) * group - 1 read key row b (beam search's group of
    hypotheses of sentence b, its one memory)."""
    rows, group = key.size(0), x.size(0) // key.size(0)
    # (rows * group, 1, h * d_k) -> (rows, h, group, d_k): one key row's queries side by side
    query = attn.w_q(x).view(rows, group, attn.h, attn.d_k).transpose(1, 2)
    if mask is not None:
        mask = mask.unsqueeze(1)  # (rows, 1, 1, seq_k): for every head and every query
    out, _ = attention(query, key, value, mask, attn.dropout)
    # (rows, h, group, d_v) -> (rows * group, 1, h * d_v): Concat(head_1, ..., head_h)
    return attn.w_o(out.transpose(1, 2).reshape(-1, 1, attn.h * attn.d_v))


def decoder_layer_step(layer, x, kept, memory_keys, memory_values, src_mask):
    """DecoderLayer.forward for one new position per row, x (rows, 1, d_model), with its
    caches: kept, the AttentionCache of its masked self-attention; the memory's keys and
    values, projected once (one row per sentence)."""

    def self_attention(x):
        attn = layer.self_attn
        key, value = (
            attn.split_heads(attn.w_k(x), attn.d_k),
            attn.split_heads(attn.w_v(x), attn.d_v),
        )
        return grouped_attention(attn, x, *kept.append(key, value))

    x = layer.sublayer[0](x, self_attention)
    x = layer.sublayer[1](
        x, lambda x: grouped_attention(layer.src_attn, x, memory_keys, memory_values, src_mask)
    )
    return layer.sublayer[2](x, layer.feed_forward)


@torch.no_grad()  # the cache is written in place, which gradients cannot pass through
def decode_step(model, tokens, cache):
    """EncoderDecoder.decode with a KeyValueCache: one token per row, tokens (rows, 1), at
    position cache.length; returns the next token's log-probabilities (rows, vocab)."""
    embed, position = model.tgt_embed
    x = position(embed(tokens), offset=cache.length)
    for layer, kept, (key, value) in zip(model.decoder.layers, cache.self_attn, cache.memory):
        x = decoder_layer_step(layer, x, kept, key, value, cache.src_mask)
    cache.length += 1
    return model.generator(model.decoder.norm(x)[:, -1])


class KeyValueCache:
    """Fast decoding: what the decoder keeps so that each step feeds one new token. Per
    layer, an AttentionCache for masked self-attention (one row per hypothesis) and the
    memory's keys and values (one row per sentence); `length`, the positions fed so far.
    A decoder for greedy_decode and beam_search, as PrefixDecoder (§6.1) is."""

    def __init__(self, model, memory, src_mask):
        self.model, self.src_mask, self.length = model, src_mask, 0
        self.self_attn = [AttentionCache() for _ in model.decoder.layers]
        with torch.no_grad():  # contiguous: every step's products read them as they are
            self.memory = [
                (a.split_heads(a.w_k(memory), a.d_k), a.split_heads(a.w_v(memory), a.d_v))
                for a in (layer.src_attn for layer in model.decoder.layers)
            ]
            self.memory = [(key.contiguous(), value.contiguous()) for key, value in self.memory]

    def next_log_probs(self, ys):
        """The next token's log-probabilities after ys (rows, t): ys' last token is new."""
        return decode_step(self.model, ys[:, -1:], self)

    def slots(self, kept, parent, k):
        return beam_slots(kept, parent, k)

    def follow(self, rows, moved):
        """Row j of the self-attention caches takes what row rows[j] held, after a step of
        beam search; moved[j]: whether rows[j] != j. The first step widens one row per
        sentence to k; later ones copy only the rows that moved."""
        if rows.numel() != self.self_attn[0].keys.size(0):
            for kept in self.self_attn:
                kept.reorder(rows)
            return
        target = [j for j, m in enumerate(moved) if m]
        target = torch.tensor(target, dtype=torch.long, device=rows.device)
        for kept in self.self_attn:
            kept.copy_rows(rows[target], target)


def beam_slots(kept, parent, k):
    """Fast decoding: where beam search puts the candidates it keeps. kept (batch, c) bool
    over each sentence's candidates, best first; parent (batch, c), the row in 0..k-1 of
    its sentence that each extends. A parent's first kept extension takes over the parent's
    own row, so its cached keys and values stay where they are; further extensions of the
    same parent take, in order, the rows of hypotheses that nothing extends, and only those
    rows are copied. Returns slot (batch, c) in 0..k-1, or k where not kept."""
    c = kept.size(-1)
    earlier = torch.ones(c, c, dtype=torch.bool, device=kept.device).tril(-1)  # j ranks above i
    sibling = (parent.unsqueeze(-1) == parent.unsqueeze(-2)) & kept.unsqueeze(-2) & earlier
    first = kept & ~sibling.any(dim=-1)  # the best kept extension of its parent
    extra = kept & ~first
    rows = torch.arange(k, device=kept.device)
    extended = ((parent.unsqueeze(-1) == rows) & kept.unsqueeze(-1)).any(dim=1)  # (batch, k)
    free = torch.where(extended, k, rows).sort(dim=-1).values  # rows nothing extends, first
    extra_slot = free.gather(1, (extra.cumsum(dim=-1) - 1).clamp(min=0))
    return torch.where(first, parent, torch.where(extra, extra_slot, k))
