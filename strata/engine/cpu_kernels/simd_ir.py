"""LLVM IR text of the SIMD row kernels: one function per GGUF format and activation width,
`strata_rows_<fmt>_<i8|i16>`, that computes y[r] = sum_j w_rj * x_j over `n_rows` consecutive weight rows in their
GGUF block bytes.

Activations come as int8 or int16 codes q with one float32 step per group of G inputs (see `simd_pool`): the kernel
forms each weight block's signed int8 codes, takes exact int32 dot products of 32 codes with 32 activation codes (8
lanes), and scales them into 8 float32 lane accumulators, reduced once per row (as ggml's vec_dot kernels do; no
horizontal sum per block). The 32-code dot is the one ISA-dependent piece:

- "vnni": int8: |w| times sign(w) * x by one vpdpbusd (AVX512-VNNI with VL); int16: as avx2.
- "avx2": int8: the same two operands through vpmaddubsw then vpmaddwd(1) (pairs under 2 * 128 * 127 < 2^15, so
  exact); int16: vpmaddwd.
- "generic": sign-extend, multiply and add in int32 (any LLVM target; what the x86 forms must equal bit for bit).

Signature of every function (all i64: pointers as integers, so numba passes `arr.ctypes.data` unchanged):
    (w, row_bytes, n_rows, x_codes, n_groups, fp16_table, x_steps, x_sums, y)
x_sums (int32 per group, sum of its codes) serves the formats whose weights carry a min term (Q4_K).
"""

from __future__ import annotations

# format name: (weights per block, bytes per block, activation group G, interleave as in `activations`)
LAYOUT = {"Q8_0": (32, 34, 32, 1), "Q4_0": (32, 18, 32, 1), "Q2_0": (64, 18, 64, 4), "Q4_K": (256, 144, 32, 1),
          "Q6_K": (256, 210, 32, 1)}

ACTS = ("i8", "i16")  # activation codes: int8 (llama.cpp's q8 blocks) or int16 (`activations`, ~256x finer)

_DECLARE = {
    "vnni": "declare <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32>, <32 x i8>, <32 x i8>)\n"
            "declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)\n"
            "declare <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8>, <32 x i8>)\n",
    "avx2": "declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)\n"
            "declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)\n"
            "declare <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8>, <32 x i8>)\n",
    "generic": "",
}
_COMMON = ("declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)\n"
           "declare float @llvm.vector.reduce.fadd.v8f32(float, <8 x float>)\n"
           "declare <32 x i8> @llvm.abs.v32i8(<32 x i8>, i1)\n")


def _splat(kind: str, v: int, n: int) -> str:
    return "<" + ", ".join([f"{kind} {v}"] * n) + ">"


def _seq(start: int, stop: int, step: int = 1) -> str:
    return ", ".join(f"i32 {i}" for i in range(start, stop, step))


