#!/usr/bin/python3
"""No two source files of one test executable declare the same name in an anonymous namespace.

The test executables compile in unity batches (tests/CMakeLists.txt): files of one executable are
#included into one translation unit, so their file-local helpers share a scope. A second
definition of a name does not compile; a second overload of a function compiles and may silently
capture the other file's calls. This check reads each executable's sources from
tests/CMakeLists.txt (`add_executable(name a.cpp b.cpp ...)`) and each file's anonymous-namespace
members from Universal Ctags (`--output-format=json`, the same tool tools/check_sizes.sh uses), and
fails naming every shared name and its files. Run by ctest (lint.test_names).
  tools/check_test_names.py [SOURCE_DIR]
"""
import collections
import json
import os
import re
import subprocess
import sys

# GoogleTest's macros read as functions to ctags; every test file has them.
MACROS = {"TEST", "TEST_F", "TEST_P", "TYPED_TEST", "TYPED_TEST_P", "INSTANTIATE_TEST_SUITE_P",
          "TYPED_TEST_SUITE", "REGISTER_TYPED_TEST_SUITE_P", "INSTANTIATE_TYPED_TEST_SUITE_P"}


def executables(cmake_text):
    """{executable: [source, ...]} for every add_executable with more than one .cpp."""
    found = {}
    for m in re.finditer(r"add_executable\((\w+)\s+([^)]*)\)", cmake_text):
        sources = [w for w in re.sub(r"#[^\n]*", "", m.group(2)).split() if w.endswith(".cpp")]
        if len(sources) > 1:
            found[m.group(1)] = sources
    return found


def file_local_names(path):
    """Names declared directly in an anonymous namespace of `path`."""
    out = subprocess.run(["ctags", "--output-format=json", "--fields=+KsZ", "--kinds-c++=+p-m",
                          "-o", "-", path], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        entry = json.loads(line)
        if entry.get("_type") != "tag" or entry.get("scopeKind") != "namespace":
            continue
        if "__anon" in entry.get("scope", "").split("::")[-1] and entry["name"] not in MACROS:
            names.add(entry["name"])
    return names


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    tests = os.path.join(root, "tests")
    try:
        subprocess.run(["ctags", "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        print("check_test_names: Universal Ctags is missing (Debian package universal-ctags; "
              "tools/setup.sh installs it)")
        return 1
    with open(os.path.join(tests, "CMakeLists.txt")) as f:
        targets = executables(f.read())
    failures = 0
    for target, sources in sorted(targets.items()):
        owners = collections.defaultdict(list)
        for source in sources:
            for name in file_local_names(os.path.join(tests, source)):
                owners[name].append(source)
        for name, files in sorted(owners.items()):
            if len(files) > 1:
                failures += 1
                print(f"tests/CMakeLists.txt {target}: '{name}' is file-local in {len(files)} of its "
                      f"sources ({', '.join('tests/' + f for f in files)}): they may share a unity "
                      f"batch; rename all but one, or share one definition from a header")
    print(f"check_test_names: {sum(map(len, targets.values()))} sources of {len(targets)} test "
          f"executables, {failures} shared file-local name(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
