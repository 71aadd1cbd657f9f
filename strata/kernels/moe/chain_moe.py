"""An MoE layer's decode half in ONE launch (STRATA_DECODE_CHAIN): (`o`) the attention's o projection (the dense
matvec, `oneshot_gemv`), the residual add + norm + router + top-k (`add_norm_route.py`), the experts' gate/up +
SwiGLU and their down sum (`oneshot_gemv.py`), and (`next_norm`, JOIN) the layer's closing residual add + next
norm (`add_rms_norm.py`), chained by counters.

Today these are five launches of 6.1, 5.6, 9.4, 6.1 and 1.7 us (A3B, H200) for ~5.5 us of bytes: each pays its
ramp-up and tail. Here every program first claims a work item from a per-launch ticket (`atomic_add`): the o
items (row tiles), the routing kernel's programs, the gate/up kernel's (pair, row tile), the down kernel's (token,
row tile), then a norm item a token, so an item's phase is known from its number. Tickets are claimed in order by
programs already running, so a program that waits (spins on a done-counter) waits only for items of smaller
numbers, held by running programs that never wait for it: no deadlock whatever the hardware's dispatch order, and
under TRITON_INTERPRET=1 (programs one after another) every wait is already satisfied when reached, so the CPU
tests run this very code.

- o item: loads its weight rows, waits for the predecessor (PDL), then the heads; counts itself done.
- routing item: (o) waits for every o item (delta complete); then as its kernel's program; its token's last
  arrival (which wrote the top-k) counts the token routed.
- gate/up item: waits until every token is routed (it needs its expert's id before any weight), then the gate/up
  program's body; counts itself done.
- down item: waits for the routing, loads its experts' weights (`down_fetch`), then waits for every gate/up item
  (H complete) and runs the down program's dots and store (`down_dots`); counts itself done (JOIN).
- norm item (JOIN): waits for every down item, then `add_rms_norm_row` of its token (residual + y, next norm).

Each phase is its kernel's own body (the same operations in the same order), so the bytes are the unchained
kernels' wherever the compiler lays a phase out as its own kernel does: always under the interpreter; on a GPU the
one launch has one warp count, and a phase run at another count than its kernel's may sum in another order
(`bench moe-chain` checks the bytes against the separate launches at the chain's warps; tools/device/chain_check.py
reports the logits against the default). The last program to finish (a finished-count) puts the counters back to
zero for the next launch, so a captured graph needs no memset. Counters are per call site (the layer).

Measured (session 9, H200, A3B all resident, the default config, both chains): the same greedy tokens, but the
GPU step 1.95 -> 2.74 ms. Not yet tuned: `bench moe-chain --sweep` times the configs (warps, rows, routing items,
the poll back-off) against the separate launches.

PDL (kernels/pdl.py): every program calls `pdl_wait` before its first read of the step's data and before any
store. Without the o phase it waits first of all, before its ticket: the launch then touches its counters only
once every earlier kernel of the stream has completed (whatever launches came before, this site's previous one
included). With it, the ticket comes first, so that the o items stream their weights while attention finishes;
every other item waits right after its ticket. That early ticket needs the site's previous launch complete,
which the step guarantees: one site runs once a step, and every step starts with launches that take no PDL (the
embedding's torch ops), which start only once everything before them has completed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from strata.kernels import INTERPRETED
from strata.kernels.moe.oneshot_gemv import _units, down_dots, down_fetch, gate_up_item
from strata.kernels.pdl import launch_options, pdl_start, pdl_wait
from strata.kernels.pointwise.add_norm_route import add_norm_route_item
from strata.kernels.pointwise.add_rms_norm import add_rms_norm_row

# Counter offsets (constexpr: the kernel reads them): the ticket, tokens routed, gate/up items done, programs
# finished, waits given up (SPIN_LIMIT), down items done (JOIN), o-projection items done (O), then each token's
# arrival count (add_norm_route's). Each on its own 128-byte line: hundreds of waiting programs poll a done-count,
# which must not slow the ticket's and the arrivals' atomics on the same L2 line.
LINE = 32  # int32 counters a 128-byte line
TICKET, ROUTED, GATE_UP_DONE, FINISHED, GAVE_UP, DOWN_DONE, O_DONE, ARRIVALS = (
    tl.constexpr(i * LINE) for i in range(8))
MAX_ROWS = 64  # tokens a launch routes (verify windows)
COUNTERS = ARRIVALS.value + MAX_ROWS
GPU_WARPS = 8  # one launch, one warp count for every phase (see ChainConfig)
CHAIN_ROUTE_EXPERTS = 4  # router rows a routing item by default: A3B's 128 in 32 items (add_norm_route's own
# launch takes 1 a program at one warp; the chain's items run at the chain's warps)


@dataclass(frozen=True)
class ChainConfig:
    """Tunables (`strata bench moe-chain --sweep` times the alternatives); 0: the reasoned default.

    On a GPU the launch runs every phase at `warps` (GPU_WARPS: the router's and the o matvec's 8; the down
    kernel's own 16 puts 72 registers x 512 threads on an SM, one program of A3B's shape resident per SM, where 8
    warps at 94 keep two), and a phase's rows (`gate_up_bn`, `down_bn`, `o_bn`) default to its kernel's tile
    halved until a thread holds at most oneshot_gemv.WORDS_PER_THREAD code words at that warp count (A3B Q4_0:
    gate/up 8 rows, down 4, o 8). Under the interpreter: the unchained kernels' tiles (warps mean nothing there)."""

    warps: int = 0
    gate_up_bn: int = 0
    down_bn: int = 0
    o_bn: int = 0  # rows an o projection item (and a q/k/v matvec item: kernels/pointwise/chain_qkv_store.py)
    route_experts: int = 0  # router rows a routing item (0: CHAIN_ROUTE_EXPERTS)
    nap_ns: int = 0  # a waiting program sleeps this long between polls of a done-count (0: polls back to back)


