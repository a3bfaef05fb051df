#!/usr/bin/env python3
"""The eval benchmark of issue 7: ROLLOUTS rollouts of a trivial task (the
oracle runs `true`, the verifier writes reward 1) with --jobs JOBS; reports
the per-rollout overhead of sifbox (the rollout's wall time minus the time
spent in the agent's and the verifier's commands, as each result.json
records it: a command's time is its exec as the client sees it, start to
exit, so bash's start-up and the exec round trip count as the command's)
and the throughput (rollouts per second of the job's wall time). The
task's image is built (and cached) by a warm-up job first.

With --layers tmpfs,disk (as root) the rollouts are split between the
writable-layer kinds, in alternating jobs, and each kind's figures and the
difference of their medians are reported too.

With --examples DIR (a suite such as examples/tasks) it runs the suite with
--attempts 3 from a cold store (only the Debian base imported, no build
cached) with --jobs 1 and then with --jobs 2, and reports both wall times,
their ratio and the longest single build (goal: the --jobs 2 wall at most
0.7 times the --jobs 1 wall, unless one build alone takes longer)."""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import percentile  # noqa: E402

TASK_TOML = """version = "1.0"
[environment]
network_mode = "no-network"
[agent]
timeout_sec = 60
[verifier]
timeout_sec = 60
"""


def write(path: pathlib.Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def make_task(root: pathlib.Path) -> pathlib.Path:
    task = root / "trivial"
    write(task / "task.toml", TASK_TOML)
    write(task / "instruction.md", "Do nothing.\n")
    write(task / "environment" / "Dockerfile", "FROM debian:bookworm\n")
    write(task / "solution" / "solve.sh", "#!/bin/bash\ntrue\n", 0o755)
    write(task / "tests" / "test.sh",
          "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n", 0o755)
    return task


def run_job(sifbox: str, task: pathlib.Path, out: pathlib.Path, job: str,
            attempts: int, jobs: int, layer: str | None = None) -> float:
    cmd = [sifbox, "eval", str(task), "--attempts", str(attempts),
           "--jobs", str(jobs), "--out", str(out), "--job", job,
           "--progress", "quiet"]
    if layer:
        cmd += ["--layer", layer]
    started = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"bench-eval: {' '.join(cmd)} failed ({done.returncode}):\n"
                 f"{done.stdout}{done.stderr}")
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sifbox", required=True)
    p.add_argument("--work", required=True, help="a scratch dir")
    p.add_argument("--rollouts", type=int, default=100)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--layers", help="writable-layer kinds to compare "
                   "(e.g. tmpfs,disk), in alternating jobs")
    p.add_argument("--examples", help="a task suite to run from a cold "
                   "store with --jobs 1 and --jobs 2")
    p.add_argument("--base-tar", help="the Debian base tarball for "
                   "--examples (default: target/bookworm-minbase.tar)")
    a = p.parse_args()
    if a.layers:
        compare_layers(a)
        return
    if a.examples:
        compare_jobs(a)
        return

    work = pathlib.Path(a.work)
    # The store bench-eval.sh bootstrapped debian:bookworm into.
    os.environ.setdefault("SIFBOX_CACHE", str(work / "cache"))
    task = make_task(work / "tasks")
    out = work / "jobs"
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    run_job(a.sifbox, task, out, f"warm-{stamp}", 1, 1)
    wall = run_job(a.sifbox, task, out, f"bench-{stamp}", a.rollouts, a.jobs)

    results = [json.loads(f.read_text())
               for f in (out / f"bench-{stamp}").glob("*/result.json")]
    if len(results) != a.rollouts:
        sys.exit(f"bench-eval: {len(results)} results, expected {a.rollouts}")
    bad = [r["rollout"] for r in results
           if r["status"] != "ok" or r["reward"] != 1.0]
    if bad:
        sys.exit(f"bench-eval: rollouts without reward 1: {bad}")
    t = [r["timings_ms"] for r in results]
    # sifbox's own time: the whole, less the commands and the image wait.
    overhead = [r["overhead_ms"] for r in results]
    figures = {
        "rollouts": a.rollouts,
        "jobs": a.jobs,
        "wall_s": round(wall, 3),
        "rollouts_per_s": round(a.rollouts / wall, 2),
        "overhead_ms_median": percentile(overhead, 50),
        "overhead_ms_p95": percentile(overhead, 95),
        "rollout_ms_median": percentile([x["total"] for x in t], 50),
        "commands_ms_median": percentile(
            [x["agent"] + x["verifier"] for x in t], 50),
        "start_ms_median": percentile([x["start"] for x in t], 50),
        "setup_ms_median": percentile([x["setup"] for x in t], 50),
        "stop_ms_median": percentile([x["stop"] for x in t], 50),
        "build_ms_median": percentile([x["build"] for x in t], 50),
    }
    print(f"{a.rollouts} rollouts of a trivial task, --jobs {a.jobs}, "
          f"in {wall:.2f} s: {figures['rollouts_per_s']} rollouts/s")
    print(f"per rollout (ms, median): wall {figures['rollout_ms_median']:.0f}"
          f" = agent+verifier commands {figures['commands_ms_median']:.0f}"
          f" + sifbox {figures['overhead_ms_median']:.0f}"
          f" (p95 {figures['overhead_ms_p95']:.0f});"
          f" of which start {figures['start_ms_median']:.0f},"
          f" uploads {figures['setup_ms_median']:.0f},"
          f" stop {figures['stop_ms_median']:.0f},"
          f" image {figures['build_ms_median']:.0f}")
    goal = figures["overhead_ms_median"] <= 10
    print(f"goal: median overhead <= 10 ms: {'met' if goal else 'NOT met'}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(figures, indent=2) + "\n")


def compare_jobs(a: argparse.Namespace) -> None:
    work = pathlib.Path(a.work)
    repo = pathlib.Path(__file__).resolve().parent.parent
    tar = a.base_tar or str(repo / "target" / "bookworm-minbase.tar")
    suite = pathlib.Path(a.examples)
    attempts = 3
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    walls = {}
    builds = {}
    for jobs in (1, 2):
        store = work / f"cold-{stamp}-j{jobs}"
        env = dict(os.environ, SIFBOX_CACHE=str(store))
        subprocess.run([a.sifbox, "image", "import", tar, "--name",
                        "debian:bookworm"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        out = work / "jobs"
        job = f"cold-{stamp}-j{jobs}"
        cmd = [a.sifbox, "eval", str(suite), "--attempts", str(attempts),
               "--jobs", str(jobs), "--out", str(out), "--job", job,
               "--progress", "quiet"]
        started = time.perf_counter()
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, check=False)
        walls[jobs] = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"bench-eval: {' '.join(cmd)} failed "
                     f"({done.returncode}):\n{done.stdout}{done.stderr}")
        builds[jobs] = max(
            (json.loads(f.read_text())["timings_ms"]["build"]
             for f in (out / job).glob("*/result.json")), default=0) / 1000
        print(f"--jobs {jobs} --attempts {attempts}, cold store: "
              f"{walls[jobs]:.1f} s (longest build {builds[jobs]:.1f} s)")
    ratio = walls[2] / walls[1]
    longest = builds[1]
    met = ratio <= 0.7 or walls[2] <= longest * 1.1
    print(f"--jobs 2 / --jobs 1: {ratio:.2f} (goal <= 0.70, unless one "
          f"build alone, {longest:.1f} s, is longer): "
          f"{'met' if met else 'NOT met'}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({
            "wall_s_jobs1": round(walls[1], 2),
            "wall_s_jobs2": round(walls[2], 2),
            "ratio": round(ratio, 3),
            "longest_build_s": round(longest, 2)}, indent=2) + "\n")


