"""The model's tokenizer over HTTP, in vLLM's shapes: GET /tokenizer_info, POST /tokenize, POST /detokenize.

lm-eval's `local-completions` looks for these and, when they answer, tokenizes with the server's own vocabulary
(its "remote" tokenizer) instead of loading a Hugging Face tokenizer: scoring then needs nothing but the server.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from strata.serve.app import ApiError, Server
from strata.tokenizer import CHATML_TEMPLATE

router = APIRouter()


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TokenizeRequest(_Request):
    model: StrictStr | None = None
    prompt: StrictStr
    add_special_tokens: StrictBool = False


class DetokenizeRequest(_Request):
    model: StrictStr | None = None
    tokens: list[StrictInt]


def _check_model(server: Server, name: str | None) -> None:
    if name is not None:
        server.check_model(name)


def _token_name(server: Server, field: str) -> str | None:
    token_id = server.llm.engine.file.metadata.get(field)
    return server.llm.tokenizer.id_to_token(int(token_id)) if isinstance(token_id, int) else None


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request):
    server: Server = request.app.state.server
    metadata = server.llm.engine.file.metadata
    return {"tokenizer_class": "strata", "model_max_length": server.n_ctx,
            "eos_token": _token_name(server, "tokenizer.ggml.eos_token_id"),
            "bos_token": _token_name(server, "tokenizer.ggml.bos_token_id"),
            "pad_token": _token_name(server, "tokenizer.ggml.padding_token_id"),
            "chat_template": metadata.get("tokenizer.chat_template") or CHATML_TEMPLATE}


@router.post("/tokenize")
async def tokenize(request: Request):
    server: Server = request.app.state.server
    body: TokenizeRequest = await server.read_json(request, TokenizeRequest)
    _check_model(server, body.model)
    tokens = server.llm.tokenize(body.prompt, add_special_tokens=body.add_special_tokens)
    return {"count": len(tokens), "max_model_len": server.n_ctx, "tokens": tokens}


@router.post("/detokenize")
async def detokenize(request: Request):
    server: Server = request.app.state.server
    body: DetokenizeRequest = await server.read_json(request, DetokenizeRequest)
    _check_model(server, body.model)
    vocab = server.llm.tokenizer.vocab_size
    if any(not 0 <= token < vocab for token in body.tokens):
        raise ApiError(400, f"a token id is outside the vocabulary of {vocab}", param="tokens")
    return {"prompt": server.llm.detokenize(body.tokens)}
