#!/usr/bin/env bash
# example.subword_gpt_short: the subword GPT's short run (2 clusters x 2 nodes on BPE token shards
# of the King James Bible, then the one-process PyTorch reference), then check.py: the shards are
# Debian's spm_encode of the corpus text, PyTorch's perplexity of the merged model equals the one
# cairn's Leaves report, and both trained models beat the untrained one. No timing is asserted.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${CAIRN_EXAMPLE_OUT:-$here/node_data/subword_gpt_short}
export CAIRN_EXAMPLE_OUT=$out
"$here/examples/subword_gpt/run.sh" --short
/usr/bin/python3 "$here/examples/subword_gpt/check.py" "$out"
