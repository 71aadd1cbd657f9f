"""Speculative decoding ("guess, then check"): drafts from the model's MTP block (or prompt lookup), checked all at
once in a verify window, kept only as far as the model itself would have chosen them.

One step: the last sampled token and up to T-1 drafts go through every layer in one forward (the verify window,
rows at positions start..start+k). Row j's logits are what plain decoding would have seen after the first j drafts,
so draft j+1 is accepted exactly when the sampler, given row j, agrees with it:

- greedy: when it is row j's argmax (the output is plain greedy decoding's, token for token);
- sampling: with probability min(1, p(x)/q(x)) (p the target distribution of row j, q the one the draft was drawn
  from); on rejection the token is drawn from max(0, p - q), renormalized, so every token keeps probability p.

The first rejected row's choice (or, when all drafts pass, the last row's) is one more token for free. The caches
then keep the accepted rows only: attention KV is truncated, and GatedDeltaNet layers restore the state they had
after the last accepted row (the window kept each row's, HybridCache.keep_rows), so the next step starts from
exactly the state plain decoding would have. Where the engine decodes through the static step (CUDA graphs), the
windows do too (engine/spec_windows.py); qwen4exp's cache also rolls back its indexer keys and n-gram window.

MTP drafting (models with `blk.{n}.nextn.*` tensors): MTP cell i pairs the trunk's final hidden state at position i
with the token at i+1 and predicts the token at i+2; cells are computed once per position from the trunk's own
hidden states (`mtp_cells` of them are current), and a draft after a draft feeds the block its own output. A draft
whose probability falls below `min_p` ends the MTP draft; prompt-lookup (suffix) drafts may then fill the window.
Greedy drafts go through the MTP block's static step where the windows have one (engine/spec_mtp.py); without
min_p they reach the window on the device, and a window costs the host one read (its drafts and rows' argmax).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

import torch

from strata.engine.context import ForwardContext
from strata.engine.hybrid_cache import HybridCache
from strata.engine.sampling import Sampler, SamplingParams
from strata.engine.spec_mtp import make_mtp_steps
from strata.engine.spec_windows import make_windows
from strata.errors import StrataError
from strata.models.weights import rows_as_steps

if TYPE_CHECKING:
    from strata.engine.engine import Engine

MAX_WINDOW = 4  # the last token + 3 drafts: what the verify graphs are captured for
LOOKUP_NGRAMS = (3, 2, 1)  # prompt lookup tries the longest recent n-gram first
LOOKUP_SPAN = 8192  # how far back prompt lookup searches the history


@dataclass
class Draft:
    token: int
    q: torch.Tensor | None  # the distribution it was drawn from (sampling, MTP); None: a point mass
    source: str  # "mtp" or "suffix"


@dataclass
class SpecStats:
    """Acceptance counters per draft position (0 = the first draft of a window): drafts proposed, drafts checked
    (those whose earlier drafts were all accepted) and drafts accepted; per source, checked and accepted; windows
    run and the tokens they produced."""

    window: int
    windows: int = 0
    tokens: int = 0
    proposed: list[int] = field(default_factory=list)
    checked: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    checked_by: dict[str, int] = field(default_factory=lambda: {"mtp": 0, "suffix": 0})
    accepted_by: dict[str, int] = field(default_factory=lambda: {"mtp": 0, "suffix": 0})

    def __post_init__(self):
        for name in ("proposed", "checked", "accepted"):
            setattr(self, name, getattr(self, name) or [0] * (self.window - 1))

    def acceptance(self) -> list[float]:
        """Accepted / checked at each draft position: the chance a draft passes once the ones before it did (nan
        where none was checked)."""
        return [a / d if d else float("nan") for a, d in zip(self.accepted, self.checked)]

    @property
    def tokens_per_window(self) -> float:
        return self.tokens / self.windows if self.windows else 0.0

    def as_dict(self) -> dict:
        return {"window": self.window, "windows": self.windows, "tokens": self.tokens,
                "proposed": list(self.proposed), "checked": list(self.checked), "accepted": list(self.accepted),
                "checked_by": dict(self.checked_by), "accepted_by": dict(self.accepted_by)}


def check_options(window: int, min_p: float, suffix_draft: int) -> None:
    if not 1 <= window <= MAX_WINDOW:
        raise StrataError(f"spec must be between 1 (off) and {MAX_WINDOW}, got {window}")
    if not 0 <= min_p <= 1:
        raise StrataError(f"spec_min_p must be in [0, 1], got {min_p}")
    if suffix_draft < 0:
        raise StrataError(f"suffix_draft must be >= 0, got {suffix_draft}")


def prompt_lookup(tokens: list[int], n: int) -> list[int]:
    """Up to n tokens that followed the most recent earlier occurrence of the sequence's last 3 (else 2, else 1)
    tokens: text that repeats itself (code, quotes, lists) continues as it did before."""
    if n <= 0:
        return []
    seq = tokens[-LOOKUP_SPAN:]
    for size in LOOKUP_NGRAMS:
        if len(seq) <= size:
            continue
        tail = seq[-size:]
        for i in range(len(seq) - size - 1, -1, -1):
            if seq[i:i + size] == tail:
                return seq[i + size:i + size + n]
    return []


def keep_rows(kv, start: int, n_rows: int) -> None:
    """Keep the first n_rows tokens of the step that began at `start` (a verify window); forget the rest."""
    if isinstance(kv, HybridCache):
        kv.keep_rows(n_rows)
    else:
        kv.truncate(start + n_rows)


class SpecDecoder:
    """Drafting, verify windows and acceptance for one Engine (`Engine.spec` when EngineConfig.spec > 1)."""

    def __init__(self, engine: Engine, window: int, min_p: float = 0.0, suffix_draft: int = 0):
        check_options(window, min_p, suffix_draft)
        self.engine, self.window, self.min_p = engine, window, min_p
        model = engine.model
        self.has_mtp = bool(getattr(model, "mtp", None))
        # Without an MTP block, prompt lookup is the only source of drafts: it may fill the whole window.
        self.suffix_draft = suffix_draft if suffix_draft or self.has_mtp else window - 1
        self.stats = SpecStats(window)
        self.mtp_cells = 0  # MTP cells 0..mtp_cells-1 hold keys computed from the trunk's own hidden states
        self.hidden: torch.Tensor | None = None  # the trunk's final hidden state per position (MTP drafts), made on use
        if self.has_mtp:
            own = getattr(model, "mtp_cache", None)  # qwen4exp keeps its MTP block's keys in the sequence cache
            self.mtp_cache = own(engine.kv) if own else model.new_mtp_cache(engine.n_ctx, engine.config.kv_dtype)
        # Windows through the static decode step (captured graphs on CUDA), as the engine's decode_graphs says;
        # greedy MTP drafts through the MTP block's own static step where the windows have one (spec_mtp.py).
        self.windows = make_windows(engine, window, self.has_mtp)
        self.mtp_steps = make_mtp_steps(self) if self.has_mtp and self.windows is not None else None
        # Seconds by part of a window (draft, verify, accept + keep), the device synced at each boundary: set to a
        # Counter to measure (`strata bench spec`); None costs nothing.
        self.phase_seconds: Counter | None = None

    @property
    def wants_hidden(self) -> bool:
        return self.has_mtp

    def saw_hidden(self, start: int, hidden: torch.Tensor) -> None:
        """The trunk computed positions start.. (a prompt chunk): keep their hidden states; MTP cells from start-1 on
        paired a hidden state with a token that may since have changed."""
        self._keep_hidden(start, hidden)
        self.mtp_cells = min(self.mtp_cells, max(start - 1, 0))

    def _keep_hidden(self, start: int, hidden: torch.Tensor) -> None:
        if self.hidden is None:  # its shape is the model's: [embd], or qwen4exp's residual stack [hc, embd]
            self.hidden = hidden.new_zeros((self.engine.n_ctx, *hidden.shape[1:]))
        self.hidden[start:start + hidden.shape[0]] = hidden

    # ---------------------------------------------------------------------------------------------- drafting

    def _mtp_drafts(self, history: list[int], k: int, sampler: Sampler) -> list[Draft]:
        """Up to k MTP drafts after `history` (its last token not yet through the trunk)."""
        model, device = self.engine.model, self.engine.device
        start = len(history) - 1
        if self.mtp_steps is not None and _plain_greedy(sampler) and 1 <= start - self.mtp_cells <= self.window:
            return self._static_mtp_drafts(history, k)
        # Catch up: cells mtp_cells..start-1 from the trunk's hidden states (the last one is the first draft's).
        first = self.mtp_cells
        step = max(1, self.engine.prefill_chunk)
        streamer = self.engine._prompt_streamer()
        try:
            for begin in range(first, start, step):
                end = min(begin + step, start)
                ids = torch.tensor(history[begin + 1:end + 1], device=device)
                logits, out = model.mtp_forward(self.hidden[begin:end], ids, self.mtp_cache, begin)
        finally:
            # A catch-up of several cells may stream its experts through slots lent like a prompt's: give them back
            # now, as a prompt does, so the verify window sees the placement plain decoding's step sees (--spec 2
            # drafts nothing after this, which would give them back, before its window: issue 10).
            if streamer is not None:
                streamer.return_slots()
        self.mtp_cells = start
        if start == first:  # no cell to draft from (nothing new since the last window)
            return []
        drafts: list[Draft] = []
        context = list(history)
        row, hidden = logits[-1], out[-1:]
        while True:
            if sampler.params.greedy:
                token = int(torch.argmax(sampler.penalized(row, context)))
                prob, q = float(torch.softmax(row.float(), -1)[token]), None
            else:
                q = sampler.distribution(row, context)
                q = q / q.sum()
                token = int(torch.multinomial(q, 1, generator=sampler.generator))
                prob = float(q[token])
            if prob < self.min_p:
                break
            drafts.append(Draft(token, q, "mtp"))
            context.append(token)
            if len(drafts) == k:
                break
            # A draft after a draft: the block's own output stands in for the trunk's hidden state.
            position = start + len(drafts) - 1
            logits, hidden = model.mtp_forward(hidden, torch.tensor([token], device=device), self.mtp_cache, position)
            row = logits[-1]
        return drafts

    def _static_mtp_drafts(self, history: list[int], k: int) -> list[Draft]:
        """_mtp_drafts (greedy, no penalty) through the MTP block's static step: the catch-up's cells and the k-1
        drafts after drafts on the device, their picks read at once; those past a min_p stop are dropped."""
        first, start = self.mtp_cells, len(history) - 1
        picks = self.mtp_steps.draft(self.hidden[first:start], history[first + 1:start + 1], first, k)
        self.mtp_cells = start
        drafts: list[Draft] = []
        for token, prob in picks:
            if prob < self.min_p:
                break
            drafts.append(Draft(token, None, "mtp"))
        return drafts

    def propose(self, history: list[int], k: int, sampler: Sampler) -> list[Draft]:
        """Up to k drafts to follow `history`: MTP first, then prompt lookup where the MTP draft stopped."""
        drafts = self._mtp_drafts(history, k, sampler) if self.has_mtp and k > 0 else []
        room = min(self.suffix_draft, k - len(drafts))
        drafts += [Draft(t, None, "suffix") for t in prompt_lookup(history + [d.token for d in drafts], room)]
        return drafts

    # ---------------------------------------------------------------------------------------------- checking

    def verify(self, window: list[int], start: int, tail: torch.Tensor | None = None) -> torch.Tensor:
        """The trunk over `window` at positions start..: logits [rows, vocab] (through the static decode step when
        the engine has one: valid until the next window); every row's recurrent state is kept until keep_rows.
        Keys of the cache's tokens before `start` must be those of the caller's history. `tail` (static windows
        only): window[1:] still on the device, window's own entries there being placeholders."""
        engine = self.engine
        if self.windows is not None:
            logits, hidden = self.windows.run(window, start, tail)
        else:
            ctx = ForwardContext(engine.kv, start, len(window), want_all_logits=True, want_hidden=self.has_mtp,
                                 keep_row_states=True, tokens=list(window))
            with rows_as_steps():
                logits = engine.model.forward(torch.tensor(window, device=engine.device), ctx)
            hidden = ctx.hidden
        if self.has_mtp:
            self._keep_hidden(start, hidden)
        engine.cached_tokens = engine.cached_tokens[:start] + list(window)
        return logits

    def keep(self, start: int, n_rows: int) -> None:
        keep_rows(self.engine.kv, start, n_rows)
        self.engine.cached_tokens = self.engine.cached_tokens[:start + n_rows]

    def accept(self, rows: torch.Tensor, drafts: list[Draft], history: list[int], sampler: Sampler,
               argmax: list[int] | None = None) -> list[int]:
        """The tokens this window produces: the accepted drafts, then one chosen by the model (`argmax`: the rows'
        argmax, already read)."""
        out: list[int] = []
        # Greedy without a penalty: every row's choice is its argmax, read from the device at once.
        if argmax is None and _plain_greedy(sampler):
            argmax = rows[:len(drafts) + 1].argmax(-1).tolist()
        for j, draft in enumerate(drafts):
            context = history + out
            if argmax is not None:
                choice = argmax[j]
                ok = choice == draft.token
            elif sampler.params.greedy:
                choice = sampler(rows[j], context)
                ok = choice == draft.token
            else:
                p = sampler.distribution(rows[j], context)
                p = p / p.sum()
                q = draft.q if draft.q is not None else _point_mass(draft.token, p)
                ratio = p[draft.token] / q[draft.token]
                ok = bool(torch.rand((), generator=sampler.generator) < ratio)
                if not ok:
                    residual = (p - q).clamp_min(0)
                    total = residual.sum()
                    choice = int(torch.multinomial(residual / total if total > 0 else p, 1, generator=sampler.generator))
            self.stats.checked[j] += 1
            self.stats.checked_by[draft.source] += 1
            if not ok:
                return out + [choice]
            self.stats.accepted[j] += 1
            self.stats.accepted_by[draft.source] += 1
            out.append(draft.token)
        return out + [argmax[len(drafts)] if argmax is not None else sampler(rows[len(drafts)], history + out)]

    # ---------------------------------------------------------------------------------------------- the loop

    def generate(self, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
                 stop_ids: frozenset[int] = frozenset()) -> Iterator[int]:
        """Engine.generate's contract (new token ids until a stop id, max_tokens or the end of the context), by verify
        windows; greedy output is plain greedy decoding's. (Requests for logprobs decode plainly: generation.py.)"""
        engine = self.engine
        sampler = Sampler(params)
        logits = engine.prefill(prompt_ids)
        if max_tokens < 1:
            return
        history = list(prompt_ids)
        token = sampler(logits[-1], history)
        history.append(token)
        produced = 1
        yield token
        while produced < max_tokens and token not in stop_ids and len(history) < engine.n_ctx:
            start = len(history) - 1
            # Drafts past max_tokens or the context would be computed for nothing.
            k = min(self.window - 1, max_tokens - produced - 1, engine.n_ctx - len(history))
            lap = self._lap()
            if self._pipelined(sampler, history, k):
                drafts, chosen, lap = self._pipelined_window(history, k, sampler, lap)
            else:
                drafts = self.propose(history, k, sampler) if k > 0 else []
                window = [token] + [d.token for d in drafts]
                lap = self._lap(lap, "draft")
                rows = self.verify(window, start)
                lap = self._lap(lap, "verify")
                chosen = self.accept(rows, drafts, history, sampler)
            for j in range(len(drafts)):
                self.stats.proposed[j] += 1
            emitted = []
            for token in chosen:
                emitted.append(token)
                produced += 1
                if token in stop_ids or produced >= max_tokens or len(history) + len(emitted) >= engine.n_ctx:
                    break
            # The cache holds every emitted token but the last, as after plain decoding.
            self.keep(start, len(emitted))
            self._lap(lap, "accept + keep")
            self.stats.windows += 1
            self.stats.tokens += len(emitted)
            for token in emitted:
                history.append(token)
                yield token

    def _pipelined(self, sampler: Sampler, history: list[int], k: int) -> bool:
        """Whether this window's drafts can go from the MTP graphs into the verify window without the host reading
        them first: greedy, no penalty, no min_p (so the MTP block drafts all k: no prompt-lookup draft follows),
        both static, and the cells to catch up fit one MTP step."""
        from strata import switches

        # Opt-in (STRATA_SPEC_PIPELINE): on the H200 this path's 2- and 4-row windows failed to capture.
        return (switches.get("STRATA_SPEC_PIPELINE") and k > 0 and self.mtp_steps is not None and self.min_p == 0
                and self.windows.takes_tail and _plain_greedy(sampler)
                and 1 <= len(history) - 1 - self.mtp_cells <= self.window)

    def _pipelined_window(self, history: list[int], k: int, sampler: Sampler, lap):
        """A greedy window with one host read: the MTP picks feed the verify window on the device; then the drafts
        and every row's argmax come back together. Returns (drafts, chosen tokens, lap)."""
        engine, steps = self.engine, self.mtp_steps
        first, start = self.mtp_cells, len(history) - 1
        steps.launch(self.hidden[first:start], history[first + 1:start + 1], first, k)
        self.mtp_cells = start
        lap = self._lap(lap, "draft")
        drafted = steps.picks[:k, 0]
        rows = self.verify([history[-1]] + [0] * k, start, tail=drafted)  # placeholders: the device has the drafts
        lap = self._lap(lap, "verify")
        values = [int(v) for v in torch.cat((drafted, rows[:k + 1].argmax(-1).double())).tolist()]
        drafts = [Draft(t, None, "mtp") for t in values[:k]]
        engine.cached_tokens[start + 1:start + 1 + k] = values[:k]
        return drafts, self.accept(rows, drafts, history, sampler, argmax=values[k:]), lap

    def _lap(self, since: float | None = None, part: str | None = None) -> float | None:
        """When measuring (phase_seconds): the device synced, the time now, and the time since `since` added to
        `part`."""
        if self.phase_seconds is None:
            return None
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize(self.engine.device)
        now = time.perf_counter()
        if part is not None:
            self.phase_seconds[part] += now - since
        return now

    def teacher_forced(self, ids: list[int], prefix: int, n: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(position, logits that predict it) for positions prefix+1..prefix+n-1, the text's own tokens read a verify
        window at a time (every row kept): the quality harness's decode path when spec > 1. The caller has just
        prefilled ids[:prefix]."""
        pos = prefix + 1
        while pos < prefix + n:
            start = pos - 1
            window = ids[start:min(start + self.window, prefix + n - 1)]
            rows = self.verify(window, start).clone()  # the windows' logits live in static buffers
            self.keep(start, len(window))
            for r in range(len(window)):
                yield start + 1 + r, rows[r]
            pos += len(window)


def _plain_greedy(sampler: Sampler) -> bool:
    """Greedy with no repetition penalty: the choice is the logits' argmax, which the device can take itself."""
    return sampler.params.greedy and sampler.params.repetition_penalty == 1.0


def _point_mass(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q
