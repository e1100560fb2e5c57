"""Fast decoding (ours): the code of chapters/fast_decoding.ipynb.

GENERATED FILE, DO NOT EDIT. code/export.py writes it from the cells marked
`#| export` in chapters/fast_decoding.ipynb; change the page, then run `python code/export.py`.
"""

import torch

from annotated_transformer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    attention,
    evaluate_bleu,
    length_penalty,
    next_log_probs,
    output_limits,
    positive_int,
    translate,
)

# --------------------------------------------------------------------------------------
# Fast decoding (ours), from chapters/fast_decoding.ipynb
# --------------------------------------------------------------------------------------

def best_extensions(scores, log_probs, k):
    """The 2k best one-token extensions of each sentence's hypotheses (scores (batch, rows),
    log P), best first -> their scores, the row each extends (parent) and its token."""
    batch, rows = scores.shape
    vocab = log_probs.size(-1)
    candidates = scores.unsqueeze(-1) + log_probs.float().view(batch, rows, vocab)
    top_scores, index = candidates.view(batch, -1).topk(min(2 * k, rows * vocab), dim=-1)
    return top_scores, index // vocab, index % vocab


def sort_candidates(top_scores, ends, done, *, k):
    """Walk down each sentence's candidates, best first, until k go on: those that end on
    the way (the end symbol, or the length limit) finish. -> in_beam, finishing (batch, 2k)."""
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

    def add(self, ys, rows, top_scores, *, tokens, finishing, alpha):
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


def fill_slots(slot, top_scores, tokens, *, rows, unchanged):
    """The next beam: candidate i goes to row slot[i] of its sentence's k (k: not in the
    beam); a row nothing fills keeps its unchanged prefix, scored -inf. -> scores, tokens,
    rows."""
    k = unchanged.size(1) - 1
    scores = top_scores.new_full((slot.size(0), k + 1), float("-inf")).scatter(1, slot, top_scores)
    new_tokens = torch.full_like(unchanged, PAD_ID).scatter(1, slot, tokens)
    new_rows = unchanged.scatter(1, slot, rows)
    return scores[:, :k], new_tokens[:, :k].flatten(), new_rows[:, :k].flatten()


class PrefixDecoder:
    """Decoding with the decoder of chapter 3: the whole prefix ys (rows, t) again at every
    step; rows may be k per sentence (beam search's hypotheses). next_log_probs -> (rows,
    vocab). KeyValueCache, below, answers the same calls."""

    def __init__(self, model, memory, src_mask):
        self.model, self.memory, self.src_mask = model, memory, src_mask

    def next_log_probs(self, ys):
        group = ys.size(0) // self.memory.size(0)  # hypotheses per sentence
        memory, src_mask = (x.repeat_interleave(group, 0) for x in (self.memory, self.src_mask))
        return next_log_probs(self.model, memory, src_mask, ys=ys)

    def slots(self, in_beam, parent, k):
        """Rows for the candidates in the beam: rank order (this decoder keeps no rows)."""
        return torch.where(in_beam, in_beam.cumsum(-1) - 1, k)

    def follow(self, rows, moved):
        """Nothing to move: ys holds the prefixes, and every step reads them again."""


def start_decoding(model, src, src_mask, *, cache):
    """Encode the source once; return the decoder of each step, cached or plain."""
    decoder = KeyValueCache if cache else PrefixDecoder
    return decoder(model, model.encode(src, src_mask), src_mask)


@torch.no_grad()  # decoding picks tokens: nothing to differentiate
def fast_greedy_decode(
    model, src, src_mask, *, max_len=None, start_symbol=BOS_ID, end_symbol=EOS_ID, cache=True
):
    """Chapter 5's greedy_decode with the decoder of start_decoding: the same tokens."""
    limits = output_limits(src_mask, max_len)
    decoder = start_decoding(model, src, src_mask, cache=cache)
    ys = torch.full((src.size(0), 1), start_symbol, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for t in range(int(limits.max())):
        next_token = decoder.next_log_probs(ys).argmax(dim=-1).masked_fill(done, PAD_ID)
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)
        done |= (next_token == end_symbol) | (t + 1 >= limits)
        if done.all():
            break
    return ys


