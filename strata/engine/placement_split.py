"""The placement plan of a model split across several cards (`--gpus 0,1 --layer-split auto|K1,K2`).

Each card holds a contiguous range of layers: their dense weights, their KV (or GatedDeltaNet) state, and a cache of
their routed experts sized to what is left of its memory; the first card also holds the embedding, the last the head
(and any MTP blocks). `auto` picks the split that gives every card the same share of its own layers' experts in its
cache (when all fit, that balances the cards' free memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.engine.placement import HOST_TENSORS, RESERVE_BYTES, GiB, cache_bytes
from strata.errors import StrataError
from strata.gguf.reader import GGUFModelFile
from strata.models.config import ModelConfig

HEAD_TENSORS = ("output.weight", "output_norm.weight")
SPLIT_ARCHS = ("qwen2", "qwen3", "qwen2moe", "qwen3moe", "qwen3next")  # qwen4exp's hyper-connection residual: not yet


def parse_gpus(text: str) -> tuple[torch.device, ...]:
    """`--gpus`: CUDA indices ("0,1"; "0,0" runs two stages on one card) or torch devices ("cpu,cpu", "cuda:1")."""
    names = [t.strip() for t in str(text).split(",")]
    if len(names) < 2 or not all(names):
        raise StrataError(f"--gpus needs two or more cards, comma-separated (e.g. 0,1), got {text!r}")
    devices = []
    for name in names:
        try:
            device = torch.device(f"cuda:{name}" if name.isdigit() else name)
        except RuntimeError:
            raise StrataError(f"--gpus: {name!r} is neither a GPU index nor a torch device") from None
        if device.type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            index = device.index if device.index is not None else 0
            if index >= count:
                raise StrataError(f"--gpus: GPU {index} does not exist (this machine has {count} CUDA GPU(s))")
            device = torch.device("cuda", index)
        elif device.type != "cpu":
            raise StrataError(f"--gpus: {name!r} is not a CUDA GPU or the CPU")
        devices.append(device)
    if len({d.type for d in devices}) > 1:
        raise StrataError(f"--gpus {text}: all CUDA GPUs or all CPU stand-ins, not a mix")
    return tuple(devices)


def parse_layer_split(text: str) -> str | tuple[int, ...]:
    """`--layer-split`: "auto" or layer counts per card ("24,24")."""
    if text == "auto":
        return "auto"
    parts = [t.strip() for t in str(text).split(",")]
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise StrataError(f"--layer-split must be 'auto' or layer counts per card >= 1 (e.g. 24,24), got {text!r}")
    return tuple(int(p) for p in parts)


@dataclass(frozen=True)
class LayerSplit:
    """Which card (stage) holds each layer; what the model loader and the caches need of the plan."""

    devices: tuple[torch.device, ...]
    bounds: tuple[int, ...]  # first layer of each stage, then the number of main layers
    experts_on_host: tuple[bool, ...]  # per stage: its experts stay in host RAM behind its cache

    @property
    def n_stages(self) -> int:
        return len(self.devices)

    def stage_of(self, layer: int) -> int:
        """Layers past the main ones (MTP blocks) go with the head, on the last card."""
        for stage in range(self.n_stages):
            if layer < self.bounds[stage + 1]:
                return stage
        return self.n_stages - 1

    def layers(self, stage: int) -> range:
        return range(self.bounds[stage], self.bounds[stage + 1])

    def device_of_tensor(self, name: str) -> torch.device:
        """Where the loader puts a tensor: a layer's on its card (experts in host RAM where that card caches them),
        the head on the last card, the embedding on the first."""
        if name.startswith("blk."):
            stage = self.stage_of(int(name.split(".")[1]))
            if "_exps." in name and self.experts_on_host[stage]:
                return torch.device("cpu")
            return self.devices[stage]
        return self.devices[-1] if name in HEAD_TENSORS else self.devices[0]


@dataclass(frozen=True)
class CardPlan:
    device: str
    layers: range
    budget: int | None  # bytes; None where nothing bounds it (a CPU "card")
    dense_bytes: int
    kv_bytes: int
    work_bytes: int
    expert_bytes: int  # this card's layers' routed experts
    expert_bytes_each: int
    n_experts: int
    n_slots: int

    @property
    def all_resident(self) -> bool:
        return self.n_slots >= self.n_experts


@dataclass(frozen=True)
class SplitPlan:
    cards: tuple[CardPlan, ...]
    split: LayerSplit

    # The totals a one-card PlacementPlan offers, for the benches that print them.
    @property
    def all_resident(self) -> bool:
        return all(c.all_resident for c in self.cards)

    @property
    def dense_bytes(self) -> int:
        return sum(c.dense_bytes for c in self.cards)

    @property
    def dense_read_bytes(self) -> int:  # the cards keep no second copies (STRATA_DP4A_SPLIT's are one card's)
        return self.dense_bytes

    @property
    def expert_bytes(self) -> int:
        return sum(c.expert_bytes for c in self.cards)

    @property
    def expert_bytes_each(self) -> int:
        return max(c.expert_bytes_each for c in self.cards)

    @property
    def n_slots(self) -> int:
        return sum(c.n_slots for c in self.cards)

    def chunk_room(self) -> int | None:
        """What a prompt chunk's activations may use: the least free memory of any card, within its budget."""
        rooms = []
        devices = [c.device for c in self.cards]
        for card in self.cards:
            if not card.device.startswith("cuda"):
                continue
            free = torch.cuda.mem_get_info(torch.device(card.device))[0] // devices.count(card.device)
            if card.budget is not None:
                experts = card.expert_bytes if card.all_resident else card.n_slots * card.expert_bytes_each
                free = min(free, card.budget - card.dense_bytes - card.kv_bytes - experts)
            rooms.append(max(free, 0))
        return min(rooms) if rooms else None

    def describe(self) -> str:
        lines = [f"layer split over {len(self.cards)} cards (the residual crosses each boundary once per step)"]
        for i, c in enumerate(self.cards):
            budget = "unbounded" if c.budget is None else f"{c.budget / GiB:.2f} GiB"
            extra = " + embedding" if i == 0 else ""
            extra += " + head" if i == len(self.cards) - 1 else ""
            share = c.n_slots / c.n_experts if c.n_experts else 1.0
            lines += [
                f"card {i}  {c.device} (budget {budget}): layers {c.layers.start}-{c.layers.stop - 1}{extra}",
                f"  dense weights {c.dense_bytes / GiB:8.3f} GiB, KV/state {c.kv_bytes / GiB:8.3f} GiB, "
                f"work {c.work_bytes / GiB:.3f} GiB",
                f"  experts       {c.n_slots} of {c.n_experts} on the card ({share:.1%}"
                + (", all resident)" if c.all_resident else
                   f", slots of {c.expert_bytes_each / 2**20:.2f} MiB; the rest in host RAM, misses on its CPU pool)"),
            ]
        return "\n".join(lines)


