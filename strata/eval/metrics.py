"""Compare two runs' logpos records position by position: the quality table of reference/seeds/.

Only positions present in both runs with the same target count. KL(A||B) is taken over A's listed top-K plus one
bucket for the rest of the vocabulary: an id A lists but B does not gets min(B's smallest listed probability,
B's unlisted mass shared evenly among the missing ids plus the rest).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from strata.eval.logpos import Record

DECISIVE_GAP = 0.5  # nats between A's first and second choice for an argmax to count as decisive
REST_FLOOR = 1e-12


def kl_topk(a: Record, b: Record) -> float:
    """KL(A||B) over A's listed ids plus the rest bucket, in nats."""
    listed_b = dict(b.top)
    if not a.top:
        return 0.0
    q_listed = sum(math.exp(lp) for lp in listed_b.values())
    missing = [i for i, _ in a.top if i not in listed_b]
    q_unlisted = max(0.0, 1.0 - q_listed)
    q_floor = math.exp(min(listed_b.values())) if listed_b else q_unlisted
    q_missing = min(q_floor, q_unlisted / (len(missing) + 1))
    kl, p_sum, q_sum = 0.0, 0.0, 0.0
    for i, lp_a in a.top:
        p = math.exp(lp_a)
        log_q = listed_b[i] if i in listed_b else math.log(max(q_missing, REST_FLOOR))
        if p > 0:
            kl += p * (lp_a - log_q)
        p_sum += p
        q_sum += math.exp(log_q)
    p_rest = max(0.0, 1.0 - p_sum)
    q_rest = max(REST_FLOOR, 1.0 - q_sum)
    if p_rest > 0:
        kl += p_rest * math.log(p_rest / q_rest)
    return kl


@dataclass
class Comparison:
    positions: int
    argmax_agreement: float
    kl: float  # mean KL(A||B) per position
    perplexity_a: float
    perplexity_b: float
    decisive_agree: int  # positions where A's top-2 gap >= DECISIVE_GAP and B's argmax is A's
    decisive_total: int
    first_token_kl: float | None  # at the first common position (the prompt path's last logits)
    delta_nll: float  # mean of NLL_B - NLL_A per position (positive: B is worse)
    delta_nll_se: float
    greedy_match: bool | None = None  # whether the first greedy tokens after the prefix are equal

    def as_dict(self) -> dict:
        return asdict(self)


def compare(a: dict[int, Record], b: dict[int, Record]) -> Comparison:
    common = sorted(pos for pos in a if pos in b and a[pos].target == b[pos].target)
    if not common:
        raise ValueError("the two runs share no position with the same target")
    n = len(common)
    agree = decisive_agree = decisive_total = 0
    kl_sum, nll_a, nll_b, deltas = 0.0, 0.0, 0.0, []
    for pos in common:
        ra, rb = a[pos], b[pos]
        agree += ra.top1 == rb.top1
        if len(ra.top) >= 2 and ra.top[0][1] - ra.top[1][1] >= DECISIVE_GAP:
            decisive_total += 1
            decisive_agree += ra.top1 == rb.top1
        kl_sum += kl_topk(ra, rb)
        nll_a -= ra.lp_target
        nll_b -= rb.lp_target
        deltas.append(ra.lp_target - rb.lp_target)
    mean_delta = sum(deltas) / n
    var = sum((d - mean_delta) ** 2 for d in deltas) / (n - 1) if n > 1 else 0.0
    return Comparison(
        positions=n,
        argmax_agreement=agree / n,
        kl=kl_sum / n,
        perplexity_a=math.exp(nll_a / n),
        perplexity_b=math.exp(nll_b / n),
        decisive_agree=decisive_agree,
        decisive_total=decisive_total,
        first_token_kl=kl_topk(a[common[0]], b[common[0]]),
        delta_nll=mean_delta,
        delta_nll_se=math.sqrt(var / n),
    )


def _small(x: float) -> str:
    return f"{x:.4f}" if x == 0 or abs(x) >= 1e-4 else f"{x:.1e}"


def table(rows: list[tuple[str, Comparison]]) -> str:
    """The seeds' markdown table, one row per comparison (A vs B, then the A vs A noise floor)."""
    lines = [
        "| runs | positions | argmax agreement | KL (A ‖ B) | perplexity A / B | argmax where A's top-2 gap ≥ 0.5 "
        "| first-token KL | 32 greedy tokens equal | ΔNLL (B − A) ± SE |",
        "|---|---:|---:|---:|---|---:|---:|---|---:|",
    ]
    for name, c in rows:
        greedy = "-" if c.greedy_match is None else ("yes" if c.greedy_match else "no")
        first = "-" if c.first_token_kl is None else _small(c.first_token_kl)
        lines.append(
            f"| {name} | {c.positions} | {100 * c.argmax_agreement:.1f} % | {_small(c.kl)} | "
            f"{c.perplexity_a:.3f} / {c.perplexity_b:.3f} | {c.decisive_agree} / {c.decisive_total} | {first} | "
            f"{greedy} | {c.delta_nll:+.2e} ± {c.delta_nll_se:.2e} |"
        )
    return "\n".join(lines)
