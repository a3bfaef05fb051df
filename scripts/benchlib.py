"""Helpers shared by the benchmark scripts in this directory."""

import os
import platform
import subprocess
from pathlib import Path


def percentile(samples: list[float], pct: float) -> float:
    """The pct-th percentile, interpolated linearly between closest ranks."""
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * pct / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def default_sifbox() -> Path:
    """The release build of sifbox: .cargo/config.toml names the host's own
    triple as cargo's target, so it lies in target/<triple>/release."""
    repo = Path(__file__).resolve().parent.parent
    target = Path(os.environ.get("CARGO_TARGET_DIR") or repo / "target")
    try:
        out = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
        host = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("host:"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        host = f"{platform.machine()}-unknown-linux-gnu"
    return target / host / "release" / "sifbox"
