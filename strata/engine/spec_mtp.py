"""MTP drafting through static buffers: the MTP block's cells as CUDA graphs (one per row count and span), chained
on the device so that a window's drafts cost one host read, not one per draft.

A window's drafts come from (engine/spec.py): a catch-up over the cells the last window's accepted tokens opened
(1..T rows: the trunk's hidden states paired with the next tokens), whose last row drafts the first token; then a
draft after a draft, one row each, feeding the block its own output. Here each program, after the block, picks its
last row's greedy token and that token's probability on the device and writes the next one-row step's inputs
(the token, the block's output, the position + 1) into the static input buffers itself; so the host replays the
one-row program k-1 times with nothing in between but a copy of each pick into a row of `picks`, and reads the k
picks once at the end. Drafts past a `--spec-min-p` stop are computed for nothing and dropped by the host: their
MTP keys sit at positions the next catch-up rewrites before anything reads them (as the eager path's do). Without
min_p the host need not read them at all before the window: `launch` leaves them on the device, the verify window
takes them from there (GraphDecoder.step's `tail`), and the drafts come back with the rows' argmax in the window's
one read (SpecDecoder._pipelined_window).

Qwen3-Next's MTP blocks and qwen4exp's (whose drafts read the trunk's residual stack [hc, embd], float32) have this
static step. It serves greedy drafting without a repetition penalty (the device's argmax is the sampler's);
sampling and penalties draft eagerly (spec.py). The CPU form (`capture=False`) runs the same program functions over an exact
span, so its logits and picks are the eager `mtp_forward`'s byte for byte (tests/engine/test_spec_mtp.py).
"""

from __future__ import annotations

import sys

import torch

from strata.engine.decode import StaticContext, _storage_signature
from strata.engine.experts import CachedExperts, ResidentExperts, kernel_path
from strata.engine.staging import TokenUpload
from strata.engine.static_kv import check_static, span_for, static_kv
from strata.errors import StrataError


