#!/usr/bin/env bash
# The Fashion-MNIST CNN trained by volunteers who join by invite, on this machine, and one of them
# lost mid-run: a coordinator (clusterize --serve --lost-after-s 5) prints an invite; 4 volunteers
# (provider --join) join with it, each with its own work folder, key and port; the coordinator plans
# a 3-stage pipeline on the first 3, sends each its stage, and keeps the 4th waiting as a spare.
# Once the coordinator has acknowledged a checkpoint of the middle stage (the Stem), its volunteer
# is SIGKILLed; the coordinator sees its connections closed (or, with CAIRN_GONE_AFTER_S=0, stops
# hearing it), gives its node to the spare with that checkpoint,
# tells the neighbours, and the pipeline resumes from the newest common checkpoint. The coordinator
# merges the uploaded trained stages into trained.pt; PyTorch evaluates it and must find exactly
# the accuracy the Leaf reported; coordinator.db must give the node to the spare's key.
#   examples/fashion_mnist/run_volunteers.sh [--short]   (tools/demo.sh --volunteers)
#   CAIRN_WEB=8080 examples/fashion_mnist/run_volunteers.sh   also serves the live page at
#                                                         http://127.0.0.1:8080/ (clusterize --web)
# No sleep stands in for synchronisation: each step polls the coordinator's log or a volunteer's
# file for the line that says the previous one happened, with a time limit and a message naming it.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${CAIRN_BUILD_DIR:-build}
OUT=${CAIRN_EXAMPLE_OUT:-node_data/fashion_mnist_volunteers}
PY=/usr/bin/python3
# PyTorch checks the providers here to the last bit: one BLAS thread as they use (docs/TRAINING.md
# "Reproducibility").
export OPENBLAS_NUM_THREADS=1
LOST_AFTER_S=${CAIRN_LOST_AFTER_S:-5}
# A volunteer whose connections to the coordinator all closed (the killed Stem) is lost after this
# many seconds (clusterize --gone-after-s; 0: only after LOST_AFTER_S of silence).
GONE_AFTER_S=${CAIRN_GONE_AFTER_S:-3}
start=$(date +%s)
rm -rf "$OUT"
mkdir -p "$OUT"
JOB=examples/fashion_mnist/job.json
# Checkpoints every CKPT steps (uploaded to the coordinator: what the spare resumes from); the
# Stem is killed once the coordinator holds one of step >= KILL_AFTER.
CKPT=100 KILL_AFTER=300
if [[ "${1:-}" == "--short" ]]; then
  $PY examples/fashion_mnist/short_job.py "$JOB" "$OUT/job_short.json"
  JOB=$OUT/job_short.json
  CKPT=10 KILL_AFTER=10
fi
# peer_timeout_s 2: the killed volunteer's neighbours pause 2 s after its connections drop.
$PY - "$JOB" "$OUT/job.json" "$CKPT" <<'PYEOF'
import json, sys
job = json.load(open(sys.argv[1]))
t = job["training_definition"]
t["checkpoint_every"] = int(sys.argv[3])
t.setdefault("timeouts", {})["peer_timeout_s"] = 2
json.dump(job, open(sys.argv[2], "w"), indent=2)
PYEOF
JOB=$OUT/job.json
LOG=$OUT/coordinator.log
# Loopback ports: one for the coordinator, one per volunteer, each with the port above it free
# too (a volunteer on --listen's port P also answers on P + 1, where volunteers behind routers
# connect). They come from below the kernel's ephemeral range, held for this script's life
# (tools/bench/loopback_ports.py): ports the kernel handed out (bind to port 0) left P + 1 to
# chance, and a suite run once found it taken by another test's connection, so that volunteer
# joined as dial-out only and could not take over the reachable Stem.
BASE=$($PY tools/bench/loopback_ports.py 10)
PORTS=("$BASE" $((BASE + 2)) $((BASE + 4)) $((BASE + 6)) $((BASE + 8)))
pids=()
vpid=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
fail() {
  tail -20 "$LOG" 2>/dev/null || true
  echo "volunteers: FAILED: $*"
  exit 1
}
# wait_for WHAT SECONDS COMMAND...: polls COMMAND (a look at a log or a file) until it succeeds;
# fails naming WHAT after SECONDS, or at once if the coordinator has exited.
wait_for() {
  local what=$1 limit=$2
  shift 2
  local deadline=$(( $(date +%s) + limit ))
  until "$@"; do
    kill -0 "$coordinator" 2>/dev/null || fail "the coordinator exited while waiting for $what"
    (( $(date +%s) < deadline )) || fail "no $what after $limit s"
    sleep 0.2
  done
}
in_log() { grep -q -- "$1" "$LOG"; }
log_line() { grep -m1 -- "$1" "$LOG" | sed 's/^20[0-9-]* [0-9:.]* [A-Z] //'; }
name_of() { sed -n 's/.*"name": *"\([^"]*\)".*/\1/p' "$OUT/volunteer_$1/membership.json" 2>/dev/null; }
acked() {  # the coordinator holds a checkpoint of $STEM of step >= KILL_AFTER
  grep -o "coordinator: checkpoint of $STEM at step [0-9]*" "$LOG" | awk -v k="$KILL_AFTER" \
    '$NF >= k { found = 1 } END { exit !found }'
}
volunteer() {  # volunteer I: provider --join INVITE in its own folder (dial-out only: no --listen)
  local listen=(--listen "127.0.0.1:${PORTS[$1]}")
  [[ "${2:-}" == dial-out ]] && listen=()
  "$BUILD_DIR/node/provider" --join "$INVITE" "${listen[@]}" \
    --workdir "$OUT/volunteer_$1" > "$OUT/volunteer_$1.log" 2>&1 &
  vpid[$1]=$!
  pids+=("$!")
}