@torch.no_grad()  # decoding picks tokens: nothing to differentiate
def fast_beam_search(
    model,
    src,
    src_mask,
    *,
    max_len=None,
    start_symbol=BOS_ID,
    end_symbol=EOS_ID,
    beam_size=4,
    alpha=0.6,
    cache=True,
):
    """Chapter 6.1's beam_search for a batch of sentences at once, src (batch, seq): the same
    tokens for each. Rows b * k ... (b + 1) * k - 1 of ys hold sentence b's k hypotheses;
    each step waits for the device once (is every sentence done, which rows moved?)."""
    k, batch, device = positive_int("beam_size", beam_size), src.size(0), src.device
    limits = output_limits(src_mask, max_len)
    limit_penalty = length_penalty(limits.double(), alpha)  # the largest lp of each sentence
    decoder = start_decoding(model, src, src_mask, cache=cache)
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
        in_beam, finishing = sort_candidates(top_scores, ends, done, k=k)
        finished.add(ys, rows, top_scores, tokens=tokens, finishing=finishing, alpha=alpha)
        slot = decoder.slots(in_beam, parent, k)
        unchanged = first_row + torch.arange(k + 1, device=device).clamp(max=per_sentence - 1)
        scores, new_tokens, new_rows = fill_slots(
            slot, top_scores, tokens, rows=rows, unchanged=unchanged
        )
        # log P only falls as a hypothesis grows, and lp is largest at the length limit
        done |= ~in_beam.any(dim=-1) | (finished.score >= scores.max(-1).values / limit_penalty)
        # the step's one wait for the device: is every sentence done, and which rows moved
        moved = new_rows != torch.arange(new_rows.numel(), device=device)
        all_done, *moved = torch.cat([done.all().view(1), moved]).tolist()
        if all_done:
            break
        ys = torch.cat([ys[new_rows], new_tokens.unsqueeze(1)], dim=1)
        decoder.follow(new_rows, moved)
    return finished.output(start_symbol)


def fast_decode_batch(model, src, src_mask, *, beam_size=4, alpha=0.6):
    """Chapter 6.1's decode_batch on the fast path, for translate(..., decode=...): the
    same tokens, the whole batch at once, with the key/value cache."""
    if beam_size == 1:
        return fast_greedy_decode(model, src, src_mask)
    return fast_beam_search(model, src, src_mask, beam_size=beam_size, alpha=alpha)


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
        """Copy row source[i] over row target[i], in place. The sources are gathered first,
        so a target may also be a source: any placement of the hypotheses is followed."""
        for buffer in (self.keys, self.values):
            buffer.index_copy_(0, target, buffer.index_select(0, source))


def grouped_attention(attn, x, key, *, value, mask=None):
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
    out, _ = attention(query, key, value, mask=mask, dropout=attn.dropout)
    # (rows, h, group, d_v) -> (rows * group, 1, h * d_v): Concat(head_1, ..., head_h)
    return attn.w_o(out.transpose(1, 2).reshape(-1, 1, attn.h * attn.d_v))


def decoder_layer_step(layer, x, self_cache, *, memory_keys, memory_values, src_mask):
    """DecoderLayer.forward for one new position per row, x (rows, 1, d_model), with its
    caches: self_cache, the AttentionCache of its masked self-attention; the memory's keys and
    values, projected once (one row per sentence)."""

    def self_attention(x):
        attn = layer.self_attn
        key, value = (
            attn.split_heads(attn.w_k(x), attn.d_k),
            attn.split_heads(attn.w_v(x), attn.d_v),
        )
        keys, values = self_cache.append(key, value)
        return grouped_attention(attn, x, keys, value=values)

    x = layer.sublayer[0](x, self_attention)
    x = layer.sublayer[1](
        x,
        lambda x: grouped_attention(
            layer.src_attn, x, memory_keys, value=memory_values, mask=src_mask
        ),
    )
    return layer.sublayer[2](x, layer.feed_forward)


