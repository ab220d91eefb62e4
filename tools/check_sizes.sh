#!/usr/bin/env bash
# The house's sizes, checked on the project's own code (core/, trainer/, node/, clusterize/,
# coordinator/, apps/): no file over 500 lines, no function over 80; and on the tests' C++
# (tests/): no file over 500 lines (a test body reads top to bottom: its length is not limited);
# and on the scripts (python, shell, CMake) of tools/, tests/, examples/, cmake/ and the top level:
# no file over 500 lines.
# Functions' first and last lines come from Universal Ctags (`--fields=+ne`: line and end), which
# sees lambdas' enclosing function as one. A file or function that must stay larger is named in
# EXCEPTIONS below with its reason; the list starts empty. Run by ctest (lint.sizes) and so by
# tools/test.sh.
#   tools/check_sizes.sh [SOURCE_DIR]
set -euo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"
MAX_FILE_LINES=500
MAX_FUNCTION_LINES=80
ROOMS=(core trainer node clusterize coordinator apps)
TESTS=(tests)  # file sizes only
SCRIPT_DIRS=(tools tests examples cmake)  # file sizes only: *.py, *.sh, *.cmake, CMakeLists.txt and
                                          # scripts without a suffix whose first line names python
# "path" or "path:function", one per line, each with its reason in a comment above it.
EXCEPTIONS=(
)

if ! command -v ctags >/dev/null || ! ctags --version 2>/dev/null | grep -q Universal; then
  echo "check_sizes: Universal Ctags is missing (Debian package universal-ctags; tools/setup.sh installs it)"
  exit 1
fi
excepted() {
  local item
  for item in "${EXCEPTIONS[@]}"; do [[ "$item" == "$1" ]] && return 0; done
  return 1
}

failures=0
files=()
while IFS= read -r -d '' file; do files+=("$file"); done < <(
  find "${ROOMS[@]}" -type f \( -name '*.h' -o -name '*.cpp' \) -print0 | sort -z)
test_files=()
while IFS= read -r -d '' file; do test_files+=("$file"); done < <(
  find "${TESTS[@]}" -type f \( -name '*.h' -o -name '*.cpp' \) -print0 | sort -z)
scripts=(CMakeLists.txt)
while IFS= read -r -d '' file; do
  case "$file" in
    *.py | *.sh | *.cmake | */CMakeLists.txt) scripts+=("$file") ;;
    */*.*) ;;
    *) head -c 64 "$file" | head -n 1 | grep -q python && scripts+=("$file") ;;
  esac
done < <(find "${SCRIPT_DIRS[@]}" -type f -not -path '*/data/*' -not -path '*/corpus/*' -print0 | sort -z)
# One wc for every file (a wc per file was most of the check's time); its "total" line is skipped.
while read -r lines file; do
  [[ -n "$file" && -f "$file" ]] || continue
  if ((lines > MAX_FILE_LINES)) && ! excepted "$file"; then
    echo "$file: $lines lines (at most $MAX_FILE_LINES: split it along a seam)"
    failures=$((failures + 1))
  fi
done < <(wc -l "${files[@]}" "${test_files[@]}" "${scripts[@]}")
while IFS=$'\t' read -r length file name line; do
  if ! excepted "$file:$name"; then
    echo "$file:$line: function $name is $length lines (at most $MAX_FUNCTION_LINES)"
    failures=$((failures + 1))
  fi
done < <(ctags --fields=+ne --c++-kinds=f --language-force=C++ -o - "${files[@]}" |
         awk -F'\t' -v max="$MAX_FUNCTION_LINES" '{
           start = ""; end = ""
           for (i = 4; i <= NF; i++) {
             if ($i ~ /^line:/) start = substr($i, 6)
             if ($i ~ /^end:/) end = substr($i, 5)
           }
           if (start != "" && end != "" && end - start + 1 > max)
             printf "%d\t%s\t%s\t%s\n", end - start + 1, $2, $1, start
         }')
if ((failures > 0)); then
  echo "check_sizes: $failures file(s) or function(s) over the limits"
  exit 1
fi
echo "check_sizes: ${#files[@]} files of ${ROOMS[*]}: none over $MAX_FILE_LINES lines, no function over" \
  "$MAX_FUNCTION_LINES; ${#test_files[@]} C++ files of ${TESTS[*]} and ${#scripts[@]} scripts: none over" \
  "$MAX_FILE_LINES lines"
