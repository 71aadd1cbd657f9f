"""A model split across cards, run as a pipeline: stage s holds layers bounds[s]..bounds[s+1]-1 (LayerSplit) and the
residual crosses to the next stage once per prompt chunk, decode step or verify window (engine/transport.py).

Prompt chunks go in a wavefront: at tick t stage s runs chunk t - s, so stage 0 starts chunk c+1 while stage 1 runs
chunk c (on CUDA each stage issues to its own stream; on the CPU the same order runs one after the other). Layers see
their chunks in order, so the result is the one-card result. Decode runs step by step through the stages: CUDA graph
decode (engine/decode.py) is off for a split.
"""

from __future__ import annotations

import torch

from strata.engine.context import ForwardContext
from strata.engine.experts import ExpertBackend, ResidentExperts
from strata.engine.offload import offloaded_experts
from strata.engine.placement_split import LayerSplit, SplitPlan, parse_gpus, parse_layer_split, plan_split
from strata.engine.prefill import ProgressClock, prompt_chunks
from strata.engine.transport import InProcessTransport, Transport
from strata.errors import StrataError
from strata.models import load_model


def wavefront(n_chunks: int, n_stages: int) -> list[tuple[int, int]]:
    """(stage, chunk) in issue order: tick by tick, the later stages first (their inputs are ready from the tick
    before), so stage 0's chunk c+1 queues right behind stage 1's chunk c."""
    order = []
    for tick in range(n_chunks + n_stages - 1):
        for stage in reversed(range(n_stages)):
            if 0 <= tick - stage < n_chunks:
                order.append((stage, tick - stage))
    return order


class SplitExperts(ExpertBackend):
    """Each card's own expert backend (all resident, or its cache + CPU pool share) for its layers."""

    name = "split"

    def __init__(self, backends: list[ExpertBackend], split: LayerSplit, transport: Transport):
        self.backends, self.split, self.transport = backends, split, transport

    def start(self, layer, x, weights, ids):
        return self.backends[self.split.stage_of(layer)].start(layer, x, weights, ids)

    def end_step(self) -> None:
        for stage, backend in enumerate(self.backends):
            with self.transport.stage_context(stage):  # a card's cache adapts on the stream that reads it
                backend.end_step()


class Pipeline:
    def __init__(self, model, split: LayerSplit, transport: Transport | None = None):
        self.model, self.split = model, split
        self.transport = transport or InProcessTransport(split.devices)
        self.devices = split.devices
        self.order: list[tuple[int, int]] = []  # the last run's (stage, chunk) order, for tests and tools
        if model.output is model.embed and self.devices[-1] != self.devices[0]:
            model.output = model.embed.to(self.devices[-1])  # a tied head reads its own copy on the last card

    def run(self, chunks: list[tuple[torch.Tensor, ForwardContext]], on_chunk_done=None) -> list[torch.Tensor]:
        """Logits of each chunk (ids on the first card, its context), on the first card; `on_chunk_done(c)` after
        chunk c leaves the last stage."""
        model, n_stages = self.model, self.split.n_stages
        carried: list[tuple | None] = [None] * len(chunks)  # chunk -> (h, cos, sin) on the next stage's card
        outputs: list[torch.Tensor | None] = [None] * len(chunks)
        self.order = wavefront(len(chunks), n_stages)
        self.transport.begin()
        for stage, c in self.order:
            ids, ctx = chunks[c]
            with self.transport.stage_context(stage):
                h, cos, sin = model.begin(ids, ctx) if stage == 0 else carried[c]
                for i in self.split.layers(stage):
                    h = h + model.mixer(i, h, ctx, cos, sin)
                    h = h + model._ffn(i, h)
                if stage < n_stages - 1:
                    carried[c] = self.transport.send(stage, (h, cos, sin))
                    continue
                carried[c] = None
                logits = model.head(h, ctx)
            outputs[c] = self.transport.finish(logits)  # outside the stage: ordered for the caller's streams
            if on_chunk_done is not None:
                on_chunk_done(c)
        return outputs


def run_prompt(engine, ids: list[int], start: int, all_logits: bool) -> torch.Tensor:
    """Engine._forward through the pipeline: every chunk of `ids` from `start`, chunks in flight on several cards."""
    clock = ProgressClock(len(ids), engine.on_prefill_progress if len(ids) > 1 else None)
    equal = isinstance(engine.config.prefill_chunk, str)
    engine.cached_tokens = engine.cached_tokens[:start]
    spans = list(prompt_chunks(len(ids), engine.prefill_chunk, equal))
    device = engine.device
    chunks = [(torch.tensor(ids[b:e], device=device), ForwardContext(engine.kv, start + b, e - b,
                                                                        want_all_logits=all_logits)) for b, e in spans]

    def chunk_done(c: int) -> None:
        engine.cached_tokens += ids[spans[c][0]:spans[c][1]]
        clock.chunk_done(spans[c][1])

    try:
        engine._kv_backend().reserve(start + len(ids))  # grown once here: no stage reallocates a cache another is using
        outputs = engine.pipeline.run(chunks, chunk_done)
    except BaseException:
        # Later chunks may be part-way through the first cards (or a hook stopped the prompt): start over.
        engine.cached_tokens = []
        engine.kv.truncate(0)
        raise
    return torch.cat(outputs) if all_logits else outputs[-1]


def check_split_options(config) -> None:
    """What does not run across cards yet, in one line each."""
    if config.qsa != "none" or config.kv_resident is not None:
        raise StrataError("--gpus does not run --qsa quest or --kv-resident yet (one KV backend per card is dense "
                          "or int8 paged)")
    if config.spec != 1:
        raise StrataError("--gpus does not run --spec yet (the MTP block reads the embedding of the first card)")
    if config.decode_graphs == "on":
        raise StrataError("--gpus decodes step by step through the cards: CUDA graph decode is off for a split")


def load_split(file, model_config, config, dtype: torch.dtype, n_ctx: int, kv_per_value: float):
    """(plan, model with its experts, pipeline) for config.gpus and config.layer_split."""
    check_split_options(config)
    devices = parse_gpus(config.gpus)
    layer_split = parse_layer_split(config.layer_split) if isinstance(config.layer_split, str) \
        else tuple(config.layer_split)
    plan: SplitPlan = plan_split(file, model_config, devices, n_ctx, kv_per_value, config.vram_budget, layer_split,
                                 config.expert_cache)
    split = plan.split
    model = load_model(file, devices[0], dtype, progress=config.progress, split=split)
    pipeline = Pipeline(model, split)
    backends = []
    for stage, card in enumerate(plan.cards):
        stacks = {layer: s for layer, s in model.expert_stacks.items() if split.stage_of(layer) == stage}
        if card.all_resident:
            backends.append(ResidentExperts(stacks))
        else:  # this card's cache, sized to its memory, and its own CPU pool over its layers' host experts
            backends.append(offloaded_experts(stacks, card, devices[stage], config))
    model.experts = SplitExperts(backends, split, pipeline.transport)
    return plan, model, pipeline