@dataclass(frozen=True)
class _LayerCosts:
    dense: list[int]  # per main layer
    kv: list[int]
    experts: list[int]  # bytes of routed experts per main layer
    counts: list[int]  # routed experts per main layer
    first_extra: int  # embedding
    last_extra: int  # head, and the MTP blocks' dense weights
    last_experts: int  # the MTP blocks' routed experts (cached on the last card)
    last_counts: int
    each: int


def _layer_costs(model: GGUFModelFile, config: ModelConfig, n_main: int, n_ctx: int, per_value: float) -> _LayerCosts:
    n = config.n_layers
    dense, experts, counts = [0] * n, [0] * n, [0] * n
    first = last = 0
    for t in model.tensors.values():
        if t.name in HOST_TENSORS:
            continue
        if t.name.startswith("blk."):
            layer = int(t.name.split(".")[1])
            if "_exps." in t.name:
                experts[layer] += t.n_bytes
                counts[layer] = t.shape[0]
            else:
                dense[layer] += t.n_bytes
        elif t.name in HEAD_TENSORS:
            last += t.n_bytes
        else:
            first += t.n_bytes
    if config.tied_embeddings:
        last += model.tensor("token_embd.weight").n_bytes  # the head reads the embedding: a copy on the last card
    recurrent = config.recurrent_layers if config.is_hybrid else (False,) * n
    attention_kv = cache_bytes(config, n_ctx, per_value) - cache_bytes(config, 0, per_value)
    n_attention = max(1, recurrent[:n].count(False))
    n_recurrent = max(1, recurrent[:n].count(True))
    state = cache_bytes(config, 0, per_value) // n_recurrent
    kv = [state if i < len(recurrent) and recurrent[i] else attention_kv // n_attention for i in range(n_main)]
    each = max((experts[i] // counts[i] for i in range(n) if counts[i]), default=0)
    return _LayerCosts(dense[:n_main], kv, experts[:n_main], counts[:n_main], first, last + sum(dense[n_main:]),
                       sum(experts[n_main:]), sum(counts[n_main:]), each)


def plan_split(model: GGUFModelFile, config: ModelConfig, devices: tuple[torch.device, ...], n_ctx: int,
               per_value: float, vram_budget_gib: float | None = None, layer_split: str | tuple[int, ...] = "auto",
               expert_cache: str | int = "auto") -> SplitPlan:
    """The split of the main layers over `devices`; `vram_budget_gib` bounds each card (else its free memory)."""
    if config.arch not in SPLIT_ARCHS:
        raise StrataError(f"{model.path}: --gpus splits {', '.join(SPLIT_ARCHS)} models, not {config.arch} yet")
    n_main = config.n_layers - config.nextn_layers
    n_cards = len(devices)
    if n_main < n_cards:
        raise StrataError(f"{model.path}: {n_main} layers cannot be split over {n_cards} cards")
    costs = _layer_costs(model, config, n_main, n_ctx, per_value)
    work = 512 * (8 * config.n_embd + config.vocab_size) * 4  # as plan_placement: a generous bound for a chunk
    budgets = [_budget(d, vram_budget_gib, devices.count(d)) for d in devices]

    def fixed(card: int, begin: int, end: int) -> int:
        extra = (costs.first_extra if card == 0 else 0) + (costs.last_extra if card == n_cards - 1 else 0)
        return sum(costs.dense[begin:end]) + sum(costs.kv[begin:end]) + work + RESERVE_BYTES + extra

    def experts(card: int, begin: int, end: int) -> tuple[int, int]:
        tail = card == n_cards - 1
        return (sum(costs.experts[begin:end]) + (costs.last_experts if tail else 0),
                sum(costs.counts[begin:end]) + (costs.last_counts if tail else 0))

    def room(card: int, begin: int, end: int) -> float:
        return float("inf") if budgets[card] is None else budgets[card] - fixed(card, begin, end)

    if layer_split == "auto":
        bounds = _auto_bounds(n_main, n_cards, room, experts, budgets)
    else:
        if len(layer_split) != n_cards or sum(layer_split) != n_main:
            raise StrataError(f"--layer-split {','.join(map(str, layer_split))} must give {n_cards} layer counts "
                              f"(one per card of --gpus) summing to the model's {n_main} layers")
        bounds = [0]
        for count in layer_split:
            bounds.append(bounds[-1] + count)
    cards = []
    slots_asked = _share_slots(expert_cache, [experts(i, bounds[i], bounds[i + 1])[1] for i in range(n_cards)])
    for i, device in enumerate(devices):
        begin, end = bounds[i], bounds[i + 1]
        need = fixed(i, begin, end)
        if budgets[i] is not None and need > budgets[i]:
            raise StrataError(f"{model.path}: card {i} ({device}) cannot hold layers {begin}-{end - 1}: their dense "
                              f"weights, KV for {n_ctx} tokens and work buffers need {need / GiB:.2f} GiB, its budget "
                              f"is {budgets[i] / GiB:.2f} GiB (move layers to another card with --layer-split)")
        expert_bytes, n_experts = experts(i, begin, end)
        fit = n_experts if budgets[i] is None or not costs.each else int(room(i, begin, end) // costs.each)
        if slots_asked is None:
            slots = min(n_experts, fit)
        else:
            slots = min(slots_asked[i], n_experts)
            if slots > fit:
                raise StrataError(f"--expert-cache: card {i} ({device}) can hold {fit} expert slots, not {slots}")
        cards.append(CardPlan(str(device), range(begin, end), budgets[i], need - work - RESERVE_BYTES - sum(
            costs.kv[begin:end]), sum(costs.kv[begin:end]), work, expert_bytes, costs.each, n_experts, slots))
    split = LayerSplit(tuple(devices), tuple(bounds), tuple(not c.all_resident for c in cards))
    return SplitPlan(tuple(cards), split)


def _budget(device: torch.device, vram_budget_gib: float | None, stages_on_it: int) -> int | None:
    """--vram-budget per stage; else the card's free memory, shared by the stages it holds (`--gpus 0,0`)."""
    if vram_budget_gib is not None:
        return int(vram_budget_gib * GiB)
    return torch.cuda.mem_get_info(device)[0] // stages_on_it if device.type == "cuda" else None


def _share_slots(expert_cache: str | int, counts: list[int]) -> list[int] | None:
    """A number of slots (--expert-cache N) is shared by the cards in proportion to their experts."""
    if expert_cache == "auto":
        return None
    total = int(expert_cache)
    if total < 0:
        raise StrataError(f"--expert-cache must be 'auto' or a number of experts >= 0, got {expert_cache}")
    all_experts = max(sum(counts), 1)
    shares = [total * c // all_experts for c in counts]
    shares[0] += total - sum(shares)
    return shares


def _auto_bounds(n_main: int, n_cards: int, room, experts, budgets) -> list[int]:
    """Contiguous ranges maximising the smallest cached share (room / expert bytes) over the cards: a binary search
    on that share, each card taking as many layers as keep its share above it."""
    if all(b is None for b in budgets):  # nothing bounds the cards (CPU): equal layer counts
        return [n_main * i // n_cards for i in range(n_cards + 1)]

    def share(card: int, begin: int, end: int) -> float:
        return room(card, begin, end) / max(experts(card, begin, end)[0], 1)

    def greedy(target: float) -> list[int] | None:
        bounds = [0]
        for card in range(n_cards - 1):
            begin, best = bounds[-1], None
            for end in range(begin + 1, n_main - (n_cards - 1 - card) + 1):
                if share(card, begin, end) < target:
                    break
                best = end
            if best is None:
                return None
            bounds.append(best)
        return bounds + [n_main] if share(n_cards - 1, bounds[-1], n_main) >= target else None

    if greedy(0.0) is None:
        raise StrataError(f"the cards of --gpus cannot hold the model's dense weights and KV however its {n_main} "
                          "layers are split (lower --ctx, raise --vram-budget, or add a card)")
    low, high = 0.0, 1.0
    while greedy(high) is not None and high < 1e12:
        low, high = high, high * 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if greedy(middle) is not None else (low, middle)
    return greedy(low)
