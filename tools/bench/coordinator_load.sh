#!/usr/bin/env bash
# The coordinator's capacity under many simulated volunteers (docs/BENCHMARKS.md "Churn"), one
# command: builds nothing, needs CAIRN_BUILD_DIR's (default build) clusterize and
# tools/bench/coordinator_load. It makes the example CNN (examples/fashion_mnist/make_model.py),
# safetensors shards of Debian's Fashion-MNIST (served by the coordinator: data.source
# "coordinator", so Roots send chunk requests) and a job, then runs coordinator_load once per size.
#   tools/bench/coordinator_load.sh [SIZE...]        default sizes: 100 1000 5000
# Exits 1 when a size did not run to its end (the others still run; ctest bench.coordinator_load_smoke
# runs 20 volunteers for a few seconds).
# Environment: OUT (default /tmp/coordinator_load) gets coordinator_load_<SIZE>.json and each run's
# coordinator folder and log; PLACED (default 0: every volunteer) is how many the coordinator
# places (--placed); MEASURE_S (default 60) the measured seconds; LOAD_ARGS more coordinator_load
# flags (e.g. "--checkpoint-kib 4096"); CLUSTERIZE another clusterize binary to measure (default
# CAIRN_BUILD_DIR's); COORDINATOR_CPUS and LOAD_CPUS pin the two (below). Everything listens on
# 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${CAIRN_BUILD_DIR:-build}
out=${OUT:-/tmp/coordinator_load}
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(100 1000 5000)
clusterize=${CLUSTERIZE:-$build/clusterize/clusterize}
for b in "$clusterize" "$build/tools/bench/coordinator_load"; do
  [[ -x $b ]] || { echo "coordinator_load.sh: $b is not built" >&2; exit 2; }
done
mkdir -p "$out/data"
/usr/bin/python3 examples/fashion_mnist/make_model.py --out "$out/data/model.pt" >/dev/null
/usr/bin/python3 - "$out/data" <<'PY'
import gzip, json, os, sys
import numpy as np
folder = sys.argv[1]
src = "/usr/share/datasets/fashion-mnist"
def idx(name, offset):
    with gzip.open(os.path.join(src, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)
def shards(prefix, idx_name, count, per):
    d = os.path.join(folder, prefix)
    os.makedirs(d, exist_ok=True)
    x = idx(f"{idx_name}-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
    y = idx(f"{idx_name}-labels-idx1-ubyte.gz", 8).astype(np.int64)
    for k in range(count):
        rows = slice(k * per, (k + 1) * per)
        arrays = {"inputs": ("F32", ((x[rows].astype(np.float32) / 255.0 - 0.2860) / 0.3530).astype(np.float32)),
                  "targets": ("I64", y[rows])}
        header, blobs, off = {}, [], 0
        for name, (dt, a) in arrays.items():
            b = np.ascontiguousarray(a).tobytes()
            header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        text = json.dumps(header).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        with open(os.path.join(d, f"{prefix}_{k}.safetensors"), "wb") as f:
            f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
shards("train", "train", 16, 600)
shards("test", "t10k", 2, 300)
job = {"format": 1, "job_id": "coordinator_load", "driver": "cairn", "model": os.path.join(folder, "model.pt"),
       "data": {"location": os.path.join(folder, "train"), "test_location": os.path.join(folder, "test"),
                "format": "safetensors", "source": os.environ.get("DATA_SOURCE", "coordinator")},
       "training_definition": {"batch_size": 32, "microbatches": 2, "epochs": 0, "max_steps": 1000000,
                               "seed": 1, "optimizer": {"name": "adamw", "lr": 0.003},
                               "timeouts": {"startup_s": 60, "peer_s": 60}}}
json.dump(job, open(os.path.join(folder, "job.json"), "w"))
PY
# DATA_SOURCE=local: the job's data is not served (no chunk requests: heartbeats, metrics and
# checkpoints only). COORDINATOR_CPUS / LOAD_CPUS (taskset lists, e.g. 0 and 1): the coordinator, every thread of it,
# on those CPUs only, the load generator on the others, so "on one core" is measured as such and
# neither steals the other's core.
load=("$build/tools/bench/coordinator_load")
if [[ -n ${COORDINATOR_CPUS:-} ]]; then
  printf '#!/bin/sh\nexec taskset -c %s %q "$@"\n' "$COORDINATOR_CPUS" "$(realpath "$clusterize")" > "$out/clusterize_pinned"
  chmod +x "$out/clusterize_pinned"
  clusterize=$out/clusterize_pinned
fi
[[ -z ${LOAD_CPUS:-} ]] || load=(taskset -c "$LOAD_CPUS" "${load[@]}")
failed=0
for n in "${sizes[@]}"; do
  echo "== $n simulated volunteers"
  # shellcheck disable=SC2086  # LOAD_ARGS is a list of flags
  "${load[@]}" --clusterize "$clusterize" \
    --model "$out/data/model.pt" --job "$out/data/job.json" --work "$out/run_$n" \
    --volunteers "$n" --placed "${PLACED:-0}" --measure-s "${MEASURE_S:-60}" \
    --json "$out/coordinator_load_$n.json" ${LOAD_ARGS:-} ||
    { echo "coordinator_load: size $n did not run to its end (see above)"; failed=1; }
done
exit "$failed"
