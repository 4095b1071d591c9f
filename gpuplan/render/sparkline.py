"""A one-line picture of a series in Unicode block characters, for `gpuplan show`.

Eight levels, U+2581..U+2588 (the spark tool's characters); a long series is averaged
into `width` buckets so the line fits a terminal.
"""

from __future__ import annotations

from collections.abc import Sequence

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 60) -> str:
    vals = [float(v) for v in values if v is not None and v == v]  # drop None and NaN
    if not vals:
        return ""
    if len(vals) > width:  # average into width buckets, each a contiguous run of points
        n = len(vals)
        vals = [sum(vals[i * n // width : (i + 1) * n // width]) / len(vals[i * n // width : (i + 1) * n // width]) for i in range(width)]
    lo, hi = min(vals), max(vals)
    if hi == lo:
        return BLOCKS[3] * len(vals)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round((v - lo) / (hi - lo) * top)] for v in vals)
