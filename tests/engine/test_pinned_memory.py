import torch

from strata.engine import pinned_memory


def _recording_setter(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", calls.append, raising=False)
    return calls


def test_pinning_from_threads_is_set_for_the_process(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    calls = _recording_setter(monkeypatch)
    monkeypatch.setattr(pinned_memory.os, "cpu_count", lambda: 4)
    assert pinned_memory.pin_from_threads()
    assert calls == ["pinned_use_cuda_host_register:True,pinned_num_register_threads:4"]  # no more threads than cores


def test_a_users_other_settings_are_given_again_with_ours(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    calls = _recording_setter(monkeypatch)
    monkeypatch.setattr(pinned_memory.os, "cpu_count", lambda: 16)
    assert pinned_memory.pin_from_threads()
    assert calls == ["expandable_segments:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:8"]


def test_a_users_own_pinned_setting_is_left_alone(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,pinned_use_cuda_host_register:False")
    calls = _recording_setter(monkeypatch)
    assert not pinned_memory.pin_from_threads() and calls == []


def test_register_threads_stay_within_one_and_the_cap():
    assert pinned_memory.settings(None).endswith(":1")
    assert pinned_memory.settings(64).endswith(f":{pinned_memory.REGISTER_THREADS}")


def test_settings_this_torch_refuses_leave_the_engine_running(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")

    def refuse(text):
        raise RuntimeError("Allocator backend parsed at runtime != allocator backend parsed at load time")

    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", refuse, raising=False)
    assert not pinned_memory.pin_from_threads()