DEFAULT = ChainConfig()


def parse_config(text: str) -> ChainConfig:
    """'W:G:D[:O[:R[:N]]]' (0: the default's; fewer fields: the rest 0) -> ChainConfig; '1' -> DEFAULT."""
    from strata.errors import StrataError

    try:
        fields = [int(f) for f in text.split(":")] if text.strip() != "1" else []
    except ValueError:
        fields = None
    if fields is None or len(fields) > 6 or any(f < 0 for f in fields):
        raise StrataError(f"STRATA_DECODE_CHAIN={text!r}: expected 1 or "
                          "WARPS:GATE_UP_BN:DOWN_BN[:O_BN[:ROUTE[:NAP_NS]]] (e.g. 8:8:4)")
    return ChainConfig(*fields)


if INTERPRETED:  # (no inline assembly under the interpreter, where no wait ever polls twice)
    @triton.jit
    def _nap(NS: tl.constexpr):
        pass
else:
    @triton.jit
    def _nap(NS: tl.constexpr):
        """Sleep about NS ns (sm_70+ `nanosleep`): fewer polls of a hot L2 line from hundreds of waiting programs."""
        tl.inline_asm_elementwise("nanosleep.u32 $1;\n\tmov.u32 $0, 0;", "=r,r", [tl.full((), NS, tl.int32)],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait_for(counter, target, gave_up, SPIN_LIMIT: tl.constexpr, NAP: tl.constexpr = 0):
    """Spin until *counter >= target (done-counts of items with smaller tickets, all held by running programs),
    then acquire what they released. SPIN_LIMIT (tests only; 0 = forever): give up after that many reads, count it
    in *gave_up and return False, so a test can hold a counter back without hanging the interpreter. NAP: sleep
    about that many ns between reads (ChainConfig.nap_ns)."""
    seen = tl.load(counter, volatile=True)
    if SPIN_LIMIT == 0:
        while seen < target:
            if NAP:
                _nap(NAP)
            seen = tl.load(counter, volatile=True)
    else:
        spins = 0
        while (seen < target) & (spins < SPIN_LIMIT):
            if NAP:
                _nap(NAP)
            seen = tl.load(counter, volatile=True)
            spins += 1
    seen = tl.atomic_add(counter, 0, sem="acquire", scope="gpu")  # the increments' stores visible from here
    ready = seen >= target
    if not ready:
        tl.atomic_add(gave_up, 1, sem="relaxed", scope="gpu")
    return ready


@triton.jit
def _count_done(counter):
    tl.debug_barrier()  # every thread's stores are issued before the program counts itself (release)
    tl.atomic_add(counter, 1, sem="release", scope="gpu")


@triton.jit
def dense_matvec_item(item, w, x_ptr, ones_ptr, out_ptr, done, BN: tl.constexpr, NT: tl.constexpr,
                      PER: tl.constexpr, N_UNITS: tl.constexpr, NU: tl.constexpr, N_OUT: tl.constexpr,
                      K: tl.constexpr, FMT: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                      UNITS_PER_BLOCK: tl.constexpr, UNIT_W: tl.constexpr, T: tl.constexpr, PDL: tl.constexpr):
    """A dense matvec's program as a chain's item (the o projection here, the q/k/v one in chain_qkv_store): its
    rows' weights loaded, then the PDL wait, then the dots of the rows x, then the item counted in `done`."""
    rows = item * BN + tl.arange(0, BN)
    t = tl.arange(0, NT)
    g, um = _units(1, PER, N_UNITS, NU)
    index = tl.where(um, 0, -1)  # one "expert" at stride 0
    word, s0, s1, s2, s3 = down_fetch(w, 0, rows, t, g % N_UNITS, index, N_OUT, FMT, N_UNITS, BLOCK_BYTES,
                                      UNITS_PER_BLOCK)
    pdl_wait(PDL)
    down_dots(x_ptr, ones_ptr, out_ptr, 0, rows, t, g // N_UNITS, g % N_UNITS, um, index, word, s0, s1, s2, s3,
              N_OUT, 1, K, FMT, N_UNITS, UNIT_W, T, True)
    _count_done(done)


@triton.jit
def _chain_moe_kernel(h_ptr, d_ptr, nw_ptr, router_ptr, res_ptr, x_ptr, logits_ptr, weights_ptr, ids_ptr,
                      n_cols, n_experts, eps, slot_of, wg, wu, wd, hid, y, stride_g, stride_u, stride_d, counters,
                      nw2_ptr, res2_ptr, out2_ptr, a_ptr, wo, ones_ptr, JOIN: tl.constexpr, T: tl.constexpr,
                      TOP_K: tl.constexpr, SLOTS: tl.constexpr,
                      BLOCK: tl.constexpr, EB: tl.constexpr, PROGRAMS: tl.constexpr, NORMALIZE: tl.constexpr,
                      EBLOCK: tl.constexpr, KB: tl.constexpr,
                      G_N_OUT: tl.constexpr, G_K: tl.constexpr, G_FMT: tl.constexpr, G_N_UNITS: tl.constexpr,
                      G_UNIT_W: tl.constexpr, G_NT: tl.constexpr, G_BN: tl.constexpr, G_NU: tl.constexpr,
                      G_PER: tl.constexpr, G_BLOCK_BYTES: tl.constexpr, G_UNITS_PER_BLOCK: tl.constexpr,
                      D_N_OUT: tl.constexpr, D_K: tl.constexpr, D_FMT: tl.constexpr, D_N_UNITS: tl.constexpr,
                      D_UNIT_W: tl.constexpr, D_NT: tl.constexpr, D_BN: tl.constexpr, D_NU: tl.constexpr,
                      D_PER: tl.constexpr, D_BLOCK_BYTES: tl.constexpr, D_UNITS_PER_BLOCK: tl.constexpr,
                      O: tl.constexpr = 0, O_N_OUT: tl.constexpr = 0, O_K: tl.constexpr = 0, O_FMT: tl.constexpr = 0,
                      O_N_UNITS: tl.constexpr = 1, O_UNIT_W: tl.constexpr = 0, O_NT: tl.constexpr = 1,
                      O_BN: tl.constexpr = 1, O_NU: tl.constexpr = 1, O_PER: tl.constexpr = 0,
                      O_BLOCK_BYTES: tl.constexpr = 0, O_UNITS_PER_BLOCK: tl.constexpr = 1,
                      SPIN_LIMIT: tl.constexpr = 0, NAP: tl.constexpr = 0, PDL: tl.constexpr = 0):
    pdl_start(PDL)
    O_ITEMS: tl.constexpr = (O_N_OUT + O_BN - 1) // O_BN if O else 0
    ROUTE_ITEMS: tl.constexpr = PROGRAMS * T
    G_TILES: tl.constexpr = (G_N_OUT + G_BN - 1) // G_BN
    GATE_UP_ITEMS: tl.constexpr = T * TOP_K * G_TILES
    D_TILES: tl.constexpr = (D_N_OUT + D_BN - 1) // D_BN
    DOWN_ITEMS: tl.constexpr = T * D_TILES
    ITEMS: tl.constexpr = O_ITEMS + ROUTE_ITEMS + GATE_UP_ITEMS + DOWN_ITEMS + (T if JOIN else 0)
    if not O:  # before the ticket: every earlier launch, this site's last one too, has completed
        pdl_wait(PDL)
    item = tl.atomic_add(counters + TICKET, 1, sem="relaxed", scope="gpu")
    if item < O_ITEMS:  # the o projection's rows (the dense matvec's program): weights, wait, then the heads
        dense_matvec_item(item, wo, a_ptr, ones_ptr, d_ptr, counters + O_DONE, O_BN, O_NT, O_PER, O_N_UNITS, O_NU,
                          O_N_OUT, O_K, O_FMT, O_BLOCK_BYTES, O_UNITS_PER_BLOCK, O_UNIT_W, T, PDL)
    elif item < O_ITEMS + ROUTE_ITEMS:  # (PDL 0: the body's own wait is the one above)
        if O:
            pdl_wait(PDL)
        r_item = item - O_ITEMS
        ready = True
        if O:  # delta is the o items' output
            ready = _wait_for(counters + O_DONE, O_ITEMS, counters + GAVE_UP, SPIN_LIMIT, NAP)
        if ready:
            last = add_norm_route_item(r_item % PROGRAMS, (r_item // PROGRAMS).to(tl.int64), h_ptr, d_ptr, nw_ptr,
                                       router_ptr, res_ptr, x_ptr, logits_ptr, counters + ARRIVALS, weights_ptr,
                                       ids_ptr, n_cols, n_experts, eps, BLOCK, EB, PROGRAMS, TOP_K, NORMALIZE, EBLOCK,
                                       KB, 0)
            if last:  # this token's weights and ids are written
                _count_done(counters + ROUTED)
    elif item < O_ITEMS + ROUTE_ITEMS + GATE_UP_ITEMS:
        if O:
            pdl_wait(PDL)
        g_item = item - O_ITEMS - ROUTE_ITEMS
        if _wait_for(counters + ROUTED, T, counters + GAVE_UP, SPIN_LIMIT, NAP):
            gate_up_item(x_ptr, ids_ptr, slot_of, wg, wu, hid, stride_g, stride_u, g_item // G_TILES,
                         g_item % G_TILES, G_N_OUT, TOP_K, G_K, G_FMT, G_N_UNITS, G_UNIT_W, G_NT, SLOTS, G_BN, G_NU,
                         1, G_PER, G_BLOCK_BYTES, G_UNITS_PER_BLOCK, False)
            _count_done(counters + GATE_UP_DONE)
    elif item < O_ITEMS + ROUTE_ITEMS + GATE_UP_ITEMS + DOWN_ITEMS:
        if O:
            pdl_wait(PDL)
        d_item = item - O_ITEMS - ROUTE_ITEMS - GATE_UP_ITEMS
        token = d_item // D_TILES
        rows = (d_item % D_TILES) * D_BN + tl.arange(0, D_BN)
        t = tl.arange(0, D_NT)
        g, um = _units(1, D_PER, TOP_K * D_N_UNITS, D_NU)
        j = g // D_N_UNITS
        blk = g % D_N_UNITS
        if _wait_for(counters + ROUTED, T, counters + GAVE_UP, SPIN_LIMIT, NAP):
            # As the down kernel's read of its routing; .cg: from L2, where the routing item stored it.
            index = tl.load(ids_ptr + token * TOP_K + j, mask=um, other=0, cache_modifier=".cg").to(tl.int32)
            if SLOTS:
                index = tl.load(slot_of + index, mask=um, other=-1).to(tl.int32)
            index = tl.where(um, index, -1)
            word, s0, s1, s2, s3 = down_fetch(wd, stride_d, rows, t, blk, index, D_N_OUT, D_FMT, D_N_UNITS,
                                              D_BLOCK_BYTES, D_UNITS_PER_BLOCK)  # stream while gate/up finishes
            if _wait_for(counters + GATE_UP_DONE, GATE_UP_ITEMS, counters + GAVE_UP, SPIN_LIMIT, NAP):
                down_dots(hid, weights_ptr, y, token, rows, t, j, blk, um, index, word, s0, s1, s2, s3, D_N_OUT, TOP_K,
                          D_K, D_FMT, D_N_UNITS, D_UNIT_W, 1, False)
                if JOIN:
                    _count_done(counters + DOWN_DONE)
    else:  # JOIN: the residual add + the next norm of one token, once every down item is done
        if O:
            pdl_wait(PDL)
        row = (item - O_ITEMS - ROUTE_ITEMS - GATE_UP_ITEMS - DOWN_ITEMS).to(tl.int64)
        if _wait_for(counters + DOWN_DONE, DOWN_ITEMS, counters + GAVE_UP, SPIN_LIMIT, NAP):
            add_rms_norm_row(row, res_ptr, y, nw2_ptr, res2_ptr, out2_ptr, n_cols, eps, BLOCK, 0)
    tl.debug_barrier()
    if tl.atomic_add(counters + FINISHED, 1, sem="acq_rel", scope="gpu") == ITEMS - 1:
        # Every other program is past its last use of the counters: zero them for the next launch.
        tl.store(counters + TICKET, 0)
        tl.store(counters + ROUTED, 0)
        tl.store(counters + GATE_UP_DONE, 0)
        tl.store(counters + FINISHED, 0)
        tl.store(counters + DOWN_DONE, 0)
        tl.store(counters + O_DONE, 0)


_counters: dict[tuple[torch.device, object], torch.Tensor] = {}


def counter_device(device) -> torch.device:
    """The device with its index: a tensor's `cuda:0` and a caller's `cuda` must find the same counters (torch's
    devices compare unequal; the bench made them under one and looked them up under the other, inside a capture)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def site_counters(device: torch.device, site) -> torch.Tensor | None:
    """Call site `site`'s zeroed counters (made on first use: a span's first step runs eagerly, before any capture);
    None while capturing before they exist (the caller runs the unchained kernels)."""
    key = (counter_device(device), site)
    counters = _counters.get(key)
    if counters is None:
        if key[0].type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None  # memory made inside a capture belongs to its graph
        counters = _counters[key] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return counters


def chain_tiles(experts, top_k: int, on_gpu: bool, config: ChainConfig = DEFAULT, o=None):
    """(gate/up, down[, o projection]) GemvConfig of the chained phases (see ChainConfig); None where the chain does
    not apply (an input cut in slices, operands the one-shot kernels cannot read, or ones the unchained path reads
    bytewise). `o`: the o projection's operand (gemv.ExpertOperand at stride 0), a dense matvec phase first."""
    from strata.kernels.moe import gemv

    g, u, d = experts.gate, experts.up, experts.down
    tiles = phase_tiles(g, d, top_k, on_gpu, config, o)
    if tiles is None:
        return None
    ok = (gemv._takes_words(tiles[0], g, u) and gemv._takes_oneshot(tiles[0], g, u) and gemv._takes_words(tiles[1], d)
          and gemv._takes_oneshot(tiles[1], d))
    if o is not None:
        ok = ok and gemv._takes_words(tiles[2], o) and gemv._takes_oneshot(tiles[2], o)
    return tiles if ok else None


def phase_tiles(g, d, top_k: int, on_gpu: bool, config: ChainConfig = DEFAULT, o=None):
    """The tiles of `chain_tiles` from the operands' formats and shapes alone (.spec, .rows, .cols)."""
    phases = [("gate_up", g, config.gate_up_bn, top_k), ("down", d, config.down_bn, top_k)]
    if o is not None:
        phases.append(("matvec", o, config.o_bn, 1))
    tiles = [phase_tile(kind, m, bn, k, on_gpu, config) for kind, m, bn, k in phases]
    return None if None in tiles else tuple(tiles)


def phase_tile(kind: str, m, bn: int, top_k: int, on_gpu: bool, config: ChainConfig = DEFAULT):
    """One phase's GemvConfig ("gate_up", "down" or "matvec" over operand m; `bn` rows, 0: fitted), or None where
    it cannot run in one slice."""
    from dataclasses import replace

    from strata.kernels.moe import gemv
    from strata.kernels.moe.oneshot_gemv import WORDS_PER_THREAD, slice_units
    from strata.kernels.moe.wide_gemv import UNIT, WORDS

    operands = 2 if kind == "gate_up" else 1
    cfg = gemv.gemv_config(kind, m.spec, m.rows, m.cols, top_k, on_gpu)
    if not cfg.wide:
        return None
    if not cfg.oneshot:
        cfg = gemv.oneshot_config(kind, m.spec, m.rows, m.cols, top_k, on_gpu)
    if on_gpu:
        warps = config.warps or GPU_WARPS
        lanes = slice_units(m.cols // UNIT[m.spec.name] * (top_k if kind == "down" else 1), 1)[1]

        def words(rows: int) -> float:  # code words a thread holds (oneshot_gemv.oneshot_tile's measure)
            return operands * lanes * rows * WORDS[m.spec.name] / (32 * warps)

        fitted = cfg.bn
        while fitted > 1 and words(fitted) > WORDS_PER_THREAD:
            fitted //= 2
        if words(bn or fitted) > WORDS_PER_THREAD:
            return None  # the whole input does not fit one program's registers: the unchained slices take it
        cfg = replace(cfg, bn=bn or fitted, warps=warps, split=1)
    elif bn:
        cfg = replace(cfg, bn=bn)
    return cfg if cfg.split == 1 else None


def _prefixed(prefix: str, constants: dict) -> dict:
    keep = ("N_OUT", "K", "FMT", "N_UNITS", "UNIT_W", "NT", "BN", "NU", "PER", "BLOCK_BYTES", "UNITS_PER_BLOCK")
    return {prefix + name: constants[name] for name in keep}


def launch_shape(n_tokens: int, n_cols: int, n_experts: int, k: int, normalize: bool, g, d, slots: bool, tiles,
                 config: ChainConfig = DEFAULT, join: bool = False, o=None) -> tuple[dict, int, int]:
    """(the kernel's constexprs, warps, items) of a launch: T tokens of n_cols, top-k of n_experts, gate operand g
    and down operand d (gemv.ExpertOperand, or anything with .spec, .rows, .cols), `tiles` from `chain_tiles`;
    `join`: the residual add + next norm as a last phase; `o`: the o projection's operand, a first phase."""
    from strata.kernels.moe.oneshot_gemv import _constants

    block = triton.next_power_of_2(n_cols)
    eb = min(triton.next_power_of_2(config.route_experts or CHAIN_ROUTE_EXPERTS),
             triton.next_power_of_2(n_experts))
    programs = triton.cdiv(n_experts, eb)
    gate_c = _constants(g.spec, g.rows, g.cols, 1, slots, tiles[0].bn, 1)
    down_c = _constants(d.spec, d.rows, d.cols, k, slots, tiles[1].bn, 1)
    items = (programs + k * triton.cdiv(g.rows, tiles[0].bn) + triton.cdiv(d.rows, tiles[1].bn) + join) * n_tokens
    warps = config.warps or max(t.warps for t in tiles)  # (the routing phase runs at any count)
    constants = dict(JOIN=join, T=n_tokens, TOP_K=k, SLOTS=slots, BLOCK=block, EB=eb, PROGRAMS=programs,
                     NORMALIZE=normalize, EBLOCK=triton.next_power_of_2(n_experts), KB=triton.next_power_of_2(k),
                     **_prefixed("G_", gate_c), **_prefixed("D_", down_c))
    if o is not None:
        items += triton.cdiv(o.rows, tiles[2].bn)  # one group: every token's row shares the loaded weights
        constants.update(O=True, **_prefixed("O_", _constants(o.spec, o.rows, o.cols, 1, False, tiles[2].bn, 1)))
    return constants, warps, items


def chain_moe_triton(h: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor, router: torch.Tensor,
                     eps: float, k: int, normalize: bool, experts, site, config: ChainConfig = DEFAULT,
                     next_norm: torch.Tensor | None = None, heads: torch.Tensor | None = None, o=None,
                     spin_limit: int = 0, buffers: dict | None = None):
    """h, delta [T, D] (bf16/fp16), norm_weight [D], router [E, D] of that dtype, `experts` (gemv.DecodeExperts)
    -> (h + delta, its norm x, the experts' weighted sum y [T, D] of h's dtype): what `add_norm_route_triton` then
    `moe_gemv_triton` give, in one launch; None where the chain does not apply (the caller runs those two).
    `next_norm` [D]: also the layer's end, `add_rms_norm_triton(h + delta, y, next_norm, eps)`, as a last phase:
    (h + delta, x, y, the new residual, its norm). `heads` [T, n] and `o` (a gemv.ExpertOperand at stride 0 of
    [D, n]): delta is `quant_matvec(heads, o)`, a first phase (delta then None; T <= quant.matvec.MAX_ROWS).
    `site`: the call site (the layer), whose counters this launch owns. `buffers` (tests): the scratch tensors,
    given or filled ("logits", "weights", "ids", "hid", "y", "delta"); `spin_limit`: see `_wait_for`."""
    from strata.kernels.quant.matvec import MAX_ROWS as MATVEC_ROWS
    from strata.kernels.quant.matvec import one_expert

    n_tokens, n_cols = h.shape
    n_experts = router.shape[0]
    if not 1 <= n_tokens <= MAX_ROWS or experts.sparse or not 1 <= k <= n_experts or router.shape[1] != n_cols:
        return None
    if o is not None and not (n_tokens <= MATVEC_ROWS and o.stride == 0 and o.rows == n_cols
                              and heads.shape == (n_tokens, o.cols)):
        return None
    tiles = chain_tiles(experts, k, h.is_cuda, config, o)
    counters = None if tiles is None else site_counters(h.device, site)
    if counters is None:
        return None
    g, u, d = experts.gate, experts.up, experts.down
    rows = h.contiguous()
    residual, out = torch.empty_like(rows), torch.empty_like(rows)
    buffers = {} if buffers is None else buffers
    deltas = delta.contiguous() if o is None else buffers.setdefault("delta", torch.empty_like(rows))
    logits = buffers.setdefault("logits", torch.empty(n_tokens, n_experts, dtype=torch.float32, device=h.device))
    weights = buffers.setdefault("weights", torch.empty(n_tokens, k, dtype=torch.float32, device=h.device))
    ids = buffers.setdefault("ids", torch.empty(n_tokens, k, dtype=torch.int32, device=h.device))
    hid = buffers.setdefault("hid", torch.empty(n_tokens, k, g.rows, dtype=torch.float32, device=h.device))
    y = buffers.setdefault("y", torch.empty(n_tokens, d.rows, dtype=h.dtype, device=h.device))
    join = next_norm is not None
    residual2, out2 = (torch.empty_like(rows), torch.empty_like(rows)) if join else (residual, out)
    slots = experts.slot_of is not None
    constants, warps, items = launch_shape(n_tokens, n_cols, n_experts, k, normalize, g, d, slots, tiles, config,
                                           join, o)
    o_args = (heads.contiguous(), o.raw, one_expert(h.device, n_tokens)[1]) if o is not None else (rows, g.raw, weights)
    _chain_moe_kernel[(items,)](
        rows, deltas, norm_weight.contiguous(), router.contiguous(), residual, out, logits, weights, ids, n_cols,
        n_experts, eps, experts.slot_of if slots else ids, g.raw, u.raw, d.raw, hid, y, g.stride, u.stride, d.stride,
        counters, next_norm.contiguous() if join else norm_weight, residual2, out2, *o_args, **constants,
        SPIN_LIMIT=spin_limit, NAP=config.nap_ns, num_warps=warps, **launch_options(h))
    return (residual, out, y, residual2, out2) if join else (residual, out, y)
