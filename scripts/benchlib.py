"""Helpers shared by the benchmark scripts in this directory."""


def percentile(samples: list[float], pct: float) -> float:
    """The pct-th percentile, interpolated linearly between closest ranks."""
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * pct / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
