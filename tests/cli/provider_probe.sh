#!/usr/bin/env bash
# provider --probe prints an entry that make_node_configs accepts; a bad --peer is exit 2.
set -euo pipefail
PROVIDER=$1; MAKE=$2
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
"$PROVIDER" --probe --probe-megabytes 4 --address 127.0.0.1:5999 > "$d/entry.json"
"$MAKE" "$d/entry.json" -o "$d/nc.json"
grep -q '"IP": "127.0.0.1:5999"' "$d/nc.json" || { cat "$d/nc.json"; exit 1; }
set +e
err=$("$PROVIDER" --probe --peer nowhere 2>&1); rc=$?
set -e
[[ $rc -eq 2 ]] || { echo "bad --peer: expected exit 2, got $rc"; exit 1; }
grep -q -- "--peer must be host:port" <<<"$err" || { echo "unexpected: $err"; exit 1; }
echo ok
