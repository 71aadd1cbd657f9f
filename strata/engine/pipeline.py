"""A model split across cards, run as a pipeline: stage s holds layers bounds[s]..bounds[s+1]-1 (LayerSplit) and the
residual crosses to the next stage once per prompt chunk, decode step or verify window (engine/transport.py).

Prompt chunks go in a wavefront: at tick t stage s runs chunk t - s, so stage 0 starts chunk c+1 while stage 1 runs
chunk c (on CUDA each stage issues to its own stream; on the CPU the same order runs one after the other). Layers see
their chunks in order, so the result is the one-card result. Decode steps run as each card's captured graphs
(engine/decode_split.py); verify windows, and decode with graphs off, run through the stages step by step here.
"""

from __future__ import annotations

import queue
import threading

import torch

from strata.engine.context import ForwardContext
from strata.engine.cpu_pool import CPUExpertPool
from strata.engine.experts import CachedExperts, ExpertBackend, ResidentExperts
from strata.engine.offload import load_profile, offloaded_experts
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
    """Each card's own expert backend (all resident, or its cache + CPU pool share) for its layers. The pipeline
    calls each card's `end_step` once the card is through a step, in the card's own stage (stream, thread)."""

    name = "split"

    def __init__(self, backends: list[ExpertBackend], split: LayerSplit):
        self.backends, self.split = backends, split

    def start(self, layer, x, weights, ids):
        return self.backends[self.split.stage_of(layer)].start(layer, x, weights, ids)

    def end_step(self) -> None:
        """Nothing here: Pipeline.stage_step ends each card's step (the head runs on the last card only)."""


class Pipeline:
    """Runs chunks through the stages: in wavefront order on one thread (the CPU form, and any single step), or on
    CUDA with one thread per stage, so a stage waiting on the host (routing, the CPU pool) never holds up the others.
    Both keep each stage's chunks in order and each chunk's stages in order: the same results."""

    def __init__(self, model, split: LayerSplit, transport: Transport | None = None, threads: bool | None = None):
        self.model, self.split = model, split
        self.transport = transport or InProcessTransport(split.devices)
        self.devices = split.devices
        self.threads = any(d.type == "cuda" for d in self.devices) if threads is None else threads
        self.card_experts: list[ExpertBackend] | None = None  # each card's backend (load_split), to end its steps
        self.order: list[tuple[int, int]] = []  # the last run's (stage, chunk) steps as they finished
        self._lock = threading.Lock()
        if model.output is model.embed and self.devices[-1] != self.devices[0]:
            model.output = model.embed.to(self.devices[-1])  # a tied head reads its own copy on the last card
        model.forward = self.forward  # every caller of the model's step (a verify window) runs through the stages

    def forward(self, ids: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """The model's forward step, one chunk through every stage."""
        return self.run([(ids, ctx)])[0]

    def stage_step(self, stage: int, ids: torch.Tensor, ctx: ForwardContext, carried):
        """Stage `stage`'s layers of one chunk: what goes to the next stage (h, cos, sin), or the last stage's logits
        (on its card; `Transport.finish` brings them to the caller)."""
        model = self.model
        with self.transport.stage_context(stage):
            h, cos, sin = model.begin(ids, ctx) if stage == 0 else carried
            for i in self.split.layers(stage):
                h = h + model.mixer(i, h, ctx, cos, sin)
                h = h + model._ffn(i, h)
            out = model.head(h, ctx) if stage == self.split.n_stages - 1 else self.transport.send(stage, (h, cos, sin))
            if self.card_experts is not None:
                self.card_experts[stage].end_step()  # this card's experts adapt, on the stream that reads them
        return out

    def _step(self, stage: int, c: int, chunks, carried):
        out = self.stage_step(stage, *chunks[c], carried)
        with self._lock:
            self.order.append((stage, c))
        return out

    def run(self, chunks: list[tuple[torch.Tensor, ForwardContext]], on_chunk_done=None) -> list[torch.Tensor]:
        """Logits of each chunk (ids on the first card, its context), on the first card; `on_chunk_done(c)` after
        chunk c leaves the last stage, in order."""
        self.order = []
        self.transport.begin()
        if self.threads and len(chunks) > 1:
            return self._run_threaded(chunks, on_chunk_done)
        return self._run_in_order(chunks, on_chunk_done)

    def _run_in_order(self, chunks, on_chunk_done) -> list[torch.Tensor]:
        last = self.split.n_stages - 1
        carried: list = [None] * len(chunks)  # chunk -> (h, cos, sin) on the next stage's card
        outputs: list = [None] * len(chunks)
        for stage, c in wavefront(len(chunks), self.split.n_stages):
            out = self._step(stage, c, chunks, carried[c])
            carried[c] = None if stage == last else out
            if stage == last:
                outputs[c] = self.transport.finish(out)
                if on_chunk_done is not None:
                    on_chunk_done(c)
        return outputs

    def _run_threaded(self, chunks, on_chunk_done) -> list[torch.Tensor]:
        n_stages, n_chunks = self.split.n_stages, len(chunks)
        inboxes = [queue.SimpleQueue() for _ in range(n_stages + 1)]  # inboxes[n_stages]: finished logits
        stop, errors = threading.Event(), []
        modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())  # thread-local: carried into workers

        def worker(stage: int) -> None:
            finished = False
            try:
                with torch.inference_mode(modes[0]), torch.set_grad_enabled(modes[1]):
                    for c in range(n_chunks):
                        carried = inboxes[stage].get() if stage else None
                        if (stage and carried is None) or stop.is_set():
                            return
                        inboxes[stage + 1].put(self._step(stage, c, chunks, carried))
                finished = True
            except BaseException as exc:  # handed to the caller's thread, which raises it
                errors.append(exc)
                stop.set()
            finally:
                if not finished:
                    inboxes[stage + 1].put(None)  # the next stage (or the caller) stops waiting

        workers = [threading.Thread(target=worker, args=(s,), name=f"strata-stage-{s}", daemon=True)
                   for s in range(n_stages)]
        for w in workers:
            w.start()
        outputs = []
        try:
            for c in range(n_chunks):
                logits = inboxes[n_stages].get()
                if logits is None:
                    break
                outputs.append(self.transport.finish(logits))
                if on_chunk_done is not None:
                    on_chunk_done(c)
        finally:
            stop.set()  # a hook that raised: the stages stop after their current chunk
            for w in workers:
                w.join()
        if errors:
            raise errors[0]
        return outputs


