"""Captured decode for a model split across cards (engine/pipeline.py): each card (stage) runs its own static
program over its layer range, recorded into CUDA graphs on its own stream, and the residual crosses each boundary
once per step.

Stage s holds the same pieces as one card's GraphDecoder (engine/decode.py), restricted to its layers: device
buffers for the positions (stage 0 also the tokens), a static view of its own KV backend (and GatedDeltaNet states),
and, where its experts sit behind its own cache, the doorbell segments of its MoE layers (routing published to the
host, the cache looked up, misses to the shared CPU pool, the slot table uploaded, the expert and combine graphs
replayed). The first segment of stage s > 0 reads (h, cos, sin) from its inbox; the last segment of a stage before
the last packs them into its outbox; between the two stages' replays the transport copies outbox -> inbox
(`Transport.send_into`: a peer copy on the sender's stream that the receiver's stream waits for, or pinned host
staging), so the copy sits outside the graphs and no graph spans two cards. The last stage computes the logits.

The CPU form (`capture=False`) calls the very same segment functions eagerly on CPU "devices", so tests check the
code the graphs hold. Verify windows (--spec) stay uncaptured across cards: they run the pipeline's eager forward.
"""

from __future__ import annotations

import sys
from collections import Counter

import torch

from strata.engine.decode import (GraphDecoder, Program, StaticContext, StepGraphs, _experts_segment,
                                  _storage_signature, graphs_wanted, publish)
from strata.engine.experts import CachedExperts, ResidentExperts, kernel_path
from strata.engine.hybrid_cache import HybridCache
from strata.engine.split_cache import SplitKV
from strata.engine.static_kv import StaticHybrid, check_static, span_for, static_kv
from strata.errors import StrataError
from strata.models.decoder import DecoderLM


class StaticSplitKV(SplitKV):
    """One stage's static view of a split KV cache: that stage's backends seen through static views at its own
    positions; a slot of another card's backend is not this stage's to touch."""

    def __init__(self, cache: SplitKV, stage: int, positions: torch.Tensor, span: int):  # noqa: shares, no alloc
        self.__dict__.update(cache.__dict__)
        views = {id(b): static_kv(b, positions, span) for b, s in zip(cache.backends, cache.stages) if s == stage}
        self.owner = [(views.get(id(backend)), local) for backend, local in cache.owner]
        self.stage = stage

    def _at(self, slot: int):
        view, local = self.owner[slot]
        if view is None:
            raise StrataError(f"KV slot {slot} lives on another card than stage {self.stage}")
        return view, local

    def reserve(self, n_tokens: int) -> None:
        """Nothing inside a step: the runner reserved every card's cache before."""

    def truncate(self, length: int) -> None:
        raise StrataError("a static decode view cannot truncate; truncate the engine's cache")


def stage_view(cache, stage: int, positions: torch.Tensor, span: int):
    """A stage's static view of the engine's split cache (a SplitKV, or a HybridCache over one)."""
    if type(cache) is HybridCache:
        return StaticHybrid(cache, stage_view(cache.kv, stage, positions, span))
    return StaticSplitKV(cache, stage, positions, span)


def check_split_static(cache) -> None:
    """A StrataError unless every card's backend has a static view (dense or int8 paged, no selector)."""
    inner = cache.kv if type(cache) is HybridCache else cache
    if not isinstance(inner, SplitKV):
        raise StrataError(f"a split's decode graphs need its per-card cache, got {type(inner).__name__}")
    for backend in inner.backends:
        check_static(backend)


class StageGraphs(StepGraphs):
    """A stage's segments recorded on its card's stream (the class default side stream lives on one card)."""

    def __init__(self, program: Program, capture: bool, pool=None, stream=None):
        if not capture or stream is None:
            super().__init__(program, capture, pool)
            return
        self.program, self.graphs = program, []
        for fn in program.segments:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                fn()
            self.graphs.append(graph)


