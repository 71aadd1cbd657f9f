"""The monitor shows how far the current request's prompt has been read, chunk by chunk."""

import threading

import pytest

import strata
from strata.engine.prefill import PrefillProgress
from strata.serve.app import RequestCancelled, Server, ServerConfig


class FakeJob:
    def __init__(self):
        self.progress = {"phase": "prompt"}
        self.cancelled = threading.Event()


def test_engine_chunks_reach_the_current_jobs_progress(tiny_moe):
    llm = strata.LLM(tiny_moe, device="cpu", prefill_chunk="auto:4")
    server = Server(llm, ServerConfig(model_name="tiny"))
    try:
        job = FakeJob()
        server.scheduler.current = job
        ids = llm.tokenize("a prompt long enough to be read in several chunks of four tokens")
        seen = []
        original = server.prompt_progress

        def watch(p):
            original(p)
            seen.append(dict(job.progress))

        llm.engine.on_prefill_progress = watch
        llm.engine.prefill(ids)
        read = [s["prompt_read"] for s in seen]
        assert read == sorted(set(read)) and read[-1] == len(ids) and len(read) == -(-len(ids) // 4)
        assert all(s["prompt_to_read"] == len(ids) for s in seen)
        job.cancelled.set()  # the client left: the next chunk stops the prompt, and the cache holds what was read
        with pytest.raises(RequestCancelled):
            llm.engine.prefill(llm.tokenize("another prompt, read in chunks of four tokens, cut short"))
        assert job.progress["prompt_read"] == 4 and len(llm.engine.cached_tokens) == 4
        assert server.metrics.last["finish_reason"] == "cancelled" and server.metrics.last["prompt_tokens"] == 4
        server.scheduler.current = None
        original(PrefillProgress(1, 2, 0.0))  # no current job: nothing to update, and no error
    finally:
        server.scheduler.stop()