echo "volunteers: 1/5 make the model"
$PY examples/fashion_mnist/make_model.py --out "$OUT/model.pt"
echo "volunteers: 2/5 the coordinator: profile the model, print the invite, wait for 3 volunteers"
# --cuts 7,14 (conv block 1 | conv block 2 | classifier): volunteers on one machine all have the
# whole machine's memory, and the planner would keep this small CNN in one piece on one of them.
"$BUILD_DIR/clusterize/clusterize" --model "$OUT/model.pt" --job "$JOB" --clusters 1 --cuts 7,14 \
  --input-shape 32,1,28,28 --serve "127.0.0.1:${PORTS[0]}" --min-volunteers 3 --gather-s 0 \
  --lost-after-s "$LOST_AFTER_S" --gone-after-s "$GONE_AFTER_S" --invite-file "$OUT/invite.txt" --out "$OUT/coordinator" \
  ${CAIRN_WEB:+--web "$CAIRN_WEB"} > "$LOG" 2>&1 &
coordinator=$!
pids+=("$coordinator")
wait_for "invite" 120 test -s "$OUT/invite.txt"
INVITE=$(cat "$OUT/invite.txt")
if [[ -n "${CAIRN_WEB:-}" ]]; then
  echo "volunteers: watch the run at $(sed -n 's/^web view: //p' "$LOG")"
fi
echo "volunteers: invite $INVITE"
echo "volunteers: 3/5 four volunteers join (each: provider --join INVITE --listen 127.0.0.1:PORT);"
echo "volunteers:     the coordinator plans on the first 3 and keeps the 4th as a spare"
# CAIRN_EXAMPLE_SPARE_DIAL_OUT=1 (tools/bench/replace_after_kill.sh --spares): the 4th joins once
# the plan is made, without --listen: a dial-out-only spare, which takes the reachable Stem over by
# turning its links around (docs/OPERATIONS.md "Behind a home router").
if [[ -n "${CAIRN_EXAMPLE_SPARE_DIAL_OUT:-}" ]]; then
  for i in 1 2 3; do volunteer "$i"; done
else
  for i in 1 2 3 4; do volunteer "$i"; done
fi
wait_for "'planned 1 cluster(s) on 3 volunteers' in $LOG" 180 in_log "planned 1 cluster(s) on 3 volunteers"
[[ -n "${CAIRN_EXAMPLE_SPARE_DIAL_OUT:-}" ]] && volunteer 4 dial-out
read -r ROOT STEM LEAF <<<"$($PY -c "import json, sys
print(' '.join(json.load(open(sys.argv[1]))['clusters'][0]['chain']))" "$OUT/coordinator/plan.json")"
all_members() { for i in 1 2 3 4; do [[ -n "$(name_of "$i")" ]] || return 1; done; }
wait_for "membership.json of all 4 volunteers" 120 all_members
victim='' spare='' leaf_dir=''
for i in 1 2 3 4; do
  case "$(name_of "$i")" in
    "$STEM") victim=$i ;;
    "$LEAF") leaf_dir=$OUT/volunteer_$i ;;
    "$ROOT") ;;
    *) spare=$i ;;
  esac
done
[[ -n "$victim" && -n "$spare" && -n "$leaf_dir" ]] || fail "the volunteers' membership.json files do not \
name $ROOT, $STEM, $LEAF and one spare"
SPARE=$(name_of "$spare")
wait_for "'joined: $SPARE … spare' in $LOG" 30 in_log "coordinator: joined: $SPARE .*, spare"
echo "volunteers: cluster 0: $ROOT (Root) → $STEM (Stem, volunteer $victim) → $LEAF (Leaf); spare: $SPARE (volunteer $spare)"

echo "volunteers: 4/5 kill the Stem's volunteer once the coordinator holds a checkpoint of step >= $KILL_AFTER"
wait_for "checkpoint of $STEM at step >= $KILL_AFTER acknowledged in $LOG" 600 acked
kill -KILL "${vpid[$victim]}"
killed_at=$(date +%s.%N)
wait "${vpid[$victim]}" 2>/dev/null || true
echo "volunteers: SIGKILLed volunteer $victim ($STEM, the Stem) after: $(grep -o \
  "coordinator: checkpoint of $STEM at step [0-9]* ([0-9]* bytes)" "$LOG" | tail -1)"
