"""lm-eval's `local-completions` against a real server on loopback.

lm-eval itself (45 packages: datasets, pyarrow, scipy, scikit-learn, ...) is too heavy for the test extras, so the
first tests replay its requests byte for byte as its source (lm_eval/models/openai_completions.py, api_models.py,
utils.RemoteTokenizer) builds them, and read the answers as it parses them. The last two drive lm-eval's own model
class and its `lm_eval` command (a three-question task from a local file, no download) where lm-eval is installed,
and skip, saying so, where it is not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
import torch

import strata

SEED = 1234  # lm-eval's default request seed


def lm_eval_loglikelihood_payload(model: str, prompts: list[list[int]]) -> dict:
    """LocalCompletionsAPI._create_payload(generate=False): token ids in, echo and one logprob back."""
    return {"model": model, "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": SEED,
            "echo": True}


def lm_eval_parse_logprobs(out: dict, ctxlens: list[int]) -> list[tuple[float, bool]]:
    """LocalCompletionsAPI.parse_logprobs: the continuation's summed logprob, and whether greedy would pick it."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), ctxlens):
        token_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        greedy = all(tok == max(top.values()) for tok, top in zip(token_logprobs, top_logprobs))
        res.append((sum(token_logprobs), greedy))
    return res


def _expected(llm, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """The continuation's log-likelihood from the prompt path's logits (float64 log-softmax)."""
    ids = context + continuation
    lp = torch.log_softmax(llm.logits(ids).double(), dim=-1)
    rows = lp[len(context) - 1 : len(ids) - 1]
    target = torch.tensor(continuation)
    return float(rows.gather(1, target[:, None]).sum()), bool(torch.equal(rows.argmax(-1), target))


def test_loglikelihood_requests_as_lm_eval_sends_and_parses_them(server, tool_model):
    llm = strata.LLM(tool_model, device="cpu")
    cases = [("The river runs", " to the sea"), ("Once upon a time", " there was")]
    prompts, ctxlens, expected = [], [], []
    for context_text, continuation_text in cases:
        context, continuation = llm.tokenize(context_text), llm.tokenize(continuation_text)
        prompts.append(context + continuation)
        ctxlens.append(len(context))
        expected.append(_expected(llm, context, continuation))
    # A batch, as lm-eval sends with batch_size > 1; then each alone, as with its default of 1.
    batch = httpx.post(server.url + "/v1/completions", json=lm_eval_loglikelihood_payload("tiny", prompts),
                       timeout=60).json()
    got = lm_eval_parse_logprobs(batch, ctxlens)
    for (logprob, greedy), (want, want_greedy) in zip(got, expected):
        assert logprob == pytest.approx(want, abs=1e-4) and greedy == want_greedy
    for prompt, ctxlen, want in zip(prompts, ctxlens, expected):
        one = httpx.post(server.url + "/v1/completions", json=lm_eval_loglikelihood_payload("tiny", [prompt]),
                         timeout=60).json()
        assert lm_eval_parse_logprobs(one, [ctxlen])[0][0] == pytest.approx(want[0], abs=1e-4)
        assert len(one["choices"][0]["logprobs"]["token_logprobs"]) == len(prompt) + 1


def test_a_greedy_continuation_reads_as_greedy(server, tool_model):
    llm = strata.LLM(tool_model, device="cpu")
    context = llm.tokenize("Rivers and mountains")
    continuation = llm.generate(context, max_tokens=3, temperature=0).token_ids
    out = httpx.post(server.url + "/v1/completions",
                     json=lm_eval_loglikelihood_payload("tiny", [context + continuation]), timeout=60).json()
    assert lm_eval_parse_logprobs(out, [len(context)])[0][1] is True


def test_generate_until_requests_as_lm_eval_sends_them(server):
    """LocalCompletionsAPI._create_payload(generate=True): token ids, stop strings, a seed; the text comes back."""
    payload = {"prompt": [[10, 20, 30], [40, 50]], "model": "tiny", "max_tokens": 4, "temperature": 0,
               "stop": ["\n\n", "Question:"], "seed": SEED}
    out = httpx.post(server.url + "/v1/completions", json=payload, timeout=60).json()
    texts = [None] * len(out["choices"])
    for choice in out["choices"]:
        texts[choice["index"]] = choice["text"]
    assert all(isinstance(text, str) for text in texts) and len(texts) == 2


def test_remote_tokenizer_endpoints_answer_as_lm_eval_probes_them(server, tool_model):
    llm = strata.LLM(tool_model, device="cpu")
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and "<|im_start|>" in info["chat_template"]
    tokens = httpx.post(server.url + "/tokenize", json={"prompt": "test", "add_special_tokens": False}).json()
    assert tokens["tokens"] == llm.tokenize("test")
    eos = httpx.post(server.url + "/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False})
    assert eos.json()["tokens"] == [511]  # RemoteTokenizer.eos_token_id: the first id of the EOS text
    text = httpx.post(server.url + "/detokenize", json={"tokens": llm.tokenize("Hello world")}).json()
    assert text["prompt"] == "Hello world"
    bad = httpx.post(server.url + "/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert httpx.post(server.url + "/tokenize", json={"prompt": 5}).status_code == 400


def test_lm_eval_local_completions_scores_through_the_server(server, tool_model):
    """lm-eval's own LocalCompletionsAPI (remote tokenizer, no Hugging Face files) against the server."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (too heavy for the test extras)")
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    lm = LocalCompletionsAPI(base_url=server.url + "/v1/completions", model="tiny", tokenizer_backend="auto",
                             num_concurrent=1, max_retries=1)
    llm = strata.LLM(tool_model, device="cpu")
    cases = [("The river runs", " to the sea"), ("Once upon a time", " there was")]
    requests = [Instance("loglikelihood", {}, case, i) for i, case in enumerate(cases)]
    scores = lm.loglikelihood(requests)
    for (context, continuation), (logprob, greedy) in zip(cases, scores):
        whole, ctx = llm.tokenize(context + continuation), llm.tokenize(context)  # lm-eval's pair encoding
        want, want_greedy = _expected(llm, ctx, whole[len(ctx):])
        assert logprob == pytest.approx(want, abs=1e-4) and greedy == want_greedy
    texts = lm.generate_until([Instance("generate_until", {}, ("Rivers", {"until": ["\n"], "max_gen_toks": 4}), 0)])
    assert len(texts) == 1 and isinstance(texts[0], str)


TASK = """task: strata_tiny
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
DOCS = [{"question": "The river runs to the", "choices": ["sea", "mountain"], "answer": 0},
        {"question": "Once upon a", "choices": ["time", "river"], "answer": 0},
        {"question": "Rivers and", "choices": ["mountains", "seas", "hills"], "answer": 2}]


def test_the_lm_eval_command_scores_a_local_task_through_the_server(server, tool_model, tmp_path):
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (too heavy for the test extras)")
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (tmp_path / "strata_tiny.yaml").write_text(TASK.format(data=data))
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
                          f"model=tiny,base_url={server.url}/v1/completions", "--tasks", "strata_tiny",
                          "--include_path", str(tmp_path), "--log_samples", "--output_path", str(tmp_path / "out")],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Using remote tokenizer" in run.stderr  # no Hugging Face tokenizer: the server's own
    llm = strata.LLM(tool_model, device="cpu")
    samples = [json.loads(line) for path in (tmp_path / "out").rglob("samples_strata_tiny_*.jsonl")
               for line in path.read_text().splitlines()]
    assert len(samples) == len(DOCS)
    for sample in samples:
        scores = []
        for args, response in zip(sample["arguments"].values(), sample["filtered_resps"]):
            context, continuation = args["arg_0"], args["arg_1"]
            whole, ctx = llm.tokenize(context + continuation), llm.tokenize(context)
            want, _ = _expected(llm, ctx, whole[len(ctx):])
            assert float(response[0]) == pytest.approx(want, abs=1e-4)
            scores.append(want)
        assert sample["acc"] == float(scores.index(max(scores)) == sample["doc"]["answer"])