@torch.no_grad()  # the cache is written in place, which gradients cannot pass through
def decode_step(model, tokens, cache):
    """EncoderDecoder.decode with a KeyValueCache: one token per row, tokens (rows, 1), at
    position cache.length; returns the next token's log-probabilities (rows, vocab)."""
    embed, position = model.tgt_embed
    x = position(embed(tokens), offset=cache.length)
    for layer, self_cache, (key, value) in zip(model.decoder.layers, cache.self_attn, cache.memory):
        x = decoder_layer_step(
            layer, x, self_cache, memory_keys=key, memory_values=value, src_mask=cache.src_mask
        )
    cache.length += 1
    return model.generator(model.decoder.norm(x)[:, -1])


class KeyValueCache:
    """Fast decoding: what the decoder keeps so that each step feeds one new token. Per
    layer, an AttentionCache for masked self-attention (one row per hypothesis) and the
    memory's keys and values (one row per sentence); `length`, the positions fed so far.
    A decoder for fast_greedy_decode and fast_beam_search, as PrefixDecoder is."""

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

    def slots(self, in_beam, parent, k):
        return beam_slots(in_beam, parent, k)

    def follow(self, rows, moved):
        """Row j of the self-attention caches takes what row rows[j] held, after a step of
        beam search; moved[j]: whether rows[j] != j. The first step widens one row per
        sentence to k; later ones copy only the rows that moved."""
        if rows.numel() != self.self_attn[0].keys.size(0):
            for self_cache in self.self_attn:
                self_cache.reorder(rows)
            return
        target = [j for j, m in enumerate(moved) if m]
        target = torch.tensor(target, dtype=torch.long, device=rows.device)
        for self_cache in self.self_attn:
            self_cache.copy_rows(rows[target], target)


def beam_slots(in_beam, parent, k):
    """Fast decoding: where beam search puts the candidates it keeps. in_beam (batch, c) bool
    over each sentence's candidates, best first; parent (batch, c), the row in 0..k-1 of
    its sentence that each extends. A parent's first extension in the beam takes over the parent's
    own row, so its cached keys and values stay where they are; further extensions of the
    same parent take, in order, the rows of hypotheses that nothing extends, and only those
    rows are copied. Returns slot (batch, c) in 0..k-1, or k where not in the beam."""
    c = in_beam.size(-1)
    earlier = torch.ones(c, c, dtype=torch.bool, device=in_beam.device).tril(-1)  # j ranks above i
    sibling = (parent.unsqueeze(-1) == parent.unsqueeze(-2)) & in_beam.unsqueeze(-2) & earlier
    first = in_beam & ~sibling.any(dim=-1)  # the best extension in the beam of its parent
    extra = in_beam & ~first
    rows = torch.arange(k, device=in_beam.device)
    extended = ((parent.unsqueeze(-1) == rows) & in_beam.unsqueeze(-1)).any(dim=1)  # (batch, k)
    free = torch.where(extended, k, rows).sort(dim=-1).values  # rows nothing extends, first
    extra_slot = free.gather(1, (extra.cumsum(dim=-1) - 1).clamp(min=0))
    return torch.where(first, parent, torch.where(extra, extra_slot, k))


def fast_translate(model, tokenizer, sentences, **options):
    """Chapter 6.1's translate with fast_decode_batch: the same translations, each batch
    decoded at once with the key/value cache. options: translate's beam_size, alpha and
    batch_size."""
    return translate(model, tokenizer, sentences, decode=fast_decode_batch, **options)


def fast_evaluate_bleu(model, tokenizer, pairs, **options):
    """Chapter 6.1's evaluate_bleu with fast_decode_batch (options as fast_translate's)."""
    return evaluate_bleu(model, tokenizer, pairs, decode=fast_decode_batch, **options)
