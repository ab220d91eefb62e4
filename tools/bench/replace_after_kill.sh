#!/usr/bin/env bash
# How soon a killed volunteer's node trains again on a spare, with and without the coordinator
# watching its connections (clusterize --gone-after-s; docs/OPERATIONS.md "A lost volunteer is
# replaced by a spare"). Runs examples/fashion_mnist/run_volunteers.sh --short (a coordinator with
# --lost-after-s S, Root → Stem → Leaf and a spare on loopback; the Stem SIGKILLed after its
# step-10 checkpoint) ROUNDS times each way, alternating: CAIRN_GONE_AFTER_S=0 (lost only after S
# seconds of silence), then the default --gone-after-s 3 (3 s after its connections closed). S is
# --lost-after-s (default 15, the coordinator's default; the example alone uses 5). Prints each
# run's seconds from the kill to the spare's first step record, how the node was found lost, and
# the medians' ratio. Not in run_all (~20-35 s a run).
#   tools/bench/replace_after_kill.sh [--rounds N] [--lost-after-s S]   (CAIRN_BUILD_DIR as the example's)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3
lost_after=15
while (( $# )); do
  case $1 in
    --rounds) rounds=${2:-}; shift 2 || true ;;
    --lost-after-s) lost_after=${2:-}; shift 2 || true ;;
    *) echo "replace_after_kill: unknown flag '$1' (--rounds N, --lost-after-s S)" >&2; exit 2 ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "replace_after_kill: --rounds takes a positive whole number, not '$rounds'" >&2; exit 2; }
[[ "$lost_after" =~ ^[0-9]+$ && $lost_after -ge 4 ]] || {
  echo "replace_after_kill: --lost-after-s takes whole seconds >= 4 (above --gone-after-s 3), not '$lost_after'" >&2; exit 2; }
work=$(mktemp -d /tmp/cairn_replace_after_kill.XXXXXX)
trap 'rm -rf "$work"' EXIT
declare -A seconds=([silence]="" [gone]="")
for r in $(seq "$rounds"); do
  for way in silence gone; do
    gone_after=3
    [[ $way == silence ]] && gone_after=0
    out=$work/$way-$r
    if ! CAIRN_GONE_AFTER_S=$gone_after CAIRN_LOST_AFTER_S=$lost_after CAIRN_EXAMPLE_OUT=$out examples/fashion_mnist/run_volunteers.sh --short \
        >"$work/$way-$r.log" 2>&1; then
      echo "replace_after_kill: run $r ($way) failed; its log:" >&2
      tail -30 "$work/$way-$r.log" >&2
      exit 1
    fi
    s=$(sed -n 's/.* \([0-9.]*\) s after the kill$/\1/p' "$work/$way-$r.log")
    why=$(sed -n 's/.*coordinator: lost: [^ ]* at [^ ]* (\(.*\))$/\1/p' "$work/$way-$r.log")
    [[ -n "$s" ]] || { echo "replace_after_kill: run $r ($way) printed no time after the kill" >&2; exit 1; }
    printf 'round %d %-8s --gone-after-s %s: spare trains %5s s after the kill (lost: %s)\n' \
      "$r" "$way" "$gone_after" "$s" "$why"
    seconds[$way]+="$s "
  done
done
/usr/bin/python3 - "${seconds[silence]}" "${seconds[gone]}" "$lost_after" <<'PY'
import statistics, sys
silence, gone = ([float(x) for x in a.split()] for a in sys.argv[1:3])
ms, mg = statistics.median(silence), statistics.median(gone)
print(f"median kill -> spare's first step: {ms:.1f} s by silence (--lost-after-s {sys.argv[3]}), "
      f"{mg:.1f} s by closed connections (--gone-after-s 3): {ms / mg:.2f}x sooner")
PY
