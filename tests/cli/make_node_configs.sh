#!/usr/bin/env bash
# make_node_configs merges probe entries into a file that clusterize's reader accepts, keeps given
# ids, numbers the rest, and rejects duplicate IPs and bad values with exit 2.
set -euo pipefail
TOOL=$1; CLUSTERIZE=$2
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
echo '{"IP":"127.0.0.1:6000","benchmarks":{"ram":3,"bandwidth":100,"compute":20,"cores":2}}' > "$d/a.json"
echo '{"7":{"IP":"127.0.0.1:6001","benchmarks":{"ram":4,"bandwidth":100}}}' > "$d/b.json"
"$TOOL" "$d/a.json" "$d/b.json" -o "$d/nc.json"
# clusterize must accept the merged file and plan on both nodes (a tiny real model).
/usr/bin/python3 -c "import torch; torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))).save('$d/m.pt')"
out=$("$CLUSTERIZE" --model "$d/m.pt" --nodes "$d/nc.json" --input-shape 2,4 --out "$d/node_data")
grep -q "node_0" <<<"$out" || { echo "node_0 missing: $out"; exit 1; }
grep -q "node_7" <<<"$out" || { echo "node_7 missing: $out"; exit 1; }
[[ -f "$d/node_data/nodes/node_7/node.json" || -f "$d/node_data/nodes/node_0/node.json" ]] || { echo "no node_data written"; exit 1; }
echo '{"IP":"127.0.0.1:6000","benchmarks":{"ram":3,"bandwidth":100}}' > "$d/dup.json"
set +e
err=$("$TOOL" "$d/a.json" "$d/dup.json" 2>&1 >/dev/null); rc=$?
set -e
[[ $rc -eq 2 ]] || { echo "duplicate IP: expected exit 2, got $rc"; exit 1; }
grep -q "IP 127.0.0.1:6000 is already used" <<<"$err" || { echo "unexpected: $err"; exit 1; }
echo ok
