"""The prompt expert paths with their work buffers cut from borrowed slot bytes (`WorkArena`): every buffer a view into
the slots, aligned, within `prompt_work_bytes`, and the very same output bytes as with PyTorch's allocator."""

import pytest
import torch

from strata.bench.moe_prefill import make_layer
from strata.kernels.moe.prefill import PATHS, moe_prefill_ref, moe_prefill_triton, prompt_work_bytes
from strata.kernels.work_arena import ALIGN, WorkArena, aligned_bytes

N_TOKENS, N_EXPERTS, N_EMBD, N_FF, TOP_K = 24, 12, 64, 64, 4


class RecordingArena(WorkArena):
    def __init__(self, memory):
        super().__init__(memory)
        self.taken = []

    def empty(self, shape, dtype):
        tensor = super().empty(shape, dtype)
        self.taken.append(tensor)
        return tensor


def _slot_run(device, need: int, slot_bytes: int = 1237, first: int = 3):
    """An odd-sized slot tensor (as an expert cache has) and a flat view of `first`.. enough adjacent slots."""
    n_run = -(-need // slot_bytes)
    slots = torch.full((first + n_run + 2, slot_bytes), 0x7F, dtype=torch.uint8, device=device)  # stale bytes
    return slots, slots[first : first + n_run].view(-1)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kernels", ["triton", "ref"])
def test_work_buffers_live_in_slot_memory_and_change_no_byte(device, path, kernels):
    layer = make_layer("Q2_0 / Q2_0", N_TOKENS, n_experts=N_EXPERTS, n_embd=N_EMBD, n_ff=N_FF, top_k=TOP_K, seed=3,
                       device=device)
    run = moe_prefill_triton if kernels == "triton" else moe_prefill_ref
    args = (layer.x, layer.topk_ids, layer.topk_weights, layer.experts, path)
    expected = run(*args)
    need = prompt_work_bytes(N_TOKENS, TOP_K, N_EXPERTS, N_EMBD, N_FF, path=path)
    slots, memory = _slot_run(device, need)
    arena = RecordingArena(memory)
    for _ in range(2):  # a second layer reuses the range (reset), over the first one's leftovers
        assert torch.equal(run(*args, scratch=arena), expected)
    assert arena.taken and arena.overflow_bytes == 0 and 0 < arena.high_water <= need
    for tensor in arena.taken:
        assert arena.owns(tensor) and tensor.data_ptr() % ALIGN == 0
    outside = torch.cat([slots[:3].reshape(-1), slots.view(-1)[memory.numel() + 3 * slots.shape[1]:]])
    assert (outside == 0x7F).all()  # nothing written past the borrowed run


def test_arena_overflow_goes_to_the_allocator_and_is_counted():
    arena = WorkArena(torch.zeros(1000, dtype=torch.uint8))
    inside = arena.empty((100,), torch.float32)
    outside = arena.empty((200,), torch.float32)  # 400 + 800 bytes > 1000
    assert arena.owns(inside) and not arena.owns(outside) and arena.overflow_bytes == 800
    arena.reset()
    assert arena.owns(arena.zeros((10, 10), torch.int32)) and arena.used <= 400 + ALIGN
    assert aligned_bytes([((100,), torch.float32), ((3,), torch.int8)]) == ALIGN + 512 + ALIGN
    with pytest.raises(ValueError):
        WorkArena(torch.zeros(10, 10, dtype=torch.uint8))


def test_fused_fp16_shapes_take_their_buffers_from_the_arena_too(device):
    from strata.kernels.moe.stack import Tiles
    layer = make_layer("Q2_0 / Q2_0", N_TOKENS, n_experts=N_EXPERTS, n_embd=N_EMBD, n_ff=N_FF, top_k=TOP_K, seed=3,
                       device=device)
    args = (layer.x, layer.topk_ids, layer.topk_weights, layer.experts, "fused")
    tiles = Tiles.parse("32x4x2h/64x4x2h")
    expected = moe_prefill_triton(*args, tiles=tiles)
    need = prompt_work_bytes(N_TOKENS, TOP_K, N_EXPERTS, N_EMBD, N_FF, path="fused")
    arena = RecordingArena(_slot_run(device, need)[1])
    assert torch.equal(moe_prefill_triton(*args, tiles=tiles, scratch=arena), expected)
    assert torch.float16 in {t.dtype for t in arena.taken}  # x and H as fp16
    assert arena.overflow_bytes == 0 and arena.high_water <= need


def test_work_bytes_cover_a_fused_default_of_128_rows_and_fp16_buffers(monkeypatch):
    from strata.kernels.moe import prefill, stack
    from strata.kernels.moe.stack import Tiles
    layer = make_layer("Q2_0 / Q2_0", 8, n_experts=N_EXPERTS, n_embd=N_EMBD, n_ff=N_FF, top_k=TOP_K)
    args = (256, TOP_K, 64, 2560, 640)  # few tokens, many experts: 128-row tiles pad the most
    monkeypatch.setitem(stack.MEASURED_Q2_0, "gate_up", Tiles(32, 4, 2, split=True))  # session 5's 64-row default
    monkeypatch.setitem(stack.MEASURED_Q2_0, "down", Tiles(64, 4, 2, split=True))
    before = prompt_work_bytes(*args, path="fused")
    assert prefill._group_rows("fused", layer.experts, None, True) == 64
    assert before == aligned_bytes(prefill.prompt_work_buffers(*args)) > aligned_bytes(prefill.fused_q2_0_buffers(*args))
    monkeypatch.undo()  # today's default: 128 rows, fp16 buffers
    assert stack.MEASURED_Q2_0["gate_up"].rows == 128 and stack.MEASURED_Q2_0["gate_up"].fp16
    assert prefill.fused_q2_0_buffers(*args)[-1][1] == torch.float16  # the "o" down shape stores its rows as fp16
    assert prefill._group_rows("fused", layer.experts, None, True) == 128  # the grouping follows the default
    assert prefill._group_rows("mmq", layer.experts, None, True) == 64
    fused = aligned_bytes(prefill.fused_q2_0_buffers(*args))
    assert fused != before and prompt_work_bytes(*args, path="fused") == max(before, fused)
    assert prompt_work_bytes(*args) == before  # the default path (mmq) does not lend slots for the opt-in one's
