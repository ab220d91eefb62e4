# Shared by the benchmarks that run volunteers on this machine (checkpoint_upload_cost.sh,
# send_cap.sh); sourced, not run. From the repository root, after `set -euo pipefail`:
#   volunteer_bench_setup NAME     checks CAIRN_BUILD_DIR's (default build) provider and clusterize,
#                                  makes $work (removed on exit, with every process started here)
#                                  and the example CNN in $work/model.pt
#   write_fashion_job ID STEPS [TRAINING_JSON_FIELDS]
#                                  $work/job.json: Fashion-MNIST, batch 32, 4 micro-batches, AdamW,
#                                  STEPS steps, plus the extra training_definition fields given
#   run_volunteers DIR [FLAGS...]  a coordinator (clusterize --serve, 1 cluster x 3 stages, cuts
#                                  7,14) and 3 `provider --join` volunteers with FLAGS, on loopback,
#                                  logs in DIR; returns when all exited 0 (else exits 1)
volunteer_bench_setup() {
  local name=$1
  build=${CAIRN_BUILD_DIR:-build}
  provider=$build/node/provider
  clusterize=$build/clusterize/clusterize
  for b in "$provider" "$clusterize"; do
    [[ -x $b ]] || { echo "$name: $b is not built" >&2; exit 2; }
  done
  work=$(mktemp -d "/tmp/cairn_${name%.sh}.XXXXXX")
  pids=()
  trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
  /usr/bin/python3 examples/fashion_mnist/make_model.py --out "$work/model.pt" >/dev/null
}

write_fashion_job() {
  local id=$1 steps=$2 extra=${3:-}
  cat >"$work/job.json" <<JOB
{"format": 1, "job_id": "$id", "driver": "cairn", "model": "$work/model.pt",
 "data": {"location": "/usr/share/datasets/fashion-mnist", "format": "idx",
          "normalize": {"mean": [0.2860], "std": [0.3530]}, "train_samples": 6000, "test_samples": 200},
 "training_definition": {"batch_size": 32, "microbatches": 4, "epochs": 0, "max_steps": $steps,
                         "seed": 3, "optimizer": {"name": "adamw", "lr": 0.003},$extra
                         "timeouts": {"startup_s": 60, "peer_s": 60}}}
JOB
}

run_volunteers() {
  local dir=$1
  shift
  mkdir -p "$dir"
  pids=()
  "$clusterize" --model "$work/model.pt" --job "$work/job.json" --input-shape 8,1,28,28 \
    --serve 127.0.0.1:0 --invite-file "$dir/invite.txt" --out "$dir/coordinator" \
    --min-volunteers 3 --clusters 1 --cuts 7,14 >"$dir/coordinator.log" 2>&1 &
  local coordinator=$!
  pids+=("$coordinator")
  for _ in $(seq 600); do [[ -s $dir/invite.txt ]] && break; sleep 0.2; done
  local invite volunteers=()
  invite=$(cat "$dir/invite.txt")
  for i in 0 1 2; do
    "$provider" --join "$invite" --listen "127.0.0.1:$(/usr/bin/python3 tools/bench/loopback_ports.py 1)" \
      --workdir "$dir/volunteer_$i" --probe-megabytes 1 "$@" >"$dir/volunteer_$i.log" 2>&1 &
    volunteers+=($!)
    pids+=($!)
  done
  wait "$coordinator" || { echo "the coordinator failed; see below" >&2; tail -20 "$dir/coordinator.log" >&2; exit 1; }
  for v in "${volunteers[@]}"; do wait "$v" || { echo "a volunteer failed" >&2; exit 1; }; done
}
