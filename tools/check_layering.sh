#!/usr/bin/env bash
# The layering of the rooms and of node/'s sub-rooms (docs/ARCHITECTURE.md), checked on every include
# of the project's own code:
#   rooms:          core ← trainer ← node, core ← clusterize, {node, clusterize} ← coordinator ← apps
#   node sub-rooms: transport ← protocol ← collectives ← ring ← pipeline ← volunteer
#                   (node/testing, test-only code, may use any of them)
# An include that runs back up (core including trainer/, trainer including node/, node/transport
# including node/ring/, a room including apps/, ...) fails the check, naming the file, the line and
# the rule. No file is exempt: the binaries' mains live in apps/, the one room that may include all.
# Run by ctest (lint.layering) and so by tools/test.sh.
#   tools/check_layering.sh [SOURCE_DIR]
set -euo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"
# room → the rooms it may include from (besides itself). node/ is checked per sub-room; its
# sub-rooms appear as node/<name>.
NODE_ORDER=(transport protocol collectives ring pipeline volunteer)
declare -A ALLOWED=(
  [core]=""
  [trainer]="core"
  [clusterize]="core"
  [coordinator]="core trainer node clusterize"
  [apps]="core trainer node clusterize coordinator"
)
below="core trainer"
for sub in "${NODE_ORDER[@]}"; do
  ALLOWED[node/$sub]="$below"
  below="$below node/$sub"
done
ALLOWED[node/testing]="$below"

# The room (or node sub-room) a path such as "node/ring/RingState.h" belongs to, in ROOM; empty if
# none. (A variable, not $(room_of ...): a subshell per include took most of the check's 25 s.)
room_of() {
  local path=$1 top=${1%%/*}
  ROOM=""
  if [[ "$top" == node ]]; then
    local rest=${path#node/}
    local sub=${rest%%/*}
    if [[ "$sub" != "$rest" && -n "${ALLOWED[node/$sub]+x}" ]]; then ROOM="node/$sub"; else ROOM=node; fi
  elif [[ -n "${ALLOWED[$top]+x}" ]]; then
    ROOM="$top"
  fi
}

# Is a file of room $1 allowed to include from room $2? (node as a whole counts for rooms above it.)
allowed() {
  local from=$1 to=$2
  [[ "$from" == "$to" ]] && return 0
  local dep=$to
  if [[ "$from" != node/* && "$to" == node/* ]]; then dep=node; fi
  [[ " ${ALLOWED[$from]} " == *" $dep "* ]]
}

failures=0
checked=0
files=()
while IFS= read -r -d '' file; do
  room_of "$file"
  [[ -n "$ROOM" ]] || continue
  if [[ "$ROOM" == node ]]; then
    echo "$file: lies in node/ itself; every node file belongs to a sub-room (${NODE_ORDER[*]}, testing)"
    failures=$((failures + 1))
    continue
  fi
  files+=("$file")
done < <(find core trainer clusterize node coordinator apps -type f \( -name '*.h' -o -name '*.cpp' \) -print0)
checked=${#files[@]}
# Every project include of every file at once, as FILE:LINE:TARGET (one grep, one sed: a pair per
# file was most of the check's time).
while IFS=: read -r file line target; do
  room_of "$file"
  room=$ROOM
  room_of "$target"
  dep=$ROOM
  [[ -n "$dep" ]] || continue  # not a room (e.g. tests/)
  if ! allowed "$room" "$dep"; then
    echo "$file:$line: includes \"$target\": $room/ may include only from ${ALLOWED[$room]:-no other room} (docs/ARCHITECTURE.md)"
    failures=$((failures + 1))
  fi
done < <(if ((checked > 0)); then
           grep -H -n -o -E '^\s*#\s*include\s+"[a-z_]+/[^"]+"' "${files[@]}" |
             sed -E 's/^([^:]+):([0-9]+):.*"([^"]+)"/\1:\2:\3/'
         fi)
if ((failures > 0)); then
  echo "check_layering: $failures include(s) against the layering"
  exit 1
fi
order=$(printf ' ← %s' "${NODE_ORDER[@]}")
echo "check_layering: $checked files follow core ← trainer ← node ← coordinator ← apps, core ← clusterize ← coordinator, and within node/${order# ← }"