def run_prompt(engine, ids: list[int], start: int, all_logits: bool) -> torch.Tensor:
    """Engine._forward through the pipeline: every chunk of `ids` from `start`, chunks in flight on several cards."""
    clock = ProgressClock(len(ids), engine.on_prefill_progress if len(ids) > 1 else None)
    equal = isinstance(engine.config.prefill_chunk, str)
    engine.cached_tokens = engine.cached_tokens[:start]
    spans = list(prompt_chunks(len(ids), engine.prefill_chunk, equal))
    device = engine.device
    want_hidden = engine.spec is not None and engine.spec.wants_hidden
    chunks = [(torch.tensor(ids[b:e], device=device),
               ForwardContext(engine.kv, start + b, e - b, want_all_logits=all_logits, want_hidden=want_hidden,
                              tokens=ids[b:e]))
              for b, e in spans]

    def chunk_done(c: int) -> None:
        (begin, end), ctx = spans[c], chunks[c][1]
        engine.cached_tokens += ids[begin:end]
        if want_hidden:
            engine.spec.saw_hidden(start + begin, ctx.hidden)
        clock.chunk_done(end)

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
    profile = load_profile(config.expert_profile, model.expert_stacks) if config.expert_profile else None
    for stage, card in enumerate(plan.cards):
        stacks = {layer: s for layer, s in model.expert_stacks.items() if split.stage_of(layer) == stage}
        if card.all_resident:
            backends.append(ResidentExperts(stacks))
        else:  # this card's cache, sized to its memory, filled with its layers' share of the profile
            ranking = None if profile is None else [key for key in profile if key[0] in stacks]
            backends.append(offloaded_experts(stacks, card, devices[stage], config, ranking))
    share_cpu_pool([b for b in backends if isinstance(b, CachedExperts)])
    model.experts = SplitExperts(backends, split)
    pipeline.card_experts = backends
    return plan, model, pipeline


def share_cpu_pool(backends: list[CachedExperts]) -> None:
    """One CPU pool (one worker) serves every card's misses, each card its own layers' share: the cards share the
    host's cores, and numba's parallel kernels must not run from two threads at once (its workqueue layer aborts)."""
    if len(backends) < 2:
        return
    host = {layer: stack for b in backends for layer, stack in b.host_stacks.items()}
    # the threads and spin the config asked each card's pool for
    shared = CPUExpertPool(host, backends[0].pool.threads, backends[0].pool.spin_us)
    for backend in backends:
        backend.pool.close()
        backend.pool = shared