class Stage:
    """One card's part of a decode step of `rows` tokens: its static buffers, its programs (one per span)."""

    # One card's doorbell loop and routing buffers are GraphDecoder's own, run over this card's routed layers with
    # the stage in the decoder's place (the same attribute names: model, rows, capture, cached, device, host_seconds).
    execute = GraphDecoder._execute
    _routing_buffers = GraphDecoder._routing_buffers

    def __init__(self, decoder: "SplitGraphDecoder", stage: int, experts):
        model, rows, split = decoder.model, decoder.rows, decoder.split
        self.decoder, self.index, self.layers = decoder, stage, split.layers(stage)
        self.model, self.rows = model, rows
        self.host_seconds: Counter = Counter()  # the doorbell loop's host time by part (`strata bench decode`)
        self.device = split.devices[stage]
        self.first, self.last = stage == 0, stage == split.n_stages - 1
        self.experts = experts  # this card's backend: ResidentExperts or CachedExperts
        # Misses the card reads itself (`--misses direct`) need no host between layers: one segment, as resident.
        self.cached = experts if isinstance(experts, CachedExperts) and not experts.direct else None
        if self.cached is not None and self.cached.pcie_frac > 0:
            raise StrataError("decode graphs do not run PCIe-streamed misses yet (pcie_frac > 0)")
        if decoder.capture:
            stacks = experts.host_stacks if isinstance(experts, CachedExperts) else experts.stacks
            probe = torch.empty(rows, model.config.n_embd, dtype=model.dtype, device=self.device)
            if any(kernel_path(s, probe) != "decode" for s in stacks.values()):
                raise StrataError(f"card {stage}: the experts' shapes or formats (or float32 activations) have no "
                                  "decode kernel; their reference loop cannot be captured")
        self.tokens = torch.zeros(rows, dtype=torch.long, device=self.device) if self.first else None
        self.positions = torch.zeros(rows, dtype=torch.long, device=self.device)
        # What crosses to the next card, packed in one buffer (one copy a step): h, then RoPE's cos and sin.
        cos, _ = model.rope.cos_sin(torch.zeros(rows, dtype=torch.long, device=model.device), model.dtype)
        self.widths = (model.config.n_embd, cos.shape[-1], cos.shape[-1])
        packed = (rows, sum(self.widths))
        self.inbox = None if self.first else torch.zeros(packed, dtype=model.dtype, device=self.device)
        self.outbox = None if self.last else torch.zeros(packed, dtype=model.dtype, device=self.device)
        self.pool = torch.cuda.graph_pool_handle() if decoder.capture else None
        self.programs: dict[int, StepGraphs] = {}
        self.uploaded = None  # CUDA event after this stage's last upload from the decoder's staging buffer

    @property
    def capture(self) -> bool:
        return self.decoder.capture

    def upload(self, staging: torch.Tensor) -> None:
        """This step's tokens (first card) and positions into the stage's buffers, on its stream."""
        if self.first:
            self.tokens.copy_(staging[0], non_blocking=True)
        self.positions.copy_(staging[1], non_blocking=True)
        if self.device.type == "cuda":
            self.uploaded = self.uploaded or torch.cuda.Event()  # one event, recorded again each step
            self.uploaded.record()

    def run(self, span: int) -> dict:
        """The stage's part of one step (eager the first time at a span, then captured): its stash."""
        decoder = self.decoder
        if not decoder.capture:
            runner = StageGraphs(self.program(span), capture=False)
            self.execute(runner)
        elif span not in self.programs:  # a span's first step compiles every kernel eagerly, then captures
            runner = StageGraphs(self.program(span), capture=False)
            self.execute(runner)
            decoder.capture_stage(self, span)
        else:
            runner = self.programs[span]
            self.execute(runner)
        self.experts.end_step()  # this card's cache adapts, on the stream that reads it
        return runner.program.stash

    def program(self, span: int) -> Program:
        """The stage's segment functions at `span`: GraphDecoder._program's loop over this card's layers."""
        model, rows, end = self.decoder.model, self.decoder.rows, self.layers.stop
        view = stage_view(self.decoder.kv, self.index, self.positions, span)
        ctx = StaticContext(view, start=0, n_tokens=rows, want_all_logits=rows > 1, position_tensor=self.positions)
        routed = [i for i in self.layers if model.is_moe(i)] if self.cached is not None else []
        stash = self._routing_buffers()
        program = Program([], routed, stash)

        def layers(first: int, stop: int) -> None:
            """Mixers and FFNs of layers first..stop-1, then (stop < the stage's end) the mixer and routing of stop."""
            h, cos, sin = stash["h"], stash["cos"], stash["sin"]
            for i in range(first, min(stop, end)):
                h = h + model.mixer(i, h, ctx, cos, sin)
                h = h + model._ffn(i, h)
            if stop < end:
                h = h + model.mixer(stop, h, ctx, cos, sin)
                publish(stash, *model.route(stop, h))
            stash["h"] = h

        def finish() -> None:
            if self.last:
                stash["logits"] = model.logits(stash["h"], ctx)
            else:
                torch.cat((stash["h"], stash["cos"], stash["sin"]), dim=-1, out=self.outbox)

        def first_segment() -> None:
            if self.first:
                stash["h"], stash["cos"], stash["sin"] = model.begin(self.tokens, ctx)
            else:  # what the card before sent: its residual and the step's RoPE rows
                stash["h"], stash["cos"], stash["sin"] = (
                    part.contiguous() for part in self.inbox.split(self.widths, dim=-1))
            layers(self.layers.start, routed[0] if routed else end)
            if not routed:
                finish()

        program.segments.append(first_segment)
        for j, layer in enumerate(routed):
            program.segments.append(lambda layer=layer: _experts_segment(model, self.cached, layer, stash))
            after = routed[j + 1] if j + 1 < len(routed) else end

            def combine_segment(layer=layer, after=after) -> None:
                part = stash["part"]  # the shared expert joins as one card's combine does (gated where it is)
                stash["h"] = stash["h"] + model.with_shared(layer, part + stash["cpu"].to(part.dtype), stash["shared"],
                                                            stash["x"])
                layers(layer + 1, after)
                if after >= end:
                    finish()

            program.segments.append(combine_segment)
        return program


