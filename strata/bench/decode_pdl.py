"""`strata bench decode --pdl-sweep 0,1,3,2`: the same decode again with STRATA_PDL at each mode (kernels/pdl.py:
the step's kernels launched with programmatic dependent launch), on the loaded engine: each mode's graphs captured
afresh under `switches.override`, the prompt and the warm steps again, then the timed steps; one row each beside
the first run (tok/s, median step and, all resident, the device time of a step: the figure PDL moves)."""

from __future__ import annotations

from strata import switches
from strata.errors import StrataError
from strata.kernels.pdl import MODES


def pdl_modes(text: str) -> list[int]:
    """--pdl-sweep "0,1,3,2": the modes, checked."""
    modes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not part.isdigit() or int(part) not in MODES:
            raise StrataError(f"--pdl-sweep takes STRATA_PDL modes ({', '.join(map(str, MODES))}), got {part!r}")
        modes.append(int(part))
    return modes


def pdl_sweep(engine, prompt: list[int], n_tokens: int, first, first_step: float | None, modes: list[int],
              timed_steps, device_step) -> None:
    """Rows for `modes` beside `first` (the run above, under the process's STRATA_PDL); `timed_steps(engine, prompt,
    n)` times a run, `device_step(engine, prompt, n)` a step's device time (None: offloaded, not timed)."""
    decoder = engine.decoder
    base = len(first.steps) / sum(first.steps)
    print(f"PDL sweep  (STRATA_PDL mode: tok/s, median step ms{', GPU step ms' if first_step else ''}; the first row "
          "is the run above)")
    rows = [(f"{switches.get('STRATA_PDL')} (above)", first, first_step)]
    for mode in modes:
        with switches.override(STRATA_PDL=mode):
            if decoder is not None:
                decoder.programs.clear()  # capture again: a launch's options are fixed in its graph
            run = timed_steps(engine, prompt, n_tokens)
            step = device_step(engine, prompt, n_tokens) if first_step is not None else None
        rows.append((str(mode), run, step))
    if decoder is not None:
        decoder.programs.clear()  # no graphs of a swept mode left behind
    for name, run, step in rows:
        rate = len(run.steps) / sum(run.steps)
        gpu = f"  {step * 1e3:6.3f}" if step is not None else ""
        print(f"  {name:<10} {rate:8.2f} tok/s ({rate / base:.3f}x)  {run.median * 1e3:6.3f}{gpu}")
