"""`--spec auto`: the verify window speculation gets when the user leaves the choice to the engine.

A window of T rows yields 1 + a1 + a1 a2 + ... tokens (a_j: acceptance at draft position j) for the cost of c_T
decode steps (`strata bench spec` prints both); it pays when the first outgrows the second. What decides it:

- the drafts: an MTP head drafts free text; prompt lookup alone pays only on text that repeats itself (opt-in,
  --suffix-draft), so without an MTP head: 1;
- the window's cost: on CUDA plain decode replays captured graphs, and an eager window loses to them on launch
  overhead alone; so windows must run through graphs too (decode_graphs on, a model with a static step: the trained
  default model's too, since its 32-unit experts take the decode GEMVs; its MTP drafts then capture as well);
- experts offloaded: a window's misses are the union over its rows, so the CPU pool's share grows with T while
  one-row decode's does not; until the --vram-budget rows of tools/device/spec.sh show a window paying: 1.

Where all three hold, AUTO_WINDOW is the window the device numbers found fastest (docs/BENCHMARKS.md). The H200
numbers of session 5 found none: on the trained default model, everything captured, a 2-row window costs 2.78
decode steps (MTP drafts 0.54 ms, the window 0.62 ms, a step 0.46 ms) for 1.61 tokens (--spec 2: 0.68x), and the
A3B shape's random MTP head is never accepted. So AUTO_WINDOW is 1 and the engine's default stays --spec 1; a model
whose MTP step costs a small share of a decode step (many layers) is where to measure again.
"""

from __future__ import annotations

AUTO_WINDOW = 1  # from tools/device/spec.sh's tables (H200, session 5): no --spec > 1 paid


def auto_spec(has_mtp: bool, captured_windows: bool, all_resident: bool, best: int | None = None) -> int:
    """The --spec that `auto` picks: `best` (AUTO_WINDOW, read now) where speculation can pay (see above), else 1."""
    best = AUTO_WINDOW if best is None else best
    return best if has_mtp and captured_windows and all_resident else 1
