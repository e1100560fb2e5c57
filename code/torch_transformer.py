"""The speed benchmark's baseline: torch.nn.Transformer at the sizes of a ModelConfig, inside
our embeddings and generator, so that one training step trains it and our model alike.
Written by hand; code/benchmark.py times the two side by side.
"""

import torch
from torch import nn

import annotated_transformer as at


class TorchTransformer(nn.Module):
    """The baseline: torch.nn.Transformer with the sizes of a ModelConfig (post-LN, ReLU,
    batch_first), inside the same at.Embeddings, at.PositionalEncoding and at.Generator as
    our model, with the interface of at.EncoderDecoder, so one training step trains both alike.

    Known differences from our model: nn.MultiheadAttention has biases on its four
    projections (4 d_model per attention module), and nn.Transformer closes the encoder and
    the decoder with a LayerNorm even in post-LN (2 d_model each): 12 N d_model + 4 d_model
    more parameters. Dropout is the same: nn.Transformer's on attention weights and ReLU
    units, which the paper lacks (§5.4), get our attention_dropout and relu_dropout (0).
    With config.share_embeddings, both embeddings and the generator share one matrix, as in
    at.build_model (§3.4)."""

    def __init__(self, vocab, config):
        super().__init__()
        c = config
        embed = [at.Embeddings(c.d_model, vocab) for _ in range(2)]  # source, target
        position = [at.PositionalEncoding(c.d_model, c.dropout, c.max_len) for _ in range(2)]
        self.src_embed, self.tgt_embed = map(nn.Sequential, embed, position)
        self.transformer = nn.Transformer(
            d_model=c.d_model,
            nhead=c.h,
            num_encoder_layers=c.N,
            num_decoder_layers=c.N,
            dim_feedforward=c.d_ff,
            dropout=c.dropout,
            batch_first=True,  # post-LN (norm_first=False) and ReLU: the defaults
        )
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            layer.self_attn.dropout = c.attention_dropout
            if hasattr(layer, "multihead_attn"):
                layer.multihead_attn.dropout = c.attention_dropout
            layer.dropout = nn.Dropout(c.relu_dropout)  # between the feed-forward's two maps
        self.generator = at.Generator(c.d_model, vocab)
        at.initialise(self.generator.projection)  # as at.build_model; embeddings init themselves
        if c.share_embeddings:
            shared = self.src_embed[0].embedding.weight
            self.tgt_embed[0].embedding.weight = self.generator.projection.weight = shared

    def forward(self, src, tgt, src_mask, tgt_mask):
        # our boolean masks are True where attending is allowed, nn.Transformer's where not
        src_padding = ~src_mask[:, 0]  # (batch, seq_src)
        tgt_padding = ~tgt_mask[:, -1]  # the last query sees every real target position
        # True above the diagonal (the future), made on the step's device: no host copy
        causal = torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool, device=tgt.device).triu(1)
        return self.transformer(
            self.src_embed(src),
            self.tgt_embed(tgt),
            tgt_mask=causal,
            src_key_padding_mask=src_padding,
            tgt_key_padding_mask=tgt_padding,
            memory_key_padding_mask=src_padding,
            tgt_is_causal=True,
        )