class SplitGraphDecoder:
    """Decode steps of `rows` tokens across the cards of a Pipeline: each card's Stage in turn, the packed
    residual sent between them. `capture`: CUDA graphs per card (True) or the CPU form (False); `exact_span` as
    GraphDecoder's (the CPU form attends over exactly the step's cells)."""

    def __init__(self, model, kv, pipeline, capture: bool, rows: int = 1, exact_span: bool | None = None):
        self.model, self.kv, self.pipeline, self.rows, self.capture = model, kv, pipeline, rows, capture
        self.split, self.transport = pipeline.split, pipeline.transport
        self.device = self.split.devices[0]
        self.exact_span = (not capture) if exact_span is None else exact_span
        if capture and self.exact_span:
            raise StrataError("captured decode needs a fixed span (exact_span=False)")
        if type(model).forward is not DecoderLM.forward:  # the stages' segments are DecoderLM.forward's loop
            raise StrataError(f"{type(model).__name__} runs its own forward step, which has no static form yet")
        check_split_static(kv)
        backends = pipeline.card_experts or [model.experts] * self.split.n_stages
        if not all(isinstance(b, (ResidentExperts, CachedExperts)) for b in backends):
            raise StrataError("a split's decode graphs run resident or cached experts on each card")
        self.stages: list[Stage] = []
        for s in range(self.split.n_stages):
            with self.transport.stage_context(s):
                self.stages.append(Stage(self, s, backends[s]))
        pin = self.device.type == "cuda"
        self.staging = torch.zeros(2, rows, dtype=torch.long, pin_memory=pin)  # tokens, positions
        self.staging_numpy = self.staging.numpy()
        self.signature = None
        self.steps = 0

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def host_seconds(self) -> Counter:
        """The cards' doorbell loops' host seconds by part, summed."""
        return sum((s.host_seconds for s in self.stages), Counter())

    @property
    def programs(self) -> dict[int, list[StepGraphs]]:
        """span -> each stage's captured graphs (the spans every card holds)."""
        spans = set.intersection(*(set(s.programs) for s in self.stages))
        return {span: [s.programs[span] for s in self.stages] for span in sorted(spans)}

    def step(self, tokens: list[int], start: int) -> torch.Tensor:
        """Logits float32 [rows, vocab] ([1, vocab] when rows == 1) after tokens at start.., on the first card."""
        if len(tokens) != self.rows:
            raise StrataError(f"this decoder runs steps of {self.rows} tokens, got {len(tokens)}")
        end = start + self.rows
        span = end if self.exact_span else span_for(end, self.kv.max_tokens)
        self._reserve(start, end if self.exact_span else self.kv.max_tokens)
        for stage in self.stages:
            if stage.uploaded is not None:
                stage.uploaded.synchronize()  # the last step's uploads have left the staging buffer
        self.staging_numpy[0] = tokens  # through numpy: no tensor made per step
        self.staging_numpy[1] = range(start, end)
        self.transport.begin()  # every card's stream after what the caller queued (cache growth)
        stash = None
        for stage in self.stages:
            with self.transport.stage_context(stage.index):
                stage.upload(self.staging)
                stash = stage.run(span)
            if not stage.last:
                self.transport.send_into(stage.index, stage.outbox, self.stages[stage.index + 1].inbox)
        self.steps += 1
        return self.transport.finish(stash["logits"])

    def capture_stage(self, stage: Stage, span: int) -> None:
        try:
            stream = torch.cuda.current_stream(stage.device)  # the card's own stream (inside its stage context)
            stage.programs[span] = StageGraphs(stage.program(span), capture=True, pool=stage.pool, stream=stream)
        except Exception as exc:  # an op that cannot be captured: every card keeps the same static code, uncaptured
            self.capture = False
            for s in self.stages:
                s.programs.clear()
            print(f"strata: decode graphs off: capture failed on card {stage.index} ({type(exc).__name__}: "
                  f"{str(exc).splitlines()[0]}); decoding with the same static steps uncaptured", file=sys.stderr)

    def _reserve(self, start: int, n_tokens: int) -> None:
        cache, states = self.kv, ()
        if isinstance(cache, HybridCache):
            cache.begin(start, self.rows)
            states = tuple(t.data_ptr() for t in (*cache.conv.values(), *cache.state.values()))
            cache = cache.kv
        cache.reserve(n_tokens)
        signature = sum((_storage_signature(b) for b in cache.backends), ()) + states
        if signature != self.signature:  # a card's cache moved (it grew, or pages were handed out anew): recapture
            for stage in self.stages:
                stage.programs.clear()
            self.signature = signature


def make_split_decoder(model, kv, pipeline, option: str) -> SplitGraphDecoder | None:
    """The engine's decoder for a split's one-token steps, or None (step by step) with one line saying why."""
    mode = graphs_wanted(option, pipeline.split.devices[0])
    if mode == "off":
        return None
    try:
        return SplitGraphDecoder(model, kv, pipeline, capture=mode == "graphs")
    except StrataError as exc:
        print(f"strata: decode graphs off for the split: {exc}; decoding step by step", file=sys.stderr)
        return None
