"""Captured decode: a token's work as CUDA graphs over static buffers, replayed with no allocation and no Python
per kernel.

The inputs of a step (token ids, positions) live in device tensors the graphs read; the KV cache is seen through
a static view (engine/static_kv.py) whose attention spans a fixed number of cells (a power of two, one set of
graphs per span). A step of `rows` tokens (1 for decode; a fixed T for a verify window) runs as:

- experts all resident: one graph, embedding to logits;
- experts behind the GPU cache (CachedExperts): segments. Segment j ends at MoE layer j's routing and publishes
  (x, weights, ids) to host memory; the host looks the experts up, hands the misses to the CPU pool, uploads the
  slot table and replays the expert graph (cached experts + shared expert) while the pool computes; it then
  uploads the pool's result and replays segment j+1, which adds it to the residual and runs on to the next
  routing. The same split as reference/strata-architecture.md section 2 (doorbell, pool, combine).

`Program` holds one step's segment functions; `StepGraphs` either records them into graphs (`capture=True`) or
calls them as they are (the CPU form: the same functions and buffers, eagerly, so CPU tests check the very code
the graphs hold). A span's first step runs eagerly (compiling every kernel) and is captured after; captures
never execute, so no state moves twice.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from strata.engine.context import ForwardContext
from strata.engine.experts import CachedExperts, ResidentExperts, kernel_path
from strata.engine.hybrid_cache import HybridCache
from strata.engine.staging import TokenUpload
from strata.engine.static_kv import check_static, span_for, static_kv
from strata.errors import StrataError
from strata.models import dp4a_step
from strata.models.decoder import DecoderLM
from strata.models.layers import add_norm_route, add_rms_norm, rms_norm
from strata.models.weights import rows_as_steps


@dataclass
class StaticContext(ForwardContext):
    """A forward context whose positions are a device tensor (the graphs' input), not a host range."""

    position_tensor: torch.Tensor | None = None

    def positions(self, device: torch.device) -> torch.Tensor:
        return self.position_tensor

    def attend(self, layer, q, k, v, selection=None):
        """The static views take a window's rows at once, each row as its one-token step (static_kv.py)."""
        return self.kv.attend(layer, q, k, v, self.start, *(() if selection is None else (selection,)))

    def attend_normed(self, layer, q, k, v, norm):
        return self.kv.attend_normed(layer, q, k, v, self.start, norm)

    def attend_projected(self, layer, x, qkv, heads, norm, config):
        """The static view's chained projection + norm + RoPE + store, then attention (STRATA_DECODE_CHAIN)."""
        taker = getattr(self.kv, "attend_projected", None)
        return None if taker is None else taker(layer, x, qkv, heads, norm, config)


@dataclass
class Published:
    """A routed layer's step state on the host: what the segment before it copied out (pinned on CUDA)."""

    x: torch.Tensor  # float32 [T, embd]
    weights: torch.Tensor  # float32 [T, k]
    ids: torch.Tensor  # int64 [T, k]


@dataclass
class Program:
    """The segment functions of one step at one span, over shared static state (`stash`). `routed` lists the MoE
    layers whose experts run outside the first segment (empty when all experts are resident)."""

    segments: list[Callable[[], None]]
    routed: list[int]
    stash: dict = field(default_factory=dict)


class StepGraphs:
    """Runs a program's segments: each recorded once into a CUDA graph then replayed, or (the CPU form) called."""

    def __init__(self, program: Program, capture: bool, pool=None):
        self.program, self.graphs = program, None
        if capture:
            self.graphs = []
            for fn in program.segments:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    fn()
                self.graphs.append(graph)

    def run(self, j: int) -> None:
        if self.graphs is None:
            self.program.segments[j]()
        else:
            self.graphs[j].replay()


class GraphDecoder:
    """Decode steps of `rows` tokens through static buffers. `capture`: CUDA graphs (True) or the CPU form (False).
    `exact_span`: attend over exactly the step's cells (the CPU form: byte-identical to the engine's eager step)
    instead of the power-of-two span the graphs need. A verify window (engine/spec_windows.py) also asks for
    `want_hidden` (the rows' final hidden states, `hidden` after a step) and `keep_row_states` (a hybrid cache's
    recurrent states after every row, left in static buffers (`row_buffers`, made here unless given: layer ->
    conv [>= rows, ...], state [>= rows, ...]) that the cache's `window_rows` then names for keep_rows); `pool`
    shares one graph memory pool between the decoders of several row counts."""

    takes_tail = True  # a window's drafts may come as a device tensor (step's `tail`), read by the graphs alone
    takes_head = True  # a step's token may come as a device tensor (step's `head`: engine/decode_ahead.py)

    def __init__(self, model, kv, device: torch.device, capture: bool, rows: int = 1, exact_span: bool | None = None,
                 want_hidden: bool = False, keep_row_states: bool = False, pool=None, row_buffers=None):
        self.model, self.kv, self.device, self.rows = model, kv, torch.device(device), rows
        self.capture, self.want_hidden, self.keep_row_states = capture, want_hidden, keep_row_states
        self.hidden: torch.Tensor | None = None  # the last step's final hidden states [rows, ...] (want_hidden)
        self.row_buffers = None
        if keep_row_states and isinstance(kv, HybridCache):
            row_buffers = row_buffers or row_state_buffers(kv, rows)
            self.row_buffers = {layer: (conv[:rows], state[:rows]) for layer, (conv, state) in row_buffers.items()}
        self.exact_span = (not capture) if exact_span is None else exact_span
        if capture and self.exact_span:
            raise StrataError("captured decode needs a fixed span (exact_span=False)")
        self._check_model(model, kv)
        experts = model.experts
        # Misses read by the device itself (`--misses direct`) need no host between layers: one segment, as resident.
        self.cached = experts if isinstance(experts, CachedExperts) and not experts.direct else None
        if self.cached is not None and self.cached.pcie_frac > 0:
            raise StrataError("decode graphs do not run PCIe-streamed misses yet (pcie_frac > 0)")
        if capture and isinstance(experts, (CachedExperts, ResidentExperts)):
            stacks = experts.host_stacks if isinstance(experts, CachedExperts) else experts.stacks
            # Captured experts run the GEMV kernels (a cached segment reads its hits through the slot table); the
            # reference loop, for shapes or formats they do not take, reads routing on the host and cannot be.
            probe = torch.empty(rows, model.config.n_embd, dtype=model.dtype, device=self.device)
            if any(kernel_path(s, probe) != "decode" for s in stacks.values()):
                raise StrataError("the experts' shapes or formats (or float32 activations) have no decode kernel; "
                                  "their reference loop cannot be captured")
        self.tokens = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.upload = TokenUpload(rows, self.device)
        self.pool = pool if pool is not None or not capture else torch.cuda.graph_pool_handle()
        self.programs: dict[int, StepGraphs] = {}
        self.signature = None
        self.steps = 0
        # Host seconds of the routed layers' doorbell loop, by part (`strata bench decode` prints them a token).
        self.host_seconds: Counter = Counter()

    def _check_model(self, model, kv) -> None:
        """A StrataError unless this class's program is the model's step over this cache."""
        check_static(kv)
        if type(model).forward is not DecoderLM.forward:  # the segments below are DecoderLM.forward's loop
            raise StrataError(f"{type(model).__name__} runs its own forward step, which has no static form yet")

    # ---- host side

    def step(self, tokens: list[int], start: int, tail: torch.Tensor | None = None,
             head: torch.Tensor | None = None) -> torch.Tensor:
        """Logits float32 [rows, vocab] (the last row's [1, vocab] when rows == 1) after tokens at start..;
        a view of a static buffer, valid until the next step. `tail` (on the device): the tokens of rows 1.. (a
        verify window's drafts not yet read by the host), which then stand in for tokens[1:]; `head` (on the
        device, one token): row 0's (the previous step's argmax, not yet read by the host), for tokens[0]."""
        if len(tokens) != self.rows:
            raise StrataError(f"this decoder runs steps of {self.rows} tokens, got {len(tokens)}")
        end = start + self.rows
        span = self.step_span(end)
        self._reserve(start, end if self.exact_span else self.kv.max_tokens)
        self.upload(tokens, start, self.tokens, self.positions)
        if tail is not None:
            self.tokens[1:].copy_(tail)  # queued behind the upload: no host wait
        if head is not None:
            self.tokens[:1].copy_(head)
        with rows_as_steps(self.rows > 1):  # a window's rows compute as one-token steps (what the graphs record)
            if not self.capture:
                runner = StepGraphs(self._program(span), capture=False)
                self._execute(runner)
            elif span not in self.programs:  # a span's first step runs eagerly (compiling every kernel); capture
                runner = StepGraphs(self._program(span), capture=False)
                self._execute(runner)
                self._capture(span)
            else:
                runner = self.programs[span]
                self._execute(runner)
        self.model.experts.end_step()
        self.steps += 1
        stash = runner.program.stash
        if "rows" in stash:
            # The captured step rewrites the rows' states into the same tensors each replay: hand them to keep_rows.
            self.kv.window_rows.update(stash["rows"])
        self.hidden = stash.get("hidden")
        return stash["logits"]

    def step_span(self, end: int) -> int:
        """The attention span of a step ending at position `end` (exclusive): exact, or the graphs' power of two."""
        return end if self.exact_span else span_for(end, self.kv.max_tokens)

    def _capture(self, span: int) -> None:
        try:
            self.programs[span] = StepGraphs(self._program(span), capture=True, pool=self.pool)
        except Exception as exc:  # an op that cannot be captured: keep the same static code, uncaptured
            self.capture = False
            self.programs.clear()
            print(f"strata: decode graphs off: capture failed ({_first_cause(exc)}); "
                  "decoding with the same static steps uncaptured", file=sys.stderr)

    def _reserve(self, start: int, n_tokens: int) -> None:
        cache, states = self.kv, ()
        if isinstance(cache, HybridCache):
            cache.begin(start, self.rows)  # the recurrent states' length; their tensors update in place
            states = tuple(t.data_ptr() for t in (*cache.conv.values(), *cache.state.values()))
            cache = cache.kv
        cache.reserve(n_tokens)
        if getattr(cache, "selector", None) is not None:
            cache.selector.cover(n_tokens)  # Quest's bounds tables for every block the step's span may reach
        signature = _storage_signature(cache) + states
        if signature != self.signature:  # the cache moved (it grew, or pages were handed out anew): recapture
            self.programs.clear()
            self.signature = signature

    def _execute(self, runner: StepGraphs) -> None:
        program = runner.program
        runner.run(0)
        clock, spent = time.perf_counter, self.host_seconds
        for j, layer in enumerate(program.routed):
            published, stash = program.stash["published"], program.stash
            t0 = clock()
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()  # the doorbell: the routing is on the host
            t1 = clock()
            future, plan = self.cached.plan_step(layer, published.x, published.weights, published.ids,
                                                 stash["cpu_host"])
            t2 = clock()
            stash["table"].copy_(plan.table, non_blocking=True)
            stash["plan"] = plan
            runner.run(2 * j + 1)  # cached experts + shared expert, while the pool computes the misses
            t3 = clock()
            cpu = stash["cpu"]
            if future is None:
                if stash["cpu_dirty"]:  # zero once after a layer with misses, not a launch every layer
                    cpu.zero_()
                    stash["cpu_dirty"] = False
            else:
                # The pool wrote into the pinned cpu_host: an upload queued behind the expert graph, no host wait; the
                # next layer's doorbell (a stream sync) comes before the pool writes cpu_host again.
                cpu.copy_(self.cached.pool.result(future), non_blocking=True)
                stash["cpu_dirty"] = True
            t4 = clock()
            runner.run(2 * j + 2)  # adds the pool's part, on to the next routing (or the logits)
            t5 = clock()
            spent["doorbell wait"] += t1 - t0
            spent["plan_step"] += t2 - t1
            spent["launches"] += t3 - t2 + t5 - t4
            spent["pool wait"] += t4 - t3

    # ---- the step's functions

    def _routing_buffers(self) -> dict:
        """A program's static state for the doorbell (behind an expert cache): the slot table, the pool's part and
        the routing published to the host (pinned when captured)."""
        stash: dict = {"plan": None}
        if self.cached is not None:
            c, rows, host = self.model.config, self.rows, self.capture
            stash["table"] = torch.full((max(c.n_experts, 1),), -1, dtype=torch.int32, device=self.device)
            stash["cpu"] = torch.zeros(rows, c.n_embd, dtype=torch.float32, device=self.device)
            stash["cpu_host"] = torch.zeros(rows, c.n_embd, dtype=torch.float32, pin_memory=host)
            stash["cpu_dirty"] = False  # whether `cpu` holds a pool result (else zeros)
            stash["published"] = Published(
                torch.zeros(rows, c.n_embd, dtype=torch.float32, pin_memory=host),
                torch.zeros(rows, c.n_experts_used, dtype=torch.float32, pin_memory=host),
                torch.zeros(rows, c.n_experts_used, dtype=torch.long, pin_memory=host))
        return stash

    def _program(self, span: int) -> Program:
        model, rows = self.model, self.rows
        view = static_kv(self.kv, self.positions, span, self.exact_span)
        ctx = StaticContext(view, start=0, n_tokens=rows, want_all_logits=rows > 1, want_hidden=self.want_hidden,
                            keep_row_states=self.keep_row_states, position_tensor=self.positions)
        routed = [i for i in range(model.n_main_layers) if model.is_moe(i)] if self.cached is not None else []
        stash = self._routing_buffers()
        if self.row_buffers is not None:
            # The program's record of where the rows' states go: filled once (at capture), the buffers rewritten by
            # every replay.
            stash["rows"] = view.window_rows = {}
            view.row_buffers = self.row_buffers
        program = Program([], routed, stash)

        eps = model.config.rms_eps

        def layers(first: int, stop: int) -> None:
            """Mixers and FFNs of layers first..stop-1, then (stop < layers) the mixer and routing of `stop`. The
            residual `h` travels with `normed`, its norm by the next block's weight (each add fused with it)."""
            h, normed, cos, sin = stash["h"], stash["normed"], stash["cos"], stash["sin"]
            for i in range(first, min(stop, model.n_main_layers)):
                h, normed = model.layer(i, h, normed, ctx, cos, sin)
            if stop < model.n_main_layers:
                delta, w, c = model.mixer(stop, h, ctx, cos, sin, normed), model.ffn[stop], model.config
                routed = add_norm_route(h, delta, w.norm, w.router, eps, c.n_experts_used, c.norm_topk_prob)
                if routed is None:  # the add + norm, router and top-k as three launches
                    h, normed = add_rms_norm(h, delta, w.norm, eps)
                    publish(stash, *model.route(stop, h, x=normed))
                else:
                    h, normed, weights, ids = routed
                    publish(stash, normed, weights, ids)
            stash["h"], stash["normed"] = h, normed

        def finish() -> None:
            stash["logits"] = model.logits(stash["h"], ctx, stash["normed"])
            if self.want_hidden:
                stash["hidden"] = ctx.hidden

        def first_segment() -> None:
            stash["h"], stash["cos"], stash["sin"] = model.begin(self.tokens, ctx)
            stash["normed"] = rms_norm(stash["h"], model.mixer_norm(0), eps, quantize=dp4a_step.reads_qkv(model, 0))
            layers(0, routed[0] if routed else model.n_main_layers)
            if not routed:
                finish()

        program.segments.append(first_segment)
        for j, layer in enumerate(routed):
            program.segments.append(lambda layer=layer: _experts_segment(model, self.cached, layer, stash))
            after = routed[j + 1] if j + 1 < len(routed) else model.n_main_layers

            def combine_segment(layer=layer, after=after) -> None:
                part = stash["part"]
                stash["h"], stash["normed"] = model.join_add_norm(layer, stash["h"], part + stash["cpu"].to(part.dtype),
                                                                  stash["shared"], stash["x"])
                layers(layer + 1, after)
                if after >= model.n_main_layers:
                    finish()

            program.segments.append(combine_segment)
        return program


def row_state_buffers(cache: HybridCache, rows: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Static buffers for a verify window's per-row recurrent states: layer -> (conv [rows, ...], state [rows, ...])."""
    return {layer: (cache.conv[layer].new_zeros((rows, *cache.conv[layer].shape)),
                    cache.state[layer].new_zeros((rows, *cache.state[layer].shape))) for layer in cache.conv}


def publish(stash: dict, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> None:
    """End of a segment at a routed layer: keep (x, weights, ids) for the expert segment, copy them to the host."""
    stash.update(x=x, weights=weights, ids=ids)
    published = stash["published"]
    published.x.copy_(x.float(), non_blocking=True)
    published.weights.copy_(weights.float(), non_blocking=True)
    published.ids.copy_(ids.long(), non_blocking=True)


def _experts_segment(model, backend: CachedExperts, layer: int, stash: dict) -> None:
    """The device's share of a routed layer: its cached experts (through the slot table) and the shared expert."""
    x, weights, ids = stash["x"], stash["weights"], stash["ids"]
    stash["part"] = backend.hits_part(layer, x, weights, ids, stash["plan"], stash["table"])
    stash["shared"] = model.shared_swiglu(layer, x)


def _storage_signature(cache) -> tuple:
    """Addresses of what a captured step reads and writes of the cache: they change when it reallocates."""
    tensors = []
    for name in ("keys", "values"):
        tensors += getattr(cache, name, [])
    for pool in getattr(cache, "pools", []):
        tensors += [t for t in (pool.k, pool.v, pool.k_scale, pool.v_scale) if t is not None]
    selector = getattr(cache, "selector", None)
    if selector is not None:
        tensors += [*selector.kmin, *selector.kmax]
    table = getattr(cache, "page_table", None)
    if table is not None:
        tensors.append(table)
    return tuple(t.data_ptr() for t in tensors)


# ---------------------------------------------------------------------------------------------------- engine glue


def graphs_wanted(option: str, device: torch.device) -> str:
    """"graphs" (capture), "eager" (the static code without capture) or "off", from the engine option
    `decode_graphs` ("auto", "on", "off", "eager") and STRATA_NO_GRAPHS."""
    from strata import switches

    if option not in ("auto", "on", "off", "eager"):
        raise StrataError(f"decode_graphs {option!r} is not one of auto, on, off, eager")
    if option == "off" or (option in ("auto", "on") and switches.get("STRATA_NO_GRAPHS")):
        return "off"
    if option == "eager":
        return "eager"
    if device.type != "cuda":
        if option == "on":
            raise StrataError("decode_graphs='on' needs a CUDA device (CUDA graphs); use 'eager' on the CPU")
        return "off"
    return "graphs"


def decoder_class(model) -> type[GraphDecoder]:
    """The static program of this model's step: DecoderLM's loop, or a model's own (qwen4exp)."""
    from strata.models.qwen4exp import Qwen4ExpLM

    if isinstance(model, Qwen4ExpLM):
        from strata.engine.decode_qwen4exp import Qwen4ExpDecoder

        return Qwen4ExpDecoder
    return GraphDecoder


def make_decoder(model, kv, device: torch.device, option: str) -> GraphDecoder | None:
    """The engine's decoder for one-token steps, or None (step by step) with one line saying why."""
    mode = graphs_wanted(option, device)
    if mode == "off":
        return None
    try:
        return decoder_class(model)(model, kv, device, capture=mode == "graphs")
    except StrataError as exc:
        print(f"strata: decode graphs off: {exc}; decoding step by step", file=sys.stderr)
        return None


def _first_cause(exc: BaseException) -> str:
    """`Type: first line` of exc, and of the exception that started it where another did: a capture's own error is
    often replaced by the one its clean-up raises (the graph's end, the memory pool), which says little."""
    def line(e: BaseException) -> str:
        text = str(e).splitlines()
        return f"{type(e).__name__}: {text[0] if text else ''}"

    root = exc
    while root.__context__ is not None and root.__context__ is not root:
        root = root.__context__
    return line(exc) if root is exc else f"{line(exc)}; started by {line(root)}"
