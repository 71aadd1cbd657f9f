"""Issue 10 behind an expert cache whose placement is frozen, misses on the CPU pool: free-running greedy --spec T
computes every row it reads (up to its first rejected draft) bit for bit as plain decoding's step at that position.
The prompt streamer runs on the CPU here ("on": the GPU's code path, slots lent for any chunk of 2+ rows), so a
forward that lends slots and keeps them past its end changes the placement a later window sees: the MTP block's
catch-up over several cells (with --spec 2 no draft-after-draft forward gave them back before the window), or an
eager window streamed as a prompt chunk. Hit and miss sums differ in their last bits (the pool reads int16 codes)."""

import pytest
import torch

from strata.engine.engine import Engine, EngineConfig
from strata.engine.expert_cache import ExpertCache
from strata.engine.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 16


@pytest.fixture(scope="module")
def next_mtp_q8(model_dir):
    from strata.models.synthetic import make_model

    return make_model(model_dir / "exact-offload-qwen3next-mtp.gguf", arch="qwen3next", preset="tiny", quant="Q8_0",
                      nextn_layers=1)


def _engine(path, graphs: str, **options) -> Engine:
    # 20 slots of 24 experts (8 a layer, MTP block included): the streamer's ring borrows 10 of them.
    engine = Engine(path, EngineConfig(device="cpu", expert_cache=20, misses="cpu", prefill_stream="on",
                                       decode_graphs=graphs, **options))
    engine.model.experts.cache.adapt_every = 1 << 40  # frozen: one placement for plain and spec alike
    return engine


def _plain_steps(path, graphs: str, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    plain = _engine(path, graphs)
    logits = plain.prefill(prompt)[-1:].float().clone()
    truth, steps = [], []
    for i in range(N):
        truth.append(int(logits[-1].argmax()))
        steps.append(logits[-1].clone())
        logits = plain.decode(truth[-1], len(prompt) + i).float()
    return truth, steps


@pytest.mark.parametrize("graphs", ["eager", "off"])
def test_free_running_spec_rows_behind_a_frozen_cache_are_plain_steps(next_mtp_q8, graphs):
    prompt = torch.randint(0, 512, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    truth, steps = _plain_steps(next_mtp_q8, graphs, prompt)
    spec = _engine(next_mtp_q8, graphs, spec=2)
    seen = []
    verify = spec.spec.verify

    def recording(window, start, tail=None):
        rows = verify(window, start, tail)
        seen.append((start - len(prompt), list(window), rows.float().clone()))
        return rows

    spec.spec.verify = recording
    assert list(spec.generate(prompt, SamplingParams(temperature=0), N)) == truth
    checked = 0
    for at, window, rows in seen:
        for r in range(len(window)):
            if at + r + 1 >= N or window[:r + 1] != truth[at:at + r + 1]:
                break  # a row after a rejected draft: plain decoding never saw its prefix
            assert torch.equal(rows[r], steps[at + r + 1]), f"window at {at}, row {r}"
            checked += 1
    assert checked == N - 1


class _Pending:
    """A copy's event that has not completed (a GPU copy still in flight), on the CPU."""

    def query(self) -> bool:
        return False


def test_a_refilled_slot_is_a_hit_behind_a_wait_an_adapted_one_a_miss_until_landed(next_mtp_q8):
    """The GPU's timing on the CPU: whether a lent slot's refill has landed never changes the placement."""
    engine = _engine(next_mtp_q8, "eager")
    cache: ExpertCache = engine.model.experts.cache
    waits = []
    cache._wait_on_compute = waits.append
    slot = cache.borrow(1)[0]
    lent_key = cache.lent[slot]
    cache.refill()
    pending = _Pending()
    cache.landing[slot] = pending
    cache.restoring.add(slot)  # as refill leaves a slot whose copy is still in flight on the GPU
    hits, misses = cache.lookup(lent_key[0], [lent_key[1]])
    assert hits == {lent_key[1]: slot} and not misses and waits == [pending]
    assert slot not in cache.landing and slot not in cache.restoring
    cache.landing[slot] = pending  # an adapt's admit in flight: a miss (the CPU pool) until it lands
    hits, misses = cache.lookup(lent_key[0], [lent_key[1]])
    assert not hits and misses == [lent_key[1]] and waits == [pending]


def test_direct_misses_table_holds_the_refilled_experts_right_after_a_prompt(next_mtp_q8):
    """`--misses direct`: the slots a prompt lent come back into the device table at its end (before, only at the
    next adapt, never with a frozen cache), so a step after a prompt reads them from their slots, as before it."""
    engine = Engine(next_mtp_q8, EngineConfig(device="cpu", expert_cache=20, misses="direct", prefill_stream="on",
                                              decode_graphs="eager"))
    cache = engine.model.experts.cache
    cache.adapt_every = 1 << 40
    table = cache.device_table
    engine.prefill(torch.randint(0, 512, (9,), generator=torch.Generator().manual_seed(1)).tolist())
    assert engine.model.experts.prompt.stats.bytes_streamed  # the prompt streamed: the ring was lent, given back
    assert not table.waiting
    for (layer, expert), slot in cache.slot_of.items():
        assert int(table.host[table.row[layer], expert]) == slot
