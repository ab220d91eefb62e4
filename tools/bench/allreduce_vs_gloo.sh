#!/usr/bin/env bash
# Ring all-reduce of float32 tensors, cairn (bench_allreduce) against torch.distributed's gloo
# (allreduce_gloo.py, Debian's /usr/bin/python3), side by side in one run: for each process count,
# the two alternate --repeats times (so that load on the machine hits both alike), each run doing
# warm-up rounds (excluded) and timed rounds at the same sizes. Prints, per process count and size,
# the median seconds over all timed rounds, the algorithm bandwidth (bytes / seconds) and the
# ratio cairn/gloo of bandwidths (≥ 1.0: cairn at least as fast). Raw JSON lines go to --out.
#
#   tools/bench/allreduce_vs_gloo.sh                       # 100 MB among 2 and 4 processes
#   tools/bench/allreduce_vs_gloo.sh --sizes-mb 1,10,100,256 --ranks 2,4 --repeats 5
#
# Environment: CAIRN_BUILD_DIR (default build), extra cairn flags in CAIRN_BENCH_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/../.."

ranks_list=2,4
sizes=100
repeats=3
rounds=5
warmup=1
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks_list=$2; shift 2 ;;
    --sizes-mb) sizes=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "allreduce_vs_gloo.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

build=${CAIRN_BUILD_DIR:-build}
bench="$build/tools/bench/bench_allreduce"
python=/usr/bin/python3
[[ -x "$bench" ]] || { echo "allreduce_vs_gloo.sh: $bench not built (ninja -C $build bench_allreduce)" >&2; exit 2; }
"$python" -c "import torch.distributed as d; assert d.is_gloo_available()" ||
  { echo "allreduce_vs_gloo.sh: $python has no torch.distributed with gloo" >&2; exit 2; }
[[ -n "$out" ]] || out=$(mktemp /tmp/allreduce_vs_gloo.XXXXXX.jsonl)
: > "$out"

# each run's ports: free ones below the kernel's ephemeral range, held for this script's life
# (tools/bench/loopback_ports.py), not guessed
IFS=, read -ra ranks_array <<< "$ranks_list"
for n in "${ranks_array[@]}"; do
  for ((i = 0; i < repeats; i++)); do
    port=$("$python" tools/bench/loopback_ports.py $((2 * n + 1)))
    echo "ranks=$n repeat=$((i + 1))/$repeats: cairn" >&2
    # shellcheck disable=SC2086
    "$bench" --ranks "$n" --sizes-mb "$sizes" --rounds "$rounds" --warmup "$warmup" --port "$port" \
      ${CAIRN_BENCH_FLAGS:-} >> "$out"
    port=$("$python" tools/bench/loopback_ports.py $((2 * n + 1)))
    echo "ranks=$n repeat=$((i + 1))/$repeats: gloo" >&2
    "$python" tools/bench/allreduce_gloo.py --ranks "$n" --sizes-mb "$sizes" --rounds "$rounds" \
      --warmup "$warmup" --port "$port" >> "$out"
  done
done

"$python" - "$out" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
rounds = {}
for r in rows:
    rounds.setdefault((r["ranks"], r["bytes"], r["impl"]), []).extend(r["rounds_s"])
print(f"{'ranks':>5} {'MB':>8} {'cairn s':>10} {'cairn GB/s':>11} {'gloo s':>10} {'gloo GB/s':>10} {'cairn/gloo':>11}")
for ranks, nbytes in sorted({(k[0], k[1]) for k in rounds}):
    ours = statistics.median(rounds.get((ranks, nbytes, "cairn"), [float("nan")]))
    gloo = statistics.median(rounds.get((ranks, nbytes, "gloo"), [float("nan")]))
    print(f"{ranks:>5} {nbytes / 1e6:>8.1f} {ours:>10.4f} {nbytes / ours / 1e9:>11.3f} "
          f"{gloo:>10.4f} {nbytes / gloo / 1e9:>10.3f} {gloo / ours:>10.2f}x")
print(f"(median of {len(next(iter(rounds.values())))} timed rounds each; raw: {sys.argv[1]})")
EOF
