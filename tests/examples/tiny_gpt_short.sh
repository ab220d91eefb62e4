#!/usr/bin/env bash
# example.tiny_gpt_short: the tiny GPT's short run (2 clusters x 2 nodes averaging over rings). The
# run ends with a parameter average, so BOTH clusters must report a validation loss, and the two
# must be the same value: one cluster missing, or two different losses, fails.
set -euo pipefail
out=$("$(dirname "$0")/../../examples/tiny_gpt/run.sh" --short)
echo "$out"
reports=$(echo "$out" | grep -c '^tiny_gpt: cluster [01] .*validation loss' || true)
clusters=$(echo "$out" | grep -o '^tiny_gpt: cluster [0-9]*' | sort -u | wc -l)
values=$(echo "$out" | grep -o 'validation loss [0-9.]*' | sort -u | wc -l)
if [[ "$reports" -ne 2 || "$clusters" -ne 2 ]]; then
  echo "example.tiny_gpt_short: expected a validation loss from cluster 0 and cluster 1, got $reports report(s) from $clusters cluster(s)" >&2
  exit 1
fi
if [[ "$values" -ne 1 ]]; then
  echo "example.tiny_gpt_short: the clusters end with different validation losses ($values distinct values)" >&2
  exit 1
fi
echo "example.tiny_gpt_short: both clusters report validation loss $(echo "$out" | grep -o 'validation loss [0-9.]*' | head -1 | cut -d' ' -f3)"
