#!/usr/bin/env python3
# Checks lib/ against the size limits of the style: a class's declaration (from its
# `class X {` to its `};`, comments included) at most 120 lines, a function at most 80
# (the config schema's table, build_schema, exempt). Prints the largest of each and every
# one over its limit; exit status 1 when any is. Needs universal-ctags (apt-get install
# universal-ctags). Usage: scripts/size_check.py [DIR ...] (default: lib)
import json
import shutil
import subprocess
import sys

CLASS_LIMIT, FUNCTION_LIMIT = 120, 80
EXEMPT = {"build_schema"}  # lib/config/schema.cpp: one table of every key
SHOWN = 5


def tags(dirs):
    if shutil.which("ctags") is None:
        sys.exit("size_check: ctags not found; install universal-ctags (apt-get install universal-ctags)")
    out = subprocess.run(["ctags", "--fields=+ne", "-R", "--output-format=json", "--languages=C++",
                          "--langmap=C++:+.cu.cuh", "-f", "-", *dirs], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        t = json.loads(line)
        if t.get("_type") == "tag" and "end" in t:
            yield t


def main():
    dirs = sys.argv[1:] or ["lib"]
    sizes = {"class": [], "function": []}
    for t in tags(dirs):
        kind = "class" if t["kind"] in ("class", "struct", "union") else t["kind"]
        if kind not in sizes or t["name"] in EXEMPT:
            continue
        name = f'{t["scope"]}::{t["name"]}' if t.get("scope") else t["name"]
        sizes[kind].append((t["end"] - t["line"] + 1, f'{t["path"]}:{t["line"]}', name))
    over = 0
    for kind, limit in (("class", CLASS_LIMIT), ("function", FUNCTION_LIMIT)):
        ranked = sorted(sizes[kind], reverse=True)
        print(f"{kind}es/structs" if kind == "class" else "functions", f"(limit {limit} lines), the largest:")
        for n, where, name in ranked[:SHOWN]:
            print(f"  {n:5d}  {name}  {where}")
        for n, where, name in ranked:
            if n > limit:
                print(f"  over the limit: {name} ({n} lines) at {where}")
                over += 1
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
