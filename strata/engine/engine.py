"""The Engine: one model, its tokenizer and KV cache; the object every front end (API, CLI, server) talks to."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from strata.engine.context import ForwardContext
from strata.engine.prefill import PrefillProgress, ProgressClock, chunk_size, prompt_chunks
from strata.engine.kv import check_kind, kv_bytes_per_value
from strata.engine.sampling import Sampler, SamplingParams
from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.engine.offload import offloaded_experts
from strata.engine.placement import plan_placement
from strata.models import config_of, load_model
from strata.tokenizer import Tokenizer

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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
    pin_experts: bool = True  # host experts in pinned RAM (fast copies); False keeps them memory-mapped
    expert_profile: str | None = None  # routing counts from `strata profile`, to fill the cache at start
    prefill_stream: str = "auto"  # offloaded prompts: stream missing experts to the GPU ("auto", "on", "off")

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


def _dtype(name: str, what: str) -> torch.dtype:
    if name not in DTYPES:
        raise StrataError(f"{what} {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


class Engine:
    def __init__(self, path: str | os.PathLike, config: EngineConfig = EngineConfig()):
        self.config = config
        self.file = GGUFModelFile(path)
        self.tokenizer = Tokenizer.from_gguf_metadata(self.file.metadata, source=str(self.file.path))
        self.device = config.resolve_device()
        self.dtype = config.resolve_dtype(self.device)
        model_config = config_of(self.file)
        self.n_ctx = config.n_ctx or min(model_config.context_length, 4096)
        if self.n_ctx <= 0:
            raise StrataError(f"n_ctx must be positive, got {self.n_ctx}")
        kv_dtype = check_kind(config.kv_dtype, model_config.head_dim)  # before the weights load
        if not 0 <= config.pcie_frac <= 1:
            raise StrataError(f"pcie_frac must be in [0, 1], got {config.pcie_frac}")
        self.plan = plan_placement(self.file, model_config, self.device, self.n_ctx, kv_bytes_per_value(kv_dtype),
                                   config.vram_budget, config.expert_cache)
        # Experts that do not all fit stay on the host (memory-mapped) and go behind the cache.
        offload = {} if self.plan.all_resident else {"expert_device": torch.device("cpu")}
        self.model = load_model(self.file, self.device, self.dtype, progress=config.progress, **offload)
        if offload:
            self.model.experts = offloaded_experts(self.model.expert_stacks, self.plan, self.device, config)
        self.kv = self.model.new_cache(self.n_ctx, kv_dtype)
        self.cached_tokens: list[int] = []  # the tokens whose keys and values the KV cache holds, in order
        self.prefill_chunk = chunk_size(config.prefill_chunk, model_config, self.device.type == "cuda",
                                        self._free_device_bytes())
        # Front ends may set this to hear about long prompts: called with a PrefillProgress after each chunk.
        self.on_prefill_progress: Callable[[PrefillProgress], None] | None = None

    def _check_fits(self, n_tokens: int) -> None:
        if n_tokens > self.n_ctx:
            raise StrataError(f"prompt of {n_tokens} tokens is longer than the context of {self.n_ctx} (raise n_ctx)")

    @torch.inference_mode()
    def _free_device_bytes(self) -> int | None:
        """What a prompt chunk's activations may use: the device's free memory, within the VRAM budget if one was set."""
        if self.device.type != "cuda":
            return None
        free = torch.cuda.mem_get_info(self.device)[0]
        plan = self.plan
        if plan.vram_budget is not None:
            experts = plan.expert_bytes if plan.all_resident else plan.n_slots * plan.expert_bytes_each
            free = min(free, plan.vram_budget - plan.dense_bytes - plan.kv_bytes - experts)
        return max(free, 0)

    def _forward(self, ids: list[int], start: int, all_logits: bool) -> torch.Tensor:
        outputs = []
        clock = ProgressClock(len(ids), self.on_prefill_progress if len(ids) > 1 else None)
        equal = isinstance(self.config.prefill_chunk, str)  # "auto": equal chunks; a number: chunks of that size
        for begin, end in prompt_chunks(len(ids), self.prefill_chunk, equal):
            ctx = ForwardContext(self.kv, start + begin, end - begin, want_all_logits=all_logits)
            outputs.append(self.model.forward(torch.tensor(ids[begin:end], device=self.device), ctx))
            clock.chunk_done(end)
        self.cached_tokens = self.cached_tokens[:start] + list(ids)
        return torch.cat(outputs) if all_logits else outputs[-1]

    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Logits [1, vocab] after `ids`, reusing the cached keys of the longest shared prefix."""
        if not ids:
            raise StrataError("empty prompt: nothing to continue from")
        self._check_fits(len(ids))
        shared = 0
        for a, b in zip(self.cached_tokens, ids[:-1]):  # at least the last token is always recomputed
            if a != b:
                break
            shared += 1
        if shared < len(self.cached_tokens) and not self.kv.can_truncate:
            shared = 0  # a recurrent state cannot be rewound: start over
        self.kv.truncate(shared)
        return self._forward(ids[shared:], shared, all_logits=False)

    def logits(self, ids: list[int]) -> torch.Tensor:
        """The prompt path's logits for every position: float32 [n_tokens, vocab], on the CPU."""
        if not ids:
            raise StrataError("logits: no tokens given")
        self._check_fits(len(ids))
        self.kv.truncate(0)  # from position 0: a recurrent state must not carry over from an earlier prompt
        return self._forward(list(ids), 0, all_logits=True).cpu()

    def generate(self, prompt_ids: list[int], params: SamplingParams, max_tokens: int,
                 stop_ids: frozenset[int] = frozenset()) -> Iterator[int]:
        """Yields new token ids until a stop id (yielded, then ending), max_tokens or the end of the context."""
        sampler = Sampler(params)
        logits = self.prefill(prompt_ids)
        history = list(prompt_ids)
        for _ in range(max_tokens):
            token = sampler(logits[-1], history)
            history.append(token)
            yield token
            if token in stop_ids or len(history) >= self.n_ctx:
                return
            logits = self._forward([token], len(history) - 1, all_logits=False)
