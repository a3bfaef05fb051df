#!/usr/bin/env python3
"""The size of sifbox's code, as the architecture issues count it.

Prints, for crates/*/src (library and binary code, not tests/ or benches):
  - lines per crate (all lines of its .rs files under src/),
  - files over --file-limit lines before their `#[cfg(test)]` module,
  - functions over --fn-limit lines (from the `fn` line to its closing brace).

Functions are found by a brace count that skips strings, chars and comments;
good enough for rustfmt-formatted code, which is all this repo has.

    python3 scripts/code-stats.py [--file-limit 1000] [--fn-limit 200]
"""

import argparse
import re
import sys
from pathlib import Path

FN_RE = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)")
TEST_MOD_RE = re.compile(r"^#\[cfg\(test\)\]")


def strip_code(line, state):
    """The line without strings, chars and comments; state carries block comments and raw strings."""
    out = []
    i = 0
    n = len(line)
    while i < n:
        if state["block"]:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out)
            state["block"] = False
            i = end + 2
            continue
        if state["raw"] is not None:
            end = line.find('"' + "#" * state["raw"], i)
            if end < 0:
                return "".join(out)
            i = end + 1 + state["raw"]
            state["raw"] = None
            continue
        if state["str"]:
            if line[i] == "\\":
                i += 2
                continue
            if line[i] == '"':
                state["str"] = False
            i += 1
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"] = True
            i += 2
            continue
        m = re.match(r'b?r(#*)"', line[i:])
        if m and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "_")):
            state["raw"] = len(m.group(1))
            i += len(m.group(0))
            continue
        if c == '"':
            state["str"] = True
            i += 1
            continue
        if c == "'":
            m = re.match(r"'(\\.[^']*|[^'\\])'", line[i:])
            if m:
                i += len(m.group(0))
                continue
        out.append(c)
        i += 1
    return "".join(out)


def scan(path):
    lines = path.read_text(errors="replace").splitlines()
    code_end = len(lines)
    for idx, line in enumerate(lines):
        if TEST_MOD_RE.match(line):
            code_end = idx
            break
    state = {"block": False, "raw": None, "str": False}
    long_fns = []
    stack = []  # (name, start line, depth at open)
    depth = 0
    pending = None
    for idx, line in enumerate(lines[:code_end]):
        m = FN_RE.match(line)
        if m:
            pending = (m.group(7), idx + 1)
        code = strip_code(line, state)
        for c in code:
            if c == "{":
                if pending is not None:
                    stack.append((pending[0], pending[1], depth))
                    pending = None
                depth += 1
            elif c == "}":
                depth -= 1
                if stack and stack[-1][2] == depth:
                    name, start, _ = stack.pop()
                    length = idx + 1 - start + 1
                    long_fns.append((length, name, start))
            elif c == ";" and pending is not None:
                pending = None  # a declaration without a body (trait method, extern fn)
    return len(lines), code_end, long_fns


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file-limit", type=int, default=1000)
    ap.add_argument("--fn-limit", type=int, default=200)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    args = ap.parse_args()
    root = Path(args.root)
    crates = sorted(p for p in (root / "crates").iterdir() if (p / "src").is_dir())
    big_files = []
    big_fns = []
    print("lines per crate (src/):")
    total = 0
    for crate in crates:
        count = 0
        for f in sorted((crate / "src").rglob("*.rs")):
            n, code, fns = scan(f)
            count += n
            rel = f.relative_to(root)
            if code > args.file_limit:
                big_files.append((code, str(rel)))
            for length, name, start in fns:
                if length > args.fn_limit:
                    big_fns.append((length, f"{rel}:{start} {name}"))
        total += count
        print(f"  {crate.name:<18} {count:>7}")
    print(f"  {'total':<18} {total:>7}")
    print(f"files over {args.file_limit} lines before their tests: {len(big_files)}")
    for n, name in sorted(big_files, reverse=True):
        print(f"  {n:>6}  {name}")
    print(f"functions over {args.fn_limit} lines: {len(big_fns)}")
    for n, name in sorted(big_fns, reverse=True):
        print(f"  {n:>6}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
