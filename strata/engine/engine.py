"""The Engine: one model, its tokenizer and KV cache; the object every front end (API, CLI, server) talks to."""

from __future__ import annotations

import os
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Callable, Iterator

import torch

from strata import switches
from strata.engine.checkpoints import CheckpointStore, Reuse, usable_prefix
from strata.engine.context import ForwardContext
from strata.engine.decode import make_decoder
from strata.engine.decode_ahead import generate_ahead, runs_ahead
from strata.engine.prefill import PrefillProgress, ProgressClock, chunk_plan, prompt_chunks
from strata.engine.hybrid_cache import HybridCache
from strata.engine.idle_work import IdleWork
from strata.engine.kv import ResidentKind, check_kind, kv_bytes_per_value
from strata.engine.quest import DEFAULT_BUDGET, QuestSelector
from strata.engine.sampling import Sampler, SamplingParams
from strata.engine.staging import upload
from strata.errors import StrataError, number_of_kind
from strata.gguf.reader import GGUFModelFile
from strata.engine.offload import load_profile, offloaded_experts
from strata.engine.pinned_memory import pin_from_threads
from strata.engine.placement import plan_placement
from strata.models import config_of, load_model
from strata.tokenizer import Tokenizer

QSA_KINDS = ("none", "quest")
MAX_CONTEXT = 524_288  # nothing is sized by the context up front: caches grow by pages, masks follow the step
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_WHOLE_OPTIONS = ("n_ctx", "cpu_threads", "qsa_budget", "kv_resident", "checkpoints", "suffix_draft")
_NUMBER_OPTIONS = ("vram_budget", "pcie_frac", "cpu_spin_us", "checkpoint_gib", "spec_min_p")
_OPTIONAL = ("n_ctx", "kv_resident", "vram_budget")  # None: the default's rule
_NOT_NEGATIVE = ("cpu_threads", "cpu_spin_us", "checkpoints", "checkpoint_gib")  # 0: the default's or none


@dataclass(frozen=True)
class EngineConfig:
    device: str = "auto"  # "cpu", "cuda", "cuda:1", or "auto" (CUDA when there is one)
    dtype: str = "auto"  # activations: float32 on CPU, bfloat16 on CUDA
    kv_dtype: str = "float16"  # "float16", "bfloat16", "float32" or "int8" (paged, head_dim a multiple of 64)
    n_ctx: int | None = None  # context size; default min(model's, 4096)
    prefill_chunk: int | str = "auto"  # prompt tokens per step: a number, "auto" or "auto:MAX" (engine/prefill.py)
    progress: bool = False
    vram_budget: float | None = None  # GiB: behave as if the GPU had this much (None: what is free)
    expert_cache: str | int = "auto"  # GPU expert slots when experts do not all fit: "auto" or a count
    pcie_frac: float = 0.0  # share of cache misses copied over PCIe and run on the GPU instead of the CPU
    misses: str = "auto"  # decode misses: "cpu" (the CPU pool), "direct" (GPU kernels read pinned host RAM), auto
    cpu_threads: int = 0  # numba threads of the CPU expert pool (0: every core but one)
    cpu_spin_us: float = 1000.0  # the pool's threads stay awake this long between calls (0: they sleep at once)
    pin_experts: bool = True  # host experts in pinned RAM (fast copies); False keeps them memory-mapped
    expert_profile: str | None = None  # routing counts from `strata profile`, to fill the cache at start
    qsa: str = "none"  # "quest": the KV backend selects qsa_budget cells per query (models without an indexer)
    qsa_budget: int = DEFAULT_BUDGET  # cells per query under --qsa quest
    kv_resident: int | None = None  # int8 KV in host RAM with this many cells per layer on the device
    prefill_stream: str = "auto"  # offloaded prompts: stream missing experts to the GPU ("auto", "on", "off")
    prefill_borrow: str = "auto"  # streamed chunks' expert work buffers in borrowed cache slots (engine/prefill.py)
    checkpoints: int = 8  # caches of recent conversations kept for their next turn (engine/checkpoints.py)
    checkpoint_gib: float = 4.0  # at most this much of them (host RAM when the cache is on the GPU)
    spec: int | str = 1  # verify window of speculation: the last token + spec-1 drafts (1: off; "auto": spec_auto.py)
    spec_min_p: float = 0.0  # an MTP draft whose probability falls below this ends the draft
    suffix_draft: int = 0  # prompt-lookup drafts (up to this many) where the MTP draft stops
    decode_graphs: str = "auto"  # "auto" (CUDA graphs on CUDA), "off", "on", "eager" (their static code, uncaptured)
    gpus: str | None = None  # layers split over these cards ("0,1"; "cpu,cpu" in tests): engine/pipeline.py
    layer_split: str = "auto"  # with gpus: "auto" (by each card's memory) or layer counts per card ("24,24")

    def __post_init__(self):
        """The numeric options of a number's kind, by name: a string or a fraction there failed deep in loading with
        a TypeError or ValueError (the CLI's parser gives them their kinds; the Python API does not)."""
        for name in _WHOLE_OPTIONS + _NUMBER_OPTIONS:
            value = getattr(self, name)
            kind = Integral if name in _WHOLE_OPTIONS else Real
            if not (number_of_kind(value, kind) or value is None and name in _OPTIONAL):
                raise StrataError(f"engine option {name} must be {'a whole number' if kind is Integral else 'a number'}"
                                  f"{' or None' if name in _OPTIONAL else ''}, got {value!r}")
        for name in _NOT_NEGATIVE:  # before anything loads (a negative count reached the pool's arithmetic)
            if not getattr(self, name) >= 0:
                raise StrataError(f"engine option {name} must be >= 0, got {getattr(self, name)!r}")
        cache = self.expert_cache
        if not (cache == "auto" or number_of_kind(cache, Integral) or isinstance(cache, str) and cache.isdigit()):
            raise StrataError(f"engine option expert_cache must be 'auto' or a number of experts, got {cache!r}")

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise StrataError(f"device {self.device} asked for, but this torch sees no CUDA GPU (use device='cpu')")
        return device

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        name = self.dtype if self.dtype != "auto" else ("float32" if device.type == "cpu" else "bfloat16")
        return _dtype(name, "dtype")