class MTPSteps:
    """The MTP block (block 0) over 1..max_rows cells at a time through static buffers; `capture`: CUDA graphs."""

    def __init__(self, model, cache, device: torch.device, capture: bool, max_rows: int, hidden_dtype: torch.dtype,
                 max_drafts: int):
        from strata.models.qwen3next import Qwen3NextLM
        from strata.models.qwen4exp import Qwen4ExpLM

        # The MTP steps whose every op takes a static context: Qwen3-Next's and qwen4exp's (not a subclass's own).
        if getattr(type(model), "mtp_step", None) not in (Qwen3NextLM.mtp_step, Qwen4ExpLM.mtp_step):
            raise StrataError(f"{type(model).__name__}'s MTP block has no static step")
        check_static(cache)
        experts = model.experts
        if not (isinstance(experts, ResidentExperts) or (isinstance(experts, CachedExperts) and experts.direct)):
            raise StrataError("the MTP block's experts are looked up on the host (an expert cache): no static step")
        self.device, self.capture = torch.device(device), capture
        self.model, self.cache, self.max_rows = model, cache, max_rows
        if capture:
            stacks = experts.stacks if isinstance(experts, ResidentExperts) else experts.host_stacks
            probe = torch.empty(1, model.config.n_embd, dtype=model.dtype, device=self.device)
            stack = stacks.get(model.n_main)
            if stack is not None and kernel_path(stack, probe) != "decode":
                raise StrataError("the MTP block's experts have no decode kernel; their reference loop cannot be captured")
        # A draft's hidden state: the final normed state [embd], or qwen4exp's residual stack [hc, embd] (float32).
        shape, hidden_dtype = getattr(model, "mtp_hidden", ((model.config.n_embd,), hidden_dtype))
        self.hidden = torch.zeros(max_rows, *shape, dtype=hidden_dtype, device=self.device)
        self.ids = torch.zeros(max_rows, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(max_rows, dtype=torch.long, device=self.device)
        self.picks = torch.zeros(max(max_drafts, 1), 2, dtype=torch.float64, device=self.device)  # token, probability
        self.upload = TokenUpload(max_rows, self.device)
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.programs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph | None, dict]] = {}
        self.signature = None
        self.replays = 0  # program runs so far (one per catch-up piece and per chained draft)

    # ---- host side

    def draft(self, trunk_hidden: torch.Tensor, next_ids: list[int], start: int, k: int) -> list[tuple[int, float]]:
        """Cells start..start+n-1 (n = len(next_ids) <= max_rows: trunk_hidden [n, ...] paired with next_ids),
        then k-1 drafts after drafts: the k greedy picks (token, probability), read from the device at once."""
        self.launch(trunk_hidden, next_ids, start, k)
        return [(int(token), prob) for token, prob in self.picks[:k].tolist()]

    def launch(self, trunk_hidden: torch.Tensor, next_ids: list[int], start: int, k: int) -> None:
        """`draft`'s work, its picks left on the device (`picks[:k]`: token, probability as float64)."""
        rows = len(next_ids)
        if not 1 <= rows <= self.max_rows or not 1 <= k <= self.picks.shape[0]:
            raise StrataError(f"an MTP step of {rows} rows and {k} drafts (at most {self.max_rows} and "
                              f"{self.picks.shape[0]})")
        exact = not self.capture
        # All programs of this call share one span (captured) or each attends over exactly its cells (CPU form).
        span = None if exact else span_for(start + rows + k - 1, self.cache.max_tokens)
        self._reserve(start + rows + k - 1)
        self.upload(next_ids, start, self.ids, self.positions)
        self.hidden[:rows].copy_(trunk_hidden)
        self._run(rows, span or start + rows, 0)
        for j in range(1, k):  # the program left the next step's inputs in place: nothing to upload
            self._run(1, span or start + rows + j, j)

    def _run(self, rows: int, span: int, pick: int) -> None:
        key = (rows, span)
        if not self.capture:
            self._program(rows, span)()
            stash = self._stash
        elif key not in self.programs:  # a span's first step runs eagerly (compiling every kernel); then capture
            self._program(rows, span)()
            stash = self._stash
            self._capture(rows, span)
        else:
            graph, stash = self.programs[key]
            graph.replay()
        self.picks[pick].copy_(stash["pick"])
        self.replays += 1

    def _capture(self, rows: int, span: int) -> None:
        fn = self._program(rows, span)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                fn()
        except Exception as exc:  # an op that cannot be captured: the same static programs, uncaptured
            self.capture = False
            self.programs.clear()
            print(f"strata: MTP draft graphs off: capture failed ({type(exc).__name__}: {str(exc).splitlines()[0]})",
                  file=sys.stderr)
            return
        self.programs[(rows, span)] = (graph, self._stash)

    def _reserve(self, end: int) -> None:
        """The whole context's cells before any capture (else up to `end`); a cache whose storage moved invalidates
        the graphs."""
        self.cache.reserve(self.cache.max_tokens if self.capture else end)
        signature = _storage_signature(self.cache)
        if signature != self.signature:
            self.programs.clear()
            self.signature = signature

    # ---- the program

    def _program(self, rows: int, span: int):
        """The block over the static inputs' first `rows` rows, then its last row's pick and the next one-row step's
        inputs written in place. Its outputs go to a stash of its own (`self._stash` once built)."""
        model, stash = self.model, {}
        positions = self.positions[:rows]
        ctx = StaticContext(static_kv(self.cache, positions, span), start=0, n_tokens=rows, position_tensor=positions)

        def run() -> None:
            logits, out = model.mtp_step(self.hidden[:rows], self.ids[:rows], ctx)
            row = logits[-1]
            token = torch.argmax(row)  # the sampler's greedy choice: the first of equal maxima, as on the host
            # The argmax's probability is the softmax's largest: indexing by the 0-dim device tensor `token` reads it
            # on the host (a sync, which a CUDA graph capture cannot hold: session 5's captures failed there).
            prob = torch.softmax(row, -1).max()
            stash["pick"] = torch.stack((token.double(), prob.double()))
            stash["logits"], stash["out"] = logits, out
            # The next one-row step (a draft after this draft): its token, its hidden state, its position.
            self.ids[0] = token
            self.hidden[0].copy_(out[-1])
            self.positions[0] = positions[-1] + 1

        self._stash = stash
        return run


def make_mtp_steps(spec) -> MTPSteps | None:
    """The SpecDecoder's MTP static step, beside its verify windows (captured where they are), or None (eager
    drafts, said in one line) where the model or its cache has none."""
    engine, windows = spec.engine, spec.windows
    try:
        return MTPSteps(engine.model, spec.mtp_cache, engine.device, windows.capture, spec.window, engine.model.dtype,
                        spec.window - 1)
    except StrataError as exc:
        print(f"strata: MTP drafts step by step: {exc}", file=sys.stderr)
        return None
