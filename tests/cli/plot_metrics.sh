#!/usr/bin/env bash
# plot_metrics turns a run's metrics.jsonl files into three PNG charts; an empty folder is bad
# input (exit 2).
set -euo pipefail
TOOL=$1; FIXTURE=$2
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
"$TOOL" "$FIXTURE" --out "$d/plots" > "$d/list"
for png in loss accuracy time_split; do
  f="$d/plots/$png.png"
  [[ -s "$f" ]] || { echo "missing $f"; exit 1; }
  [[ "$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')" == "89504e470d0a1a0a" ]] || { echo "$f is not a PNG"; exit 1; }
done
mkdir -p "$d/empty"
set +e
err=$("$TOOL" "$d/empty" 2>&1); rc=$?
set -e
[[ $rc -eq 2 ]] || { echo "empty folder: expected exit 2, got $rc"; exit 1; }
grep -q "no nodes found" <<<"$err" || { echo "unexpected: $err"; exit 1; }
echo ok
