#!/usr/bin/python3
"""No two source files of one target declare the same file-local name.

Every target compiles in unity batches (CMakeLists.txt CAIRN_UNITY_BUILD): files of one library or
executable are #included into one translation unit, so their file-local helpers share a scope. A
second definition of a name does not compile; a second overload of a function compiles and may
silently capture the other file's calls. Which files share a batch changes whenever a file is added
or the batch size changes, so the rule holds for every pair of one target, not just today's
batches. This check reads each target's sources from the CMakeLists.txt of the rooms and of tests/
(`add_library(name [STATIC] a.cpp ...)`, `add_executable(name a.cpp ...)`) and each file's
anonymous-namespace members from Universal Ctags (`--output-format=json`, the same tool
tools/check_sizes.sh uses), and fails naming every shared name and its files. A type alias spelled
the same in every file (`using Clock = std::chrono::steady_clock;`) is allowed: C++ accepts the
repeat. Run by ctest (lint.unity_names).
  tools/check_unity_names.py [SOURCE_DIR]
"""
import collections
import json
import os
import re
import subprocess
import sys

# The folders whose CMakeLists.txt list sources by name (tools/bench lists them in a variable and
# compiles them as one batch, so a clash there fails every build at once).
FOLDERS = ["core", "trainer", "clusterize", "node", "coordinator", "apps", "tests"]
# GoogleTest's macros read as functions to ctags; every test file has them.
MACROS = {"TEST", "TEST_F", "TEST_P", "TYPED_TEST", "TYPED_TEST_P", "INSTANTIATE_TEST_SUITE_P",
          "TYPED_TEST_SUITE", "REGISTER_TYPED_TEST_SUITE_P", "INSTANTIATE_TYPED_TEST_SUITE_P"}


def targets_of(cmake_text):
    """{target: [source, ...]} for every add_library / add_executable with more than one .cpp."""
    text = re.sub(r"#[^\n]*", "", cmake_text)  # comments first: theirs may hold parentheses
    found = {}
    for m in re.finditer(r"add_(?:library|executable)\((\w+)\s+([^)]*)\)", text):
        sources = [w for w in m.group(2).split() if w.endswith(".cpp") and "$" not in w]
        if len(sources) > 1:
            found[m.group(1)] = sources
    return found


def file_local_names(paths):
    """{path: {name: declaration text}}: the names declared directly in an anonymous namespace of
    each file (one ctags run for all); the text only for type aliases (None for anything else)."""
    out = subprocess.run(["ctags", "--output-format=json", "--fields=+KsZ", "--kinds-c++=+p-m",
                          "-o", "-", *paths], capture_output=True, text=True, check=True).stdout
    names = {path: {} for path in paths}
    for line in out.splitlines():
        entry = json.loads(line)
        if entry.get("_type") != "tag" or entry.get("scopeKind") != "namespace":
            continue
        if "__anon" in entry.get("scope", "").split("::")[-1] and entry["name"] not in MACROS:
            alias = entry.get("kind") == "typedef"
            names[entry["path"]][entry["name"]] = (" ".join(entry.get("pattern", "").split())
                                                   if alias else None)
    return names


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    try:
        subprocess.run(["ctags", "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        print("check_unity_names: Universal Ctags is missing (Debian package universal-ctags; "
              "tools/setup.sh installs it)")
        return 1
    failures = sources_seen = targets_seen = 0
    for folder in FOLDERS:
        with open(os.path.join(root, folder, "CMakeLists.txt")) as f:
            targets = targets_of(f.read())
        for target, sources in sorted(targets.items()):
            targets_seen += 1
            sources_seen += len(sources)
            owners = collections.defaultdict(list)
            paths = [os.path.join(root, folder, source) for source in sources]
            found = file_local_names(paths)
            for source, path in zip(sources, paths):
                for name, alias in found[path].items():
                    owners[name].append((source, alias))
            for name, where in sorted(owners.items()):
                aliases = {alias for _, alias in where}
                if len(where) < 2 or (len(aliases) == 1 and None not in aliases):
                    continue
                failures += 1
                files = ", ".join(f"{folder}/{source}" for source, _ in where)
                print(f"{folder}/CMakeLists.txt {target}: '{name}' is file-local in {len(where)} of "
                      f"its sources ({files}): they may share a unity batch; rename all but one, or "
                      f"share one definition from a header")
    print(f"check_unity_names: {sources_seen} sources of {targets_seen} targets, {failures} shared "
          f"file-local name(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
