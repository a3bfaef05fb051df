#!/usr/bin/env python3
"""Start-up benchmark of `sifbox run` against its peers, in one run.

Times `/bin/true` on the host, under bubblewrap and under `sifbox run`, all
with the same busybox root filesystem. Runs are interleaved round-robin (one
run of each variant per round, the order rotated every round), so that drift
of the machine (frequency, caches, other load) touches every variant alike.
Prints median and p95 of each and the ratio sifbox/bwrap.

With --baseline BIN, an older sifbox binary runs as a fourth variant in the
same rounds (`sifbox-base`), and the difference of the medians is printed:
the cost of a change, measured without the drift between separate runs.

Usage: scripts/bench.py [--runs N] [--warmup N] [--rootfs DIR] [--sifbox BIN] [--baseline BIN] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from benchlib import default_sifbox, percentile

REPO = Path(__file__).resolve().parent.parent
GOAL_RATIO = 1.2


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Interleaved start-up benchmark: host /bin/true vs bwrap vs sifbox run."
    )
    parser.add_argument("--runs", type=int, default=50, help="timed runs of each variant (default 50; at least 30 for the issue's goal)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    parser.add_argument("--rootfs", type=Path, default=REPO / "target" / "test-rootfs", help="busybox root filesystem (default target/test-rootfs)")
    parser.add_argument("--sifbox", type=Path, default=default_sifbox(), help="sifbox binary (default: the release build, target/<host triple>/release/sifbox)")
    parser.add_argument("--baseline", type=Path, metavar="BIN", help="an older sifbox binary to time in the same rounds (variant sifbox-base)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON to FILE")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    if args.baseline is not None and not (args.baseline.is_file() and os.access(args.baseline, os.X_OK)):
        parser.error(f"--baseline {args.baseline}: not an executable file")
    return args


def fail(message: str) -> NoReturn:
    print(f"bench.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def variants(rootfs: Path, sifbox: Path) -> dict[str, list[str]]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        fail("bwrap not found on PATH: install Debian's bubblewrap (scripts/install-deps.sh)")
    if not os.path.isdir(rootfs):
        fail(f"root filesystem {rootfs} not found: build it with scripts/make-test-rootfs.sh {rootfs}")
    if not os.path.lexists(rootfs / "bin" / "true"):
        fail(f"{rootfs}/bin/true not found: the root filesystem needs busybox's applet links")
    if not (sifbox.is_file() and os.access(sifbox, os.X_OK)):
        fail(f"sifbox binary {sifbox} not found or not executable: build it with cargo build --release -p sifbox")
    root = str(rootfs)
    return {
        "host": ["/bin/true"],
        "bwrap": [bwrap, "--unshare-all", "--ro-bind", root, "/", "--proc", "/proc", "--dev", "/dev", "/bin/true"],
        "sifbox": [str(sifbox), "run", "--rootfs", root, "/bin/true"],
    }


def time_once(name: str, argv: list[str], stderr) -> float:
    """Runs argv once and returns its wall time in ms; fails on a non-zero exit."""
    stderr.seek(0)
    stderr.truncate()
    start = time.perf_counter_ns()
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, check=False)
    elapsed = time.perf_counter_ns() - start
    if proc.returncode != 0:
        stderr.seek(0)
        text = stderr.read().decode(errors="replace").rstrip()
        fail(
            f"variant {name} exited with status {proc.returncode}: {' '.join(argv)}\n"
            f"--- its stderr ---\n{text or '(empty)'}\n------------------"
        )
    return elapsed / 1e6


def main() -> int:
    args = parse_args()
    commands = variants(args.rootfs.resolve(), args.sifbox.resolve())
    if args.baseline is not None:
        commands["sifbox-base"] = [str(args.baseline.resolve()), *commands["sifbox"][1:]]
    names = list(commands)
    samples: dict[str, list[float]] = {name: [] for name in names}

    if args.runs < 30:
        print(f"bench.py: warning: {args.runs} runs each; the issue's goal asks for at least 30", file=sys.stderr)
    print(f"rootfs {args.rootfs.resolve()}, sifbox {args.sifbox.resolve()}")
    print(f"{args.warmup} warm-up rounds, then {args.runs} interleaved rounds of: {', '.join(names)}")

    with tempfile.TemporaryFile() as stderr:
        for round_no in range(args.warmup + args.runs):
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                ms = time_once(name, commands[name], stderr)
                if round_no >= args.warmup:
                    samples[name].append(ms)

    stats = {
        name: {
            "runs": len(values),
            "median_ms": statistics.median(values),
            "p95_ms": percentile(values, 95),
            "mean_ms": statistics.fmean(values),
            "min_ms": min(values),
            "max_ms": max(values),
            "command": commands[name],
            "samples_ms": [round(v, 4) for v in values],
        }
        for name, values in samples.items()
    }
    ratio = {
        "median": stats["sifbox"]["median_ms"] / stats["bwrap"]["median_ms"],
        "p95": stats["sifbox"]["p95_ms"] / stats["bwrap"]["p95_ms"],
    }

    print()
    print(f"{'variant':<14} {'runs':>5} {'median ms':>10} {'p95 ms':>9}")
    for name in names:
        s = stats[name]
        print(f"{name:<14} {s['runs']:>5} {s['median_ms']:>10.2f} {s['p95_ms']:>9.2f}")
    print(f"{'sifbox/bwrap':<14} {'':>5} {ratio['median']:>9.2f}x {ratio['p95']:>8.2f}x")
    verdict = "met" if ratio["median"] <= GOAL_RATIO else "NOT met"
    print(f"goal sifbox <= {GOAL_RATIO}x bwrap (median): {verdict}")
    if "sifbox-base" in stats:
        delta = stats["sifbox"]["median_ms"] - stats["sifbox-base"]["median_ms"]
        ratio["vs_baseline"] = stats["sifbox"]["median_ms"] / stats["sifbox-base"]["median_ms"]
        print(f"sifbox - baseline (median): {delta:+.2f} ms ({ratio['vs_baseline']:.2f}x)")

    if args.json:
        report = {
            "host": {
                "kernel": platform.release(),
                "cpus": os.cpu_count(),
                "uid": os.getuid(),
            },
            "rootfs": str(args.rootfs.resolve()),
            "runs": args.runs,
            "warmup_rounds": args.warmup,
            "variants": stats,
            "ratio_sifbox_bwrap": ratio,
            "goal_ratio": GOAL_RATIO,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