wait_for "'lost: $STEM' in $LOG" $(( LOST_AFTER_S + 60 )) in_log "coordinator: lost: $STEM "
echo "volunteers: $(log_line "coordinator: lost: $STEM ")"
wait_for "'$STEM is taken over by spare $SPARE' in $LOG" 60 in_log "coordinator: $STEM is taken over by spare $SPARE "
echo "volunteers: $(log_line "coordinator: $STEM is taken over by spare $SPARE ")"
SPARE_METRICS=$OUT/volunteer_$spare/node_data/nodes/$STEM/metrics.jsonl
first_step() { grep -v '^{"eval"' "$SPARE_METRICS" 2>/dev/null | grep -m1 -o '"step":[0-9]*'; }
has_first_step() { first_step > /dev/null; }
wait_for "first step of the spare (a step record in $SPARE_METRICS)" 300 has_first_step
echo "volunteers: the spare ($SPARE, now $STEM) trained its first step (${STEM}'s $(first_step | tr -d '"' | tr ':' ' ')) \
$($PY -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$killed_at") s after the kill"

echo "volunteers: 5/5 the run goes on to the end; the trained model comes back to the coordinator"
status=0
wait "$coordinator" || status=$?
grep -v "^20..-" "$LOG" | sed -n '/eval accuracy/,$p' || true
if [[ $status -ne 0 ]]; then
  tail -20 "$LOG"
  echo "volunteers: the coordinator exited $status"
  exit $status
fi
for i in 1 2 3 4; do
  [[ $i == "$victim" ]] && continue
  code=0
  wait "${vpid[$i]}" || code=$?
  [[ $code -eq 0 ]] || { tail -5 "$OUT/volunteer_$i.log"; echo "volunteers: volunteer $i exited $code"; exit 1; }
done
# Checks, in the demo as in the suite: coordinator.db gives the node to the spare's key and keeps
# the lost key as <name>-lost-1; the Leaf resumed from a checkpoint; the merged trained.pt
# evaluated by PyTorch has exactly the accuracy the Leaf reported.
$PY - "$OUT" "$JOB" "$STEM" "$LEAF" "$leaf_dir" "$OUT/volunteer_$spare" "$start" <<'PYEOF'
import json, os, sqlite3, sys
import time
out, job_path, stem, leaf, leaf_dir, spare_dir, start = sys.argv[1:]
def fail(message):
    sys.exit("volunteers: FAILED: " + message)
db = sqlite3.connect(os.path.join(out, "coordinator", "coordinator.db"))
spare_key = open(os.path.join(spare_dir, "identity.key")).read()
row = db.execute("SELECT public_key, state FROM members WHERE name = ?", (stem,)).fetchone()
if row is None or row[0] not in spare_key or row[1] != "done":
    fail(f"coordinator.db: {stem} is {row}, expected the spare's key and state done")
lost = db.execute("SELECT name, state FROM members WHERE name LIKE ?", (stem + "-lost-%",)).fetchall()
if lost != [(stem + "-lost-1", "lost")]:
    fail(f"coordinator.db: the lost volunteer's rows are {lost}, expected [({stem}-lost-1, lost)]")
records = [json.loads(l) for l in open(os.path.join(leaf_dir, "node_data", "nodes", leaf, "metrics.jsonl"))]
resumed = [r["resumed_from"] for r in records if "resumed_from" in r]
if not resumed or resumed[-1] <= 0:
    fail(f"the Leaf {leaf} did not resume from a checkpoint (resumed_from records: {resumed})")
print(f"volunteers: coordinator.db: {stem} belongs to the spare's key (done), the killed volunteer's "
      f"row is {lost[0][0]} ({lost[0][1]}); the pipeline resumed from step {resumed[-1]}")

sys.path.insert(0, "examples/fashion_mnist")
from merged_accuracy import merged_accuracies  # run_nat.py's check too
r, accuracies = merged_accuracies(os.path.join(out, "coordinator", "run_result.json"), job_path)
for c, accuracy in accuracies:
    e = c["eval"]
    n = e["samples"]
    if abs(accuracy - e["accuracy"]) > 1e-9:
        fail(f"the merged {r['trained_torchscript']} evaluates to {accuracy} in PyTorch, the Leaf "
             f"reported {e['accuracy']}")
    print(f"volunteers: the merged model evaluated by PyTorch: {100 * accuracy:.2f}%, exactly the "
          f"Leaf's figure")
    print(f"volunteers: cluster {c['cluster']}: final test accuracy {100 * e['accuracy']:.2f}% on "
          f"{n} Fashion-MNIST test images after {c['steps']} steps")
print(f"volunteers: trained model {r['trained_torchscript']} and {r['trained_safetensors']} "
      f"({time.time() - int(start):.0f} s in all)")
PYEOF
