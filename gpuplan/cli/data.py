"""`gpuplan data SPEC`: show the first examples as the model sees them, trained parts marked, and statistics."""

from __future__ import annotations

import json
import sys
from typing import Any

from gpuplan.cli.common import UserError, make_plan, style_for
from gpuplan.render.style import Style

# Without colour, trained text is wrapped in these markers (the legend says so).
OPEN, CLOSE = "[[", "]]"


def cmd_data(args) -> int:
    if args.examples < 0:
        raise UserError(f"--examples {args.examples}: give 0 or more")
    plan = make_plan(args.spec, args)
    from gpuplan.apply.data.preview import preview
    from gpuplan.render.notices import log_to

    log_to(plan.resolved.output.dir, load_libraries=True)

    if not sys.stderr.isatty():  # a log or a pipe: no carriage-return bars (as apply)
        from gpuplan.apply.quiet import disable_progress_bars

        disable_progress_bars()
    shown = preview(plan, args.examples)  # an ApplyError is a GpuplanError: exit 1 with its key and fix
    if args.json:
        sys.stdout.write(json.dumps(shown, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(render_data(shown, plan.resolved.data.format, style_for(args, sys.stdout)))
    return 0


def render_data(shown: dict[str, Any], fmt: str, style: Style) -> str:
    """Text drawn from the JSON form: the examples, then the statistics."""
    lines = []
    legend = (style("trained", "green", "bold") + " / " + style("masked", "dim")) if style.enabled else f"{OPEN}trained{CLOSE} / masked"
    lines.append(f"{len(shown['examples'])} example(s) of {fmt} data as the model sees them ({legend}):")
    for i, ex in enumerate(shown["examples"], 1):
        trained = sum(1 for _ in ex["segments"] if _["trained"])
        note = ", truncated" if ex["truncated"] else ""
        lines.append("")
        kind = f" (row {ex['row']}, {ex['kind']})" if ex.get("kind") else ""  # dpo: chosen / rejected
        lines.append(style(f"--- example {i}{kind}: {ex['tokens']} tokens{note}, {trained} trained part(s) ---", "cyan"))
        parts = []
        for seg in ex["segments"]:
            if style.enabled:
                parts.append(style(seg["text"], "green", "bold") if seg["trained"] else style(seg["text"], "dim"))
            else:
                parts.append(f"{OPEN}{seg['text']}{CLOSE}" if seg["trained"] else seg["text"])
        lines.append("".join(parts).rstrip("\n"))
    s = shown["stats"]
    lines.append("")
    lines.append("Statistics:")
    eff = s.get("packing_efficiency")
    rows = [
        ("rows", f"{s['rows']:,} (all of data.train_files, before any eval split)"),
        (
            "examples kept",
            f"{s['examples']:,}" + (f" ({s['dropped_rows']:,} with nothing to train within seq_len dropped)" if s["dropped_rows"] else ""),
        ),
        ("truncated rows", f"{s['truncated_rows']:,} (longer than seq_len {s['seq_len']})"),
        ("tokens", f"{s['tokens']:,}"),
        ("trained tokens", f"{s['trained_tokens']:,}" + (f" ({s['trained_tokens'] / s['tokens']:.0%})" if s["tokens"] else "")),
        ("sequences", f"{s['sequences']:,} of {s['seq_len']} tokens" + (", packed" if s["packing"] else ", padded")),
        ("packing efficiency", "n/a" if eff is None else f"{eff:.1%} of token slots hold data"),
    ]
    if s.get("images"):  # chat rows with images (apply/data/vision.py): their tokens are in "tokens"
        rows.append(("images", f"{s['images']:,} (their tokens are masked inputs, never trained)"))
    if s.get("dropped_tail_tokens"):
        rows.append(("dropped tail", f"{s['dropped_tail_tokens']:,} tokens after the last full block"))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    return "\n".join(lines) + "\n"