def _first_card(gpus: str) -> torch.device:
    from strata.engine.placement_split import parse_gpus

    return parse_gpus(gpus)[0]


def _dtype(name: str, what: str) -> torch.dtype:
    if name not in DTYPES:
        raise StrataError(f"{what} {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


class Engine:
    def __init__(self, path: str | os.PathLike, config: EngineConfig = EngineConfig()):
        self.config = config
        self.file = GGUFModelFile(path)
        model_config = config_of(self.file)  # an architecture we do not run is the first thing to say
        self.tokenizer = Tokenizer.from_gguf_metadata(self.file.metadata, source=str(self.file.path))
        self.device = config.resolve_device() if not config.gpus else _first_card(config.gpus)
        if self.device.type == "cuda":
            pin_from_threads()  # before the first pinned allocation: the expert store's, at load
        self.dtype = config.resolve_dtype(self.device)
        self.n_ctx = min(model_config.context_length, 4096) if config.n_ctx is None else config.n_ctx
        if not 0 < self.n_ctx <= MAX_CONTEXT:
            raise StrataError(f"n_ctx must be in 1..{MAX_CONTEXT}, got {self.n_ctx}")
        kv_dtype = check_kind(config.kv_dtype, model_config.head_dim)  # before the weights load
        if config.kv_resident is not None and kv_dtype != "int8":
            raise StrataError(f"kv_resident keeps int8 pages in host RAM: it needs kv_dtype int8, not {kv_dtype}")
        if config.qsa not in QSA_KINDS:
            raise StrataError(f"qsa {config.qsa!r} is not one of {', '.join(QSA_KINDS)}")
        if not 0 <= config.pcie_frac <= 1:
            raise StrataError(f"pcie_frac must be in [0, 1], got {config.pcie_frac}")
        self.pipeline = None  # a layer split over several cards (engine/pipeline.py)
        if config.gpus:
            from strata.engine.pipeline import load_split

            self.plan, self.model, self.pipeline = load_split(self.file, model_config, config, self.dtype, self.n_ctx,
                                                              kv_bytes_per_value(kv_dtype))
        else:
            self.plan = plan_placement(self.file, model_config, self.device, self.n_ctx, kv_bytes_per_value(kv_dtype),
                                       config.vram_budget, config.expert_cache, config.kv_resident)
            # Experts that do not all fit stay on the host (memory-mapped) and go behind the cache.
            offload = {} if self.plan.all_resident else {"expert_device": torch.device("cpu")}
            self.model = load_model(self.file, self.device, self.dtype, progress=config.progress, **offload)
            if offload:
                self.model.experts = offloaded_experts(self.model.expert_stacks, self.plan, self.device, config)
            elif config.expert_profile:  # no cache to fill, but a wrong file is said now, not on a smaller card
                load_profile(config.expert_profile, self.model.expert_stacks)
        self.kv = self.model.new_cache(self.n_ctx, ResidentKind(config.kv_resident) if config.kv_resident else kv_dtype)
        if config.qsa == "quest":
            backend = self._kv_backend()
            backend.selector = QuestSelector(backend.n_layers, backend.n_kv_heads, backend.head_dim, self.device,
                                             budget=config.qsa_budget)
        self.cached_tokens: list[int] = []  # the tokens whose keys and values the KV cache holds, in order
        self.checkpoints = CheckpointStore(config.checkpoints, int(config.checkpoint_gib * (1 << 30))) \
            if config.checkpoints else None
        self.idle_work = IdleWork()  # host work for a streamed prompt's routing waits (engine/idle_work.py)
        host_pages = config.kv_resident is not None  # fetched by the host as the step selects: not capturable
        if host_pages and config.decode_graphs == "on":
            raise StrataError("decode graphs do not run --kv-resident (its pages are fetched by the host as each "
                              "step selects them): use decode_graphs off")
        self.graphs_option = "off" if host_pages else config.decode_graphs  # verify windows follow it too
        if self.pipeline is not None:
            from strata.engine.decode_split import make_split_decoder

            self.decoder = make_split_decoder(self.model, self.kv, self.pipeline, self.graphs_option)
            self.graphs_option = "off"  # verify windows across cards stay uncaptured (the pipeline's forward)
        else:
            self.decoder = make_decoder(self.model, self.kv, self.device, self.graphs_option)  # None: step by step
        streamer = self._prompt_streamer()
        self.chunk_plan = chunk_plan(config.prefill_chunk, model_config, self.device.type == "cuda",
                                     self._free_device_bytes(), self._mask_context(kv_dtype, config.spec),
                                     streamer.cache.slot_bytes if streamer else 0,
                                     streamer.lendable_work_slots() if streamer else 0, config.prefill_borrow)
        self.prefill_chunk = self.chunk_plan.tokens
        if streamer is not None:
            streamer.work_slots = self.chunk_plan.work_slots
        # Front ends may set this to hear about long prompts: called with a PrefillProgress after each chunk.
        self.on_prefill_progress: Callable[[PrefillProgress], None] | None = None
        self.spec = None  # speculative decoding (engine/spec.py), when the window is > 1
        window = self._spec_window(config.spec)
        if window != 1 or config.spec_min_p or config.suffix_draft:
            from strata.engine.spec import SpecDecoder, check_options

            check_options(window, config.spec_min_p, config.suffix_draft)
            if window > 1:
                self.spec = SpecDecoder(self, window, config.spec_min_p, config.suffix_draft)

    def _mask_context(self, kv_dtype: str, spec: int | str) -> int:
        """The context a prompt chunk's attention masks densely ([chunk, context] in SDPA), which the chunk rule
        budgets: none for the paged int8 cache; for a dense cache the whole context, unless the model attends with
        kernels that take no mask (qwen4exp's selected cells) and no MTP catch-up (speculation) attends densely."""
        if kv_dtype == "int8":
            return 0
        masked = getattr(self.model, "prompt_mask_context", None)
        if masked is None or spec != 1:
            return self.n_ctx
        return masked(self.n_ctx, self.kv)

    def _spec_window(self, spec: int | str) -> int:
        """The verify window: the number asked for, or what `auto` picks for this model, device and placement."""
        if spec == "auto":
            from strata.engine.spec_auto import auto_spec

            from strata.engine.decode import GraphDecoder

            # Windows capture where plain decode does, through the same static program (DecoderLM's or qwen4exp's).
            captured = isinstance(self.decoder, GraphDecoder) and self.decoder.capture
            return auto_spec(bool(getattr(self.model, "mtp", None)), captured, self.plan.all_resident)
        if isinstance(spec, bool) or not isinstance(spec, int):
            raise StrataError(f"spec must be a window of 1..4 tokens or 'auto', got {spec!r}")
        return spec

    def _prompt_streamer(self):
        """The offloaded experts' prompt streamer (engine/prefill_stream.py), None where nothing streams (a split's
        cards keep their own and size no work buffers in slots)."""
        return getattr(getattr(self.model, "experts", None), "prompt", None) if self.pipeline is None else None

    def _kv_backend(self):
        """The KV backend under the cache (a hybrid cache holds one for its attention layers)."""
        return self.kv.kv if isinstance(self.kv, HybridCache) else self.kv

    def _check_fits(self, n_tokens: int) -> None:
        if n_tokens > self.n_ctx:
            raise StrataError(f"prompt of {n_tokens} tokens is longer than the context of {self.n_ctx} (raise n_ctx)")

    @torch.inference_mode()
    def _free_device_bytes(self) -> int | None:
        """What a prompt chunk's activations may use: the device's free memory, within the VRAM budget if one was set."""
        if self.pipeline is not None:
            return self.plan.chunk_room()
        if self.device.type != "cuda":
            return None
        free = torch.cuda.mem_get_info(self.device)[0]
        plan = self.plan
        if plan.vram_budget is not None:
            experts = plan.expert_bytes if plan.all_resident else plan.n_slots * plan.expert_bytes_each
            free = min(free, plan.vram_budget - plan.dense_bytes - plan.kv_bytes - experts)
        return max(free, 0)

    def _forward(self, ids: list[int], start: int, all_logits: bool) -> torch.Tensor:
        if self.pipeline is not None:
            from strata.engine.pipeline import run_prompt

            return run_prompt(self, ids, start, all_logits)
        outputs = []
        clock = ProgressClock(len(ids), self.on_prefill_progress if len(ids) > 1 else None)
        equal = isinstance(self.config.prefill_chunk, str)  # "auto": equal chunks; a number: chunks of that size
        # The cache holds whole chunks only: a progress hook may stop the prompt between two (a cancelled
        # request), and then the cache must say what it holds; a chunk cut short by an error is not whole.
        del self.cached_tokens[start:]  # in place, not a copy of the context per step
        streamer = self._prompt_streamer()
        chunks = prompt_chunks(len(ids), self.prefill_chunk, equal)
        # A model that prepares host work from the tokens (qwen4exp's n-gram rows) starts it for every chunk now.
        announce = getattr(self.model, "begin_prompt", None) if len(ids) > 1 else None
        if announce is not None:
            announce(ids, chunks, start, self.kv)
        try:
            for i, (begin, end) in enumerate(chunks):
                if streamer is not None:  # lends the ring; fetches the first layer's experts before the embedding
                    following = chunks[i + 1][1] - chunks[i + 1][0] if i + 1 < len(chunks) else 0
                    streamer.begin_chunk(end - begin, following, self.model.config.n_experts_used)
                ctx = ForwardContext(self.kv, start + begin, end - begin, want_all_logits=all_logits,
                                     want_hidden=self.spec is not None and self.spec.wants_hidden,
                                     tokens=ids[begin:end])
                try:
                    # Pinned and queued: a pageable copy would make the host wait for the previous chunk's work.
                    outputs.append(self.model.forward(upload(torch.tensor(ids[begin:end]), self.device), ctx))
                except BaseException:
                    self.cached_tokens = []
                    self.kv.truncate(0)
                    raise
                self.cached_tokens += ids[begin:end]
                if ctx.want_hidden:
                    self.spec.saw_hidden(start + begin, ctx.hidden)
                clock.chunk_done(end)
        finally:
            if announce is not None:
                self.model.end_prompt()
            if streamer is not None:  # lent slots back, refilled with their experts, before any decode step
                streamer.return_slots()
        return torch.cat(outputs) if all_logits else outputs[-1]

    def reuse(self, ids: list[int]) -> Reuse:
        """Where the next prefill of `ids` starts: the live cache's shared prefix, or a longer one of a checkpoint."""
        live = Reuse(usable_prefix(self.cached_tokens, ids, self.kv.can_truncate))
        if self.checkpoints is None:
            return live
        found = self.checkpoints.best(ids, self.kv.can_truncate)
        return found if found.tokens > live.tokens else live

    def _leave_live_sequence(self) -> None:
        """The cache is about to be rewound or overwritten: keep a checkpoint of the conversation it holds."""
        if self.checkpoints is not None:
            self.checkpoints.save(self.cached_tokens, self.kv)

    def prefill(self, ids: list[int], checkpoint: bool = True) -> torch.Tensor:
        """Logits [1, vocab] after `ids`, reusing the cached keys (or states) of the longest shared prefix, from the
        live cache or a checkpoint. `checkpoint=False`: a decode step, not a prompt (a hybrid model's cache is
        checkpointed at the end of each prompt)."""
        if not ids:
            raise StrataError("empty prompt: nothing to continue from")
        self._check_fits(len(ids))
        start = self.reuse(ids)
        if start.checkpoint is not None or start.tokens < len(self.cached_tokens):
            self._leave_live_sequence()
        if start.checkpoint is not None:
            self.checkpoints.restore(start.checkpoint, self.kv, start.tokens)
            self.cached_tokens = list(start.checkpoint.tokens)
            self._kv_backend().reread_bounds(len(self.cached_tokens))
        self.kv.truncate(start.tokens)  # a recurrent state cannot be rewound: 0 (start over) or all it holds
        saves = checkpoint and self.checkpoints is not None and not self.kv.can_truncate
        if saves:
            self._pin_checkpoint_ahead(len(ids))
        try:
            logits = self._forward(ids[start.tokens:], start.tokens, all_logits=False)
        finally:
            self.idle_work.clear()
        if saves:
            self.checkpoints.save(ids, self.kv)
        return logits

    def _pin_checkpoint_ahead(self, n_tokens: int) -> None:
        """Have a streamed prompt pin the host memory of the checkpoint saved at its end while the host waits for
        each layer's routing (engine/idle_work.py), not after its last layer (STRATA_CHECKPOINT_AHEAD)."""
        streamer = self._prompt_streamer()
        if streamer is None or not switches.get("STRATA_CHECKPOINT_AHEAD"):
            return
        streamer.idle = self.idle_work
        self.idle_work.add(self.checkpoints.reserve_pieces(self.kv, n_tokens, self.device.type == "cuda"))

    def logits(self, ids: list[int]) -> torch.Tensor:
        """The prompt path's logits for every position: float32 [n_tokens, vocab], on the CPU."""
        if not ids:
            raise StrataError("logits: no tokens given")
        self._check_fits(len(ids))
        self._leave_live_sequence()
        self.kv.truncate(0)  # from position 0: a recurrent state must not carry over from an earlier prompt
        return self._forward(list(ids), 0, all_logits=True).cpu()

    def generate(self, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
                 stop_ids: frozenset[int] = frozenset()) -> Iterator[int]:
        """Yields new token ids until a stop id (yielded, then ending), max_tokens or the end of the context."""
        if self.spec is not None:
            yield from self.spec.generate(prompt_ids, params, max_tokens, stop_ids)
            return
        sampler = Sampler(params)
        logits = self.prefill(prompt_ids)
        history = list(prompt_ids)
        if runs_ahead(self, params):
            yield from generate_ahead(self, sampler, sampler(logits[-1], history), history, max_tokens, stop_ids)
            return
        for _ in range(max_tokens):
            token = sampler(logits[-1], history)
            history.append(token)
            yield token
            if token in stop_ids or len(history) >= self.n_ctx:
                return
            logits = self.decode(token, len(history) - 1)

    def decode(self, token: int, position: int) -> torch.Tensor:
        """Logits [1, vocab] after `token` at `position`, the cache holding every earlier position: the captured
        step (engine/decode.py) when there is one, else a one-token forward."""
        if self.spec is not None and self.spec.wants_hidden:
            # MTP drafts read every position's hidden state: a one-row verify window keeps it (logprobs requests).
            logits = self.spec.verify([token], position)
            self.spec.keep(position, 1)
            return logits
        if self.decoder is None:
            return self._forward([token], position, all_logits=False)
        logits = self.decoder.step([token], position)
        del self.cached_tokens[position:]  # in place: a step's host work must not grow with the context
        self.cached_tokens.append(token)
        return logits
