#!/usr/bin/env bash
# The tiny GPT's text: every license text Debian ships in /usr/share/common-licenses (present on
# every Debian system), concatenated in name order into one file.
#   examples/tiny_gpt/make_corpus.sh OUT_FILE
set -euo pipefail
out=${1:?usage: make_corpus.sh OUT_FILE}
src=/usr/share/common-licenses
[[ -d $src ]] || { echo "make_corpus: $src is missing (package base-files)" >&2; exit 2; }
find "$src" -maxdepth 1 -type f | LC_ALL=C sort | xargs cat > "$out"
echo "wrote $out: $(wc -c < "$out") bytes from $(find "$src" -maxdepth 1 -type f | wc -l) files"
