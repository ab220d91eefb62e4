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
# --spares: both ways with --gone-after-s 3, a reachable spare against a dial-out-only one (joined
# after the plan, without --listen: it takes the reachable Stem over by turning its links around).
#   tools/bench/replace_after_kill.sh [--rounds N] [--lost-after-s S] [--spares]   (CAIRN_BUILD_DIR as the example's)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3
lost_after=15
ways=(silence gone)
while (( $# )); do
  case $1 in
    --rounds) rounds=${2:-}; shift 2 || true ;;
    --lost-after-s) lost_after=${2:-}; shift 2 || true ;;
    --spares) ways=(reachable dial-out); shift ;;
    *) echo "replace_after_kill: unknown flag '$1' (--rounds N, --lost-after-s S, --spares)" >&2; exit 2 ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "replace_after_kill: --rounds takes a positive whole number, not '$rounds'" >&2; exit 2; }
[[ "$lost_after" =~ ^[0-9]+$ && $lost_after -ge 4 ]] || {
  echo "replace_after_kill: --lost-after-s takes whole seconds >= 4 (above --gone-after-s 3), not '$lost_after'" >&2; exit 2; }
work=$(mktemp -d /tmp/cairn_replace_after_kill.XXXXXX)
trap 'rm -rf "$work"' EXIT
declare -A seconds=()
for r in $(seq "$rounds"); do
  for way in "${ways[@]}"; do
    gone_after=3
    [[ $way == silence ]] && gone_after=0
    dial_out=''
    [[ $way == dial-out ]] && dial_out=1
    out=$work/$way-$r
    if ! CAIRN_EXAMPLE_SPARE_DIAL_OUT=$dial_out CAIRN_GONE_AFTER_S=$gone_after CAIRN_LOST_AFTER_S=$lost_after \
        CAIRN_EXAMPLE_OUT=$out examples/fashion_mnist/run_volunteers.sh --short \
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
/usr/bin/python3 - "${seconds[${ways[0]}]}" "${seconds[${ways[1]}]}" "$lost_after" "${ways[0]}" <<'PY'
import statistics, sys
first, second = ([float(x) for x in a.split()] for a in sys.argv[1:3])
m1, m2 = statistics.median(first), statistics.median(second)
if sys.argv[4] == "silence":
    print(f"median kill -> spare's first step: {m1:.1f} s by silence (--lost-after-s {sys.argv[3]}), "
          f"{m2:.1f} s by closed connections (--gone-after-s 3): {m1 / m2:.2f}x sooner")
else:
    print(f"median kill -> spare's first step: {m1:.1f} s with a reachable spare, {m2:.1f} s with a "
          f"dial-out-only one (its links turned around): {m2 / m1:.2f}x the time")
PY
