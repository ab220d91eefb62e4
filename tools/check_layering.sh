#!/usr/bin/env bash
# The layering of the rooms (docs/ARCHITECTURE.md), checked on every include of the project's own
# code: core ← trainer ← node, core ← clusterize, {node, clusterize} ← coordinator. An include that runs back up (core including
# trainer/, trainer including node/, clusterize including trainer/ or node/, ...) fails the check,
# naming the file, the line and the rule. Run by ctest (lint.layering) and so by tools/test.sh.
#   tools/check_layering.sh [SOURCE_DIR]
set -euo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"
# room → the rooms it may include from (besides itself)
declare -A ALLOWED=(
  [core]=""
  [trainer]="core"
  [clusterize]="core"
  [node]="core trainer"
  [coordinator]="core trainer node clusterize"
)
# A binary's main (*_main.cpp) is the top of its program, not part of a library: it may include
# any room (clusterize_main.cpp dispatches --serve to coordinator/).
failures=0
checked=0
for room in "${!ALLOWED[@]}"; do
  while IFS= read -r -d '' file; do
    checked=$((checked + 1))
    [[ "$file" == *_main.cpp ]] && continue
    while IFS=: read -r line target; do
      dep=${target%%/*}
      [[ "$dep" == "$room" ]] && continue
      if [[ -z "${ALLOWED[$dep]+x}" ]]; then continue; fi  # not a room (e.g. tests/)
      if [[ " ${ALLOWED[$room]} " != *" $dep "* ]]; then
        echo "$file:$line: includes \"$target\": $room/ may include only from ${ALLOWED[$room]:-no other room} (docs/ARCHITECTURE.md)"
        failures=$((failures + 1))
      fi
    done < <(grep -n -o -E '^\s*#\s*include\s+"[a-z_]+/[^"]+"' "$file" |
             sed -E 's/^([0-9]+):.*"([^"]+)"/\1:\2/')
  done < <(find "$room" -type f \( -name '*.h' -o -name '*.cpp' \) -print0)
done
if ((failures > 0)); then
  echo "check_layering: $failures include(s) against the layering"
  exit 1
fi
echo "check_layering: $checked files of core/, trainer/, clusterize/, node/, coordinator/ follow core ← trainer ← node, core ← clusterize, {node, clusterize} ← coordinator"
