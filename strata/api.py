"""`strata.LLM`: the Python API, shaped like llama_cpp.Llama and vllm.LLM; the CLI and server are thin layers over it."""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable
from numbers import Integral
from typing import Callable, Iterator

import torch

from strata.engine.engine import Engine, EngineConfig
from strata.engine.generation import Chunk, Completion, complete, stream_completion
from strata.engine.sampling import SamplingParams
from strata.errors import StrataError, number_of_kind


class LLM:
    """A loaded model. `LLM(path, device="cuda", n_ctx=8192)`; see EngineConfig for every engine option.
    `LLM()` loads the small trained model Strata ships (strata.default_model)."""

    def __init__(self, model_path: str | os.PathLike | None = None, **engine_options):
        unknown = set(engine_options) - set(EngineConfig.__dataclass_fields__)
        if unknown:
            raise StrataError(f"unknown engine option(s): {', '.join(sorted(unknown))}")
        if model_path is None:
            from strata.default_model import resolve_model

            model_path = resolve_model(None)
        self.engine = Engine(model_path, EngineConfig(**engine_options))
        self.tokenizer = self.engine.tokenizer
        self.config = self.engine.model.config

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def detokenize(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def logits(self, token_ids: list[int]) -> torch.Tensor:
        """The prompt path's logits: float32 [n_tokens, vocab]."""
        return self.engine.logits(self._token_ids(token_ids))

    def generate(self, prompt: str | list[int], *, max_tokens: int = 256, stop: list[str] | None = None,
                 stream: bool = False, logprobs: int | None = None, cancel: Callable[[], bool] | None = None,
                 **sampling) -> Completion | Iterator[Chunk]:
        """Continue `prompt` (text or token ids). Sampling options: temperature, top_k, top_p, min_p,
        repetition_penalty, seed (temperature=0 is greedy). With stream=True, yields Chunks as they come.
        `logprobs=K`: each token's logprob and its K most likely alternatives (Chunk/Completion.logprobs).
        `cancel`: a function asked before each token; when it returns True, generation ends ("cancelled")."""
        if isinstance(prompt, (bytes, dict)) or not isinstance(prompt, (str, Iterable)):
            raise StrataError(f"prompt must be text or a list of token ids, not {type(prompt).__name__}")
        ids = self.tokenize(prompt) if isinstance(prompt, str) else self._token_ids(prompt)
        return self._run(ids, max_tokens, stop, stream, sampling, logprobs, cancel)

    def chat(self, messages: list[dict], *, max_tokens: int = 256, stop: list[str] | None = None,
             stream: bool = False, template_options: dict | None = None, logprobs: int | None = None,
             cancel: Callable[[], bool] | None = None, **sampling) -> Completion | Iterator[Chunk]:
        """Answer a conversation ([{"role": "user", "content": "..."}, ...]) through the file's chat template."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise StrataError("messages must be a list of {'role': ..., 'content': ...} dicts")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **(template_options or {}))
        return self._run(self.tokenize(text), max_tokens, stop, stream, sampling, logprobs, cancel)

    def _token_ids(self, prompt) -> list[int]:
        """`prompt`'s token ids as ints, or a StrataError naming the first that is none of the vocabulary's (the
        embedding would take a negative one from the end and fail on a float or too large one with an IndexError)."""
        vocab, ids = self.tokenizer.vocab_size, []
        for at, token in enumerate(prompt):
            try:
                if isinstance(token, bool):
                    raise TypeError
                ids.append(operator.index(token))  # ints, numpy and torch integer scalars; not floats
            except TypeError:
                raise StrataError(f"prompt token {at} is {token!r}, not a token id") from None
            if not 0 <= ids[-1] < vocab:
                raise StrataError(f"prompt token {at} is {token!r}, outside the vocabulary's ids 0..{vocab - 1}")
        return ids

    def _run(self, ids, max_tokens, stop, stream, sampling, logprobs=None, cancel=None):
        unknown = set(sampling) - set(SamplingParams.__dataclass_fields__)
        if unknown:
            raise StrataError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        if not number_of_kind(max_tokens, Integral) or max_tokens < 1:
            raise StrataError(f"max_tokens must be a whole number of at least 1, got {max_tokens!r}")
        stop = [stop] if isinstance(stop, str) else stop  # one string is one stop string, not one per character
        if stop is not None and not (isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop)):
            raise StrataError(f"stop must be a string or a list of strings, got {stop!r}")
        if logprobs is not None and not (number_of_kind(logprobs, Integral) and 0 <= logprobs <= 256):
            raise StrataError(f"logprobs must be a whole number between 0 and 256, got {logprobs!r}")
        params = SamplingParams(**sampling)
        if stream:
            return stream_completion(self.engine, ids, params, max_tokens, stop, top_logprobs=logprobs, cancel=cancel)
        return complete(self.engine, ids, params, max_tokens, stop, top_logprobs=logprobs, cancel=cancel)
