#!/usr/bin/python3
"""Every source file compiles as a translation unit of its own.

The build compiles each target in unity batches (CMakeLists.txt CAIRN_UNITY_BUILD), and every
target that includes torch force-includes one precompiled header. Both hide mistakes: a file that
misses an #include, or uses a type another file of its batch defines, compiles today and breaks
when the batches move or someone builds with -DCAIRN_UNITY_BUILD=OFF. This check configures a
non-unity build (cmake only, nothing is built) to get each file's exact compile command, drops the
precompiled header and the object output, and runs the compiler with -fsyntax-only on every
project source, two at a time by default. It fails naming each file that does not compile, with
the compiler's first lines.

Not in ctest: it parses torch's headers once per file that includes them (about 25 CPU-minutes
for the whole tree on this project's 2-core machines). Run it after moving code between files.
  tools/check_standalone.py [--build-dir DIR] [--only REGEX] [-j N]
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commands(build_dir):
    """The compile commands of a non-unity configure of this tree, for the project's own sources."""
    configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCAIRN_UNITY_BUILD=OFF",
                 "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"]
    if subprocess.run(configure, capture_output=True, text=True).returncode != 0:
        sys.exit(f"check_standalone: `{' '.join(configure)}` failed; run it to see why")
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    own = []
    for e in entries:
        path = os.path.realpath(e["file"])
        rel = os.path.relpath(path, ROOT)
        # cmake/pch.cpp only carries the precompiled header; build folders hold generated files.
        if rel.startswith("..") or rel == os.path.join("cmake", "pch.cpp") or \
                os.path.realpath(build_dir) in path:
            continue
        cmd = re.sub(r" -o \S+ -c ", " -fsyntax-only ", e["command"])
        cmd = re.sub(r" -include \S+cmake_pch\.hxx", "", cmd)
        cmd = re.sub(r" -Winvalid-pch", "", cmd)
        cmd = re.sub(r" -O[0-3s] ", " -O0 ", cmd)  # the optimiser adds nothing to a syntax check
        own.append((rel, cmd, e["directory"]))
    return own


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-standalone"),
                    help="where the non-unity configure goes (default: build-standalone/)")
    ap.add_argument("--only", default="", help="check only sources whose path matches this regex")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="compilers at once (default 2)")
    args = ap.parse_args()
    todo = [c for c in commands(args.build_dir) if re.search(args.only, c[0])]
    if not todo:
        sys.exit(f"check_standalone: no source matches --only {args.only!r}")

    def compile_one(item):
        rel, cmd, cwd = item
        proc = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True)
        return rel, proc.returncode, proc.stderr

    failed = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for rel, rc, err in pool.map(compile_one, todo):
            if rc != 0:
                failed.append(rel)
                print(f"check_standalone: {rel} does not compile on its own:\n"
                      + "\n".join(err.splitlines()[:12]), flush=True)
    if failed:
        sys.exit(f"check_standalone: {len(failed)} of {len(todo)} sources do not compile on their own")
    print(f"check_standalone: {len(todo)} sources each compile as a translation unit of their own")


if __name__ == "__main__":
    main()