def compare_layers(a: argparse.Namespace) -> None:
    work = pathlib.Path(a.work)
    os.environ.setdefault("SIFBOX_CACHE", str(work / "cache"))
    task = make_task(work / "tasks")
    out = work / "jobs"
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    layers = a.layers.split(",")
    run_job(a.sifbox, task, out, f"warm-{stamp}", 1, 1)
    rounds = 4
    per_job = max(1, a.rollouts // (rounds * len(layers)))
    overhead: dict[str, list[float]] = {k: [] for k in layers}
    start: dict[str, list[float]] = {k: [] for k in layers}
    stop: dict[str, list[float]] = {k: [] for k in layers}
    for r in range(rounds):
        for layer in layers:
            job = f"layers-{stamp}-{layer}-{r}"
            run_job(a.sifbox, task, out, job, per_job, a.jobs, layer)
            for f in (out / job).glob("*/result.json"):
                res = json.loads(f.read_text())
                if res["status"] != "ok" or res["reward"] != 1.0:
                    sys.exit(f"bench-eval: {f}: not reward 1")
                how = [x["how"] for x in res["limits_applied"]
                       if x["limit"] == "storage"]
                if how != [layer]:
                    sys.exit(f"bench-eval: {f}: storage by {how}, not {layer}")
                t = res["timings_ms"]
                overhead[layer].append(res["overhead_ms"])
                start[layer].append(t["start"])
                stop[layer].append(t["stop"])
    figures = {}
    for layer in layers:
        figures[layer] = {
            "rollouts": len(overhead[layer]),
            "overhead_ms_median": percentile(overhead[layer], 50),
            "overhead_ms_p95": percentile(overhead[layer], 95),
            "start_ms_median": percentile(start[layer], 50),
            "stop_ms_median": percentile(stop[layer], 50),
        }
        f = figures[layer]
        print(f"{layer:6} {f['rollouts']} rollouts, --jobs {a.jobs}: "
              f"overhead median {f['overhead_ms_median']:.1f} ms "
              f"(p95 {f['overhead_ms_p95']:.1f}), start "
              f"{f['start_ms_median']:.1f}, stop {f['stop_ms_median']:.1f}")
    base, *rest = layers
    for layer in rest:
        d = (figures[layer]["overhead_ms_median"]
             - figures[base]["overhead_ms_median"])
        print(f"{layer} - {base}: {d:+.1f} ms overhead per rollout (median)")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