class _Body:
    """Straight-line IR of one loop iteration; `fresh` names every value uniquely."""

    def __init__(self, isa: str, act: str):
        self.isa, self.act, self.lines, self.n = isa, act, [], 0

    def take(self) -> list[str]:
        """The lines emitted since the last call (names stay unique across calls)."""
        lines, self.lines = self.lines, []
        return lines

    def fresh(self, hint: str) -> str:
        self.n += 1
        return f"%{hint}{self.n}"

    def emit(self, hint: str, text: str) -> str:
        name = self.fresh(hint)
        self.lines.append(f"  {name} = {text}")
        return name

    def ptr(self, base: str, offset: str) -> str:
        return self.emit("p", f"getelementptr i8, ptr {base}, i64 {offset}")

    def add(self, a: str, b) -> str:
        return self.emit("o", f"add i64 {a}, {b}")

    def f16(self, at: str) -> str:
        bits = self.emit("h", f"load i16, ptr {at}, align 1")
        index = self.emit("hi", f"zext i16 {bits} to i64")
        return self.emit("hf", f"load float, ptr {self.emit('hp', f'getelementptr float, ptr %tab, i64 {index}')}, align 4")

    def step(self, group: str) -> str:
        return self.emit("st", f"load float, ptr {self.emit('sp', f'getelementptr float, ptr %xs, i64 {group}')}, align 4")

    def x32(self, group: str, half: int = 0, group_size: int = 32) -> str:
        """32 activation codes of group `group` (from its `half`-th 32 when the group is 64)."""
        width = 1 if self.act == "i8" else 2
        off = self.emit("xo", f"mul i64 {group}, {group_size * width}")
        if half:
            off = self.add(off, 32 * half * width)
        return self.emit("xv", f"load <32 x {self.act}>, ptr {self.ptr('%xp', off)}, align 1")

    def bytes(self, at: str, n: int) -> str:
        return self.emit("c", f"load <{n} x i8>, ptr {at}, align 1")

    def splat8(self, v: int, n: int = 32) -> str:
        """An n x i8 constant, spelled out (older LLVM parsers lack the `splat` shorthand)."""
        return _splat("i8", v, n)

    def concat16(self, a: str, b: str) -> str:
        return self.emit("w", f"shufflevector <16 x i8> {a}, <16 x i8> {b}, <32 x i32> <{_seq(0, 32)}>")

    def dot(self, w: str, x: str, lanes_by_16: bool = False) -> str:
        """<8 x i32> whose lanes sum to w . x (w signed int8 <32 x i8>, w > -128 where x is int8; x int8 or int16).
        `lanes_by_16`: lanes 0-3 take exactly the first 16 products, 4-7 the last 16 (Q6_K's scales)."""
        if self.act == "i16":
            return self._dot16(w, x, lanes_by_16)
        if self.isa == "generic":
            w32 = self.emit("we", f"sext <32 x i8> {w} to <32 x i32>")
            x32 = self.emit("xe", f"sext <32 x i8> {x} to <32 x i32>")
            prod = self.emit("pr", f"mul <32 x i32> {w32}, {x32}")
            parts = [self.emit("pp", f"shufflevector <32 x i32> {prod}, <32 x i32> poison, <8 x i32> <{_seq(i, 32, 4)}>")
                     for i in range(4)]
            s = self.emit("ps", f"add <8 x i32> {parts[0]}, {parts[1]}")
            t = self.emit("ps", f"add <8 x i32> {parts[2]}, {parts[3]}")
            return self.emit("ps", f"add <8 x i32> {s}, {t}")
        magnitude = self.emit("wa", f"call <32 x i8> @llvm.abs.v32i8(<32 x i8> {w}, i1 false)")
        signed_x = self.emit("xs", f"call <32 x i8> @llvm.x86.avx2.psign.b(<32 x i8> {x}, <32 x i8> {w})")
        if self.isa == "vnni":
            return self.emit("ps", "call <8 x i32> @llvm.x86.avx512.vpdpbusd.256(<8 x i32> zeroinitializer, "
                                   f"<32 x i8> {magnitude}, <32 x i8> {signed_x})")
        pairs = self.emit("pw", f"call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> {magnitude}, <32 x i8> {signed_x})")
        return self.emit("ps", f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {pairs}, <16 x i16> {_splat('i16', 1, 16)})")

    def _dot16(self, w: str, x: str, lanes_by_16: bool) -> str:
        """int16 activations: products of sign-extended weights, summed in pairs (vpmaddwd, or generic)."""
        w16 = self.emit("we", f"sext <32 x i8> {w} to <32 x i16>")
        halves = []
        for h in range(2):
            wh = self.emit("wh", f"shufflevector <32 x i16> {w16}, <32 x i16> poison, <16 x i32> <{_seq(16 * h, 16 * h + 16)}>")
            xh = self.emit("xh", f"shufflevector <32 x i16> {x}, <32 x i16> poison, <16 x i32> <{_seq(16 * h, 16 * h + 16)}>")
            if self.isa in ("vnni", "avx2"):  # vpdpwssd measured 3-7 % slower than this on Zen 4
                halves.append(self.emit("ph", f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {wh}, <16 x i16> {xh})"))
            else:
                prod = self.emit("pr", f"mul <16 x i32> {self.emit('we', f'sext <16 x i16> {wh} to <16 x i32>')}, "
                                       f"{self.emit('xe', f'sext <16 x i16> {xh} to <16 x i32>')}")
                even = self.emit("pe", f"shufflevector <16 x i32> {prod}, <16 x i32> poison, <8 x i32> <{_seq(0, 16, 2)}>")
                odd = self.emit("po", f"shufflevector <16 x i32> {prod}, <16 x i32> poison, <8 x i32> <{_seq(1, 16, 2)}>")
                halves.append(self.emit("ph", f"add <8 x i32> {even}, {odd}"))
        if not lanes_by_16:
            return self.emit("ps", f"add <8 x i32> {halves[0]}, {halves[1]}")
        even = self.emit("pe", f"shufflevector <8 x i32> {halves[0]}, <8 x i32> {halves[1]}, <8 x i32> <{_seq(0, 16, 2)}>")
        odd = self.emit("po", f"shufflevector <8 x i32> {halves[0]}, <8 x i32> {halves[1]}, <8 x i32> <{_seq(1, 16, 2)}>")
        return self.emit("ps", f"add <8 x i32> {even}, {odd}")

    def splat_f(self, v: str) -> str:
        one = self.emit("si", f"insertelement <8 x float> poison, float {v}, i64 0")
        return self.emit("sv", f"shufflevector <8 x float> {one}, <8 x float> poison, <8 x i32> zeroinitializer")

    def fma(self, isum: str, scale_vec: str, acc: str) -> str:
        f = self.emit("sf", f"sitofp <8 x i32> {isum} to <8 x float>")
        return self.emit("acc", f"call <8 x float> @llvm.fma.v8f32(<8 x float> {f}, <8 x float> {scale_vec}, <8 x float> {acc})")

    def fmul(self, a: str, b: str) -> str:
        return self.emit("m", f"fmul float {a}, {b}")


def _q8_0(body: _Body, bp: str, it: str, acc: str, corr: str):
    w = body.bytes(body.ptr(bp, "2"), 32)
    s = body.dot(w, body.x32(it))
    return body.fma(s, body.splat_f(body.fmul(body.f16(bp), body.step(it))), acc), corr


def _q4_0(body: _Body, bp: str, it: str, acc: str, corr: str):
    c = body.bytes(body.ptr(bp, "2"), 16)
    lo = body.emit("lo", f"and <16 x i8> {c}, {body.splat8(15, 16)}")
    hi = body.emit("hi", f"lshr <16 x i8> {c}, {body.splat8(4, 16)}")
    w = body.emit("ws", f"sub <32 x i8> {body.concat16(lo, hi)}, {body.splat8(8)}")
    s = body.dot(w, body.x32(it))
    return body.fma(s, body.splat_f(body.fmul(body.f16(bp), body.step(it))), acc), corr


def _q2_0(body: _Body, bp: str, it: str, acc: str, corr: str):
    """Byte i carries weights 4i..4i+3 at bits 0, 2, 4, 6; the activations are interleaved to match (group of 64:
    position p * 16 + i holds input 4i + p), so the codes of shift p fill positions p * 16 .. p * 16 + 15."""
    c = body.bytes(body.ptr(bp, "2"), 16)
    parts = [body.emit("q", f"and <16 x i8> {body.emit('qs', f'lshr <16 x i8> {c}, {body.splat8(2 * p, 16)}')}, "
                            f"{body.splat8(3, 16)}") for p in range(4)]
    w0 = body.emit("ws", f"sub <32 x i8> {body.concat16(parts[0], parts[1])}, {body.splat8(1)}")
    w1 = body.emit("ws", f"sub <32 x i8> {body.concat16(parts[2], parts[3])}, {body.splat8(1)}")
    s0 = body.dot(w0, body.x32(it, 0, 64))
    s1 = body.dot(w1, body.x32(it, 1, 64))
    s = body.emit("s", f"add <8 x i32> {s0}, {s1}")
    return body.fma(s, body.splat_f(body.fmul(body.f16(bp), body.step(it))), acc), corr


def _byte(body: _Body, base: str, k: int) -> str:
    return body.emit("b", f"zext i8 {body.emit('bl', f'load i8, ptr {body.ptr(base, str(k))}, align 1')} to i32")


def _q4_k_scale_min(body: _Body, sp: str, j: int) -> tuple[str, str]:
    """Sub-block j's 6-bit scale and min from the 12 packed bytes, as float."""
    if j < 4:
        sc = body.emit("k", f"and i32 {_byte(body, sp, j)}, 63")
        m = body.emit("k", f"and i32 {_byte(body, sp, j + 4)}, 63")
    else:
        b_lo, b_sc, b_m = _byte(body, sp, j + 4), _byte(body, sp, j - 4), _byte(body, sp, j)
        sc_top = body.emit("k", f"shl i32 {body.emit('k', f'lshr i32 {b_sc}, 6')}, 4")
        m_top = body.emit("k", f"shl i32 {body.emit('k', f'lshr i32 {b_m}, 6')}, 4")
        sc = body.emit("k", f"or i32 {body.emit('k', f'and i32 {b_lo}, 15')}, {sc_top}")
        m = body.emit("k", f"or i32 {body.emit('k', f'lshr i32 {b_lo}, 4')}, {m_top}")
    return body.emit("kf", f"uitofp i32 {sc} to float"), body.emit("kf", f"uitofp i32 {m} to float")


def _tree_sum(body: _Body, terms: list[str]) -> str:
    while len(terms) > 1:  # pairwise, so the adds do not wait on each other
        terms = [body.emit("ts", f"fadd float {terms[i]}, {terms[i + 1]}") if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def _q4_k(body: _Body, bp: str, it: str, acc: str, corr: str):
    """w = d * sc_j * c - dmin * m_j for sub-block j; the min term meets the activation group's code sum."""
    d, dmin = body.f16(bp), body.f16(body.ptr(bp, "2"))
    sp = body.ptr(bp, "4")
    g0 = body.emit("g", f"mul i64 {it}, 8")
    mins = []
    for pair in range(4):
        c = body.bytes(body.ptr(bp, str(16 + 32 * pair)), 32)
        halves = (body.emit("lo", f"and <32 x i8> {c}, {body.splat8(15)}"),
                  body.emit("hi", f"lshr <32 x i8> {c}, {body.splat8(4)}"))
        for half, w in enumerate(halves):
            j = 2 * pair + half
            g = body.add(g0, j)
            sc, m = _q4_k_scale_min(body, sp, j)
            st = body.step(g)
            s = body.dot(w, body.x32(g))
            acc = body.fma(s, body.splat_f(body.fmul(body.fmul(d, sc), st)), acc)
            xsum = body.emit("xq", f"load i32, ptr {body.emit('xqp', f'getelementptr i32, ptr %xq, i64 {g}')}, align 4")
            mins.append(body.fmul(body.fmul(m, st), body.emit("xf", f"sitofp i32 {xsum} to float")))
    corr = body.emit("cr", f"call float @llvm.fma.f32(float {dmin}, float {_tree_sum(body, mins)}, float {corr})")
    return acc, corr


def _q6_k(body: _Body, bp: str, it: str, acc: str, corr: str):
    """Weight h*128 + p*32 + i: nibble p // 2 of byte h*64 + (p % 2)*32 + i, bits 2p, 2p+1 of byte 128 + h*32 + i;
    w = d * sc * (c - 32), one int8 scale per 16 weights (lanes 0-3 of the 32-dot take the first, 4-7 the second)."""
    d = body.f16(body.ptr(bp, "208"))
    g0 = body.emit("g", f"mul i64 {it}, 8")
    for h in range(2):
        high = body.bytes(body.ptr(bp, str(128 + 32 * h)), 32)
        for p in range(4):
            low = body.bytes(body.ptr(bp, str(h * 64 + (p % 2) * 32)), 32)
            nib = (body.emit("lo", f"and <32 x i8> {low}, {body.splat8(15)}") if p < 2 else
                   body.emit("lo", f"lshr <32 x i8> {low}, {body.splat8(4)}"))
            top = body.emit("tp", f"and <32 x i8> {body.emit('ts', f'lshr <32 x i8> {high}, {body.splat8(2 * p)}')}, "
                                  f"{body.splat8(3)}")
            c = body.emit("c6", f"or <32 x i8> {nib}, {body.emit('t4', f'shl <32 x i8> {top}, {body.splat8(4)}')}")
            w = body.emit("ws", f"sub <32 x i8> {c}, {body.splat8(32)}")
            g = body.add(g0, h * 4 + p)
            s = body.dot(w, body.x32(g), lanes_by_16=True)
            ds = body.fmul(d, body.step(g))
            scales = []
            for k in range(2):
                raw = body.emit("sc", f"load i8, ptr {body.ptr(bp, str(192 + h * 8 + p * 2 + k))}, align 1")
                scales.append(body.fmul(ds, body.emit("scf", f"sitofp i8 {raw} to float")))
            v = body.emit("vs", f"insertelement <8 x float> poison, float {scales[0]}, i64 0")
            v = body.emit("vs", f"insertelement <8 x float> {v}, float {scales[1]}, i64 1")
            v = body.emit("vs", f"shufflevector <8 x float> {v}, <8 x float> poison, <8 x i32> <{', '.join(['i32 0'] * 4 + ['i32 1'] * 4)}>")
            acc = body.fma(s, v, acc)
    return acc, corr


_BODY = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q2_0": _q2_0, "Q4_K": _q4_k, "Q6_K": _q6_k}


def rows_function(fmt: str, isa: str, act: str) -> str:
    """The IR of `strata_rows_<fmt>`: a loop over rows; in each, a loop over pairs of blocks (super-blocks for the K
    formats) into two accumulators, so that consecutive blocks' fmas do not wait on each other, and an odd last block."""
    per_block, block_bytes, group, _ = LAYOUT[fmt]
    body = _Body(isa, act)

    def block(index: str, acc: str, corr: str) -> tuple[str, str]:
        bp = body.ptr("%rowp", body.emit("bo", f"mul i64 {index}, {block_bytes}"))
        return _BODY[fmt](body, bp, index, acc, corr)

    b0 = body.emit("b", "mul i64 %it, 2")
    acc0, corr = block(b0, "%acc0", "%corr")
    acc1, corr = block(body.add(b0, 1), "%acc1", corr)
    pair_lines = body.take()
    tail0, tail_corr = block("%last", "%a0", "%c")
    tail_lines = body.take()
    lines = chr(10).join
    return f"""
define void @{function_name(fmt, act)}(i64 %w, i64 %rb, i64 %nr, i64 %x, i64 %ng, i64 %tabi, i64 %xsi, i64 %xqi, i64 %y) {{
entry:
  %wp = inttoptr i64 %w to ptr
  %xp = inttoptr i64 %x to ptr
  %tab = inttoptr i64 %tabi to ptr
  %xs = inttoptr i64 %xsi to ptr
  %xq = inttoptr i64 %xqi to ptr
  %yp = inttoptr i64 %y to ptr
  %nblk = udiv i64 %ng, {per_block // group}
  %npair = lshr i64 %nblk, 1
  %haspair = icmp ugt i64 %npair, 0
  %odd = trunc i64 %nblk to i1
  %last = sub i64 %nblk, 1
  %any = icmp ugt i64 %nr, 0
  br i1 %any, label %row, label %exit
row:
  %r = phi i64 [0, %entry], [%r1, %fin]
  %roff = mul i64 %r, %rb
  %rowp = getelementptr i8, ptr %wp, i64 %roff
  br i1 %haspair, label %blk, label %after
blk:
  %it = phi i64 [0, %row], [%it1, %blk]
  %acc0 = phi <8 x float> [zeroinitializer, %row], [{acc0}, %blk]
  %acc1 = phi <8 x float> [zeroinitializer, %row], [{acc1}, %blk]
  %corr = phi float [0.0, %row], [{corr}, %blk]
{lines(pair_lines)}
  %it1 = add i64 %it, 1
  %done = icmp eq i64 %it1, %npair
  br i1 %done, label %after, label %blk
after:
  %a0 = phi <8 x float> [zeroinitializer, %row], [{acc0}, %blk]
  %a1 = phi <8 x float> [zeroinitializer, %row], [{acc1}, %blk]
  %c = phi float [0.0, %row], [{corr}, %blk]
  br i1 %odd, label %tail, label %fin
tail:
{lines(tail_lines)}
  br label %fin
fin:
  %f0 = phi <8 x float> [%a0, %after], [{tail0}, %tail]
  %fc = phi float [%c, %after], [{tail_corr}, %tail]
  %accs = fadd <8 x float> %f0, %a1
  %sum = call reassoc float @llvm.vector.reduce.fadd.v8f32(float 0.0, <8 x float> %accs)
  %res = fsub float %sum, %fc
  %ypr = getelementptr float, ptr %yp, i64 %r
  store float %res, ptr %ypr, align 4
  %r1 = add i64 %r, 1
  %rdone = icmp eq i64 %r1, %nr
  br i1 %rdone, label %exit, label %row
exit:
  ret void
}}
"""


def function_name(fmt: str, act: str) -> str:
    return f"strata_rows_{fmt.lower()}_{act}"


def module(isa: str) -> str:
    """Every format's function for one ISA variant and both activation widths, with their declarations."""
    head = _COMMON + _DECLARE[isa] + "declare float @llvm.fma.f32(float, float, float)\n"
    return head + "".join(rows_function(fmt, isa, act) for fmt in LAYOUT for act in ACTS)
