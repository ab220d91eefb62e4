#!/usr/bin/python3
"""The checks of ctest example.subword_gpt_short, after examples/subword_gpt/run.sh [--short]:

1. The text: the training and validation verses together are exactly the verses `bible` prints
   (as a multiset), and the validation part is 3-8 % of them.
2. The shards: read by lm.read_shard (not make_data.py's writer, not cairn's reader), every shard
   ends with </s>, every id is below the vocabulary size, and the verses between </s> ids are, in
   order, exactly Debian's `spm_encode --output_format=id` of corpus/train.txt and corpus/val.txt,
   and `spm_decode` of them gives those lines back.
3. cairn's evaluation: every cluster's Leaf reports the same loss on as many blocks as the
   validation blocks, and lm.perplexity of the merged trained.pt on those blocks equals the Leaf's
   perplexity (relative 1e-4: float32 sums in a different order).
4. Training happened: the perplexity of trained.pt and of reference.pt is below the untrained
   model.pt's and below the vocabulary size (a uniform guess).

    /usr/bin/python3 examples/subword_gpt/check.py OUT
"""
import collections
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the example

import torch

import lm
import report

failures = []


def check(ok, what):
    print(f"check: {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def spm(tool, model, text):
    return subprocess.run([tool, f"--model={model}"] + (["--output_format=id"] if tool == "spm_encode" else
                                                       ["--input_format=id"]),
                          input=text, capture_output=True, text=True, check=True).stdout.splitlines()


def main():
    out = sys.argv[1]
    job = json.load(open(os.path.join(out, "job.json.in")))
    model = os.path.join(out, "tokenizer.model")
    eos, vocab = 2, json.load(open(os.path.join(out, "data.json")))["vocab"]

    # 1. the text
    bible = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], capture_output=True, text=True, check=True).stdout
    verses = [" ".join(line.split(" ", 1)[1].split()) for line in bible.splitlines()]
    text = {s: open(os.path.join(out, "corpus", f"{s}.txt")).read().splitlines() for s in ("train", "val")}
    check(collections.Counter(verses) == collections.Counter(text["train"] + text["val"]),
          f"train.txt + val.txt hold exactly the {len(verses)} verses `bible` prints")
    check(0.03 <= len(text["val"]) / len(verses) <= 0.08, f"validation: {len(text['val'])} of {len(verses)} verses")

    # 2. the shards
    for split in ("train", "val"):
        folder = os.path.join(out, "shards", split)
        ids = [int(t) for p in lm.shard_paths(folder) for t in lm.read_shard(p)]
        check(all(0 <= t < vocab for t in ids), f"{split} shards: {len(ids)} ids, all below {vocab}")
        ends = [p for p in lm.shard_paths(folder) if int(lm.read_shard(p)[-1]) != eos]
        check(not ends, f"{split} shards all end with </s> (not: {ends})")
        rows, row = [], []
        for t in ids:
            if t == eos:
                rows.append(" ".join(map(str, row)))
                row = []
            else:
                row.append(t)
        lines = text[split]
        check(rows == spm("spm_encode", model, "".join(x + "\n" for x in lines)),
              f"{split} shards = spm_encode of corpus/{split}.txt ({len(rows)} verses)")
        check(spm("spm_decode", model, "".join(r + "\n" for r in rows)) == lines,
              f"spm_decode of the {split} shards = corpus/{split}.txt")

    # 3. cairn's evaluation against PyTorch's on the merged model
    torch.set_num_threads(1)
    val = lm.validation_blocks(out, job)
    evals = list(report.leaf_evals(out))
    check(len(evals) == 2 and len({e["loss"] for _, _, e in evals}) == 1,
          f"{len(evals)} clusters' Leaves report one validation loss: {[e['loss'] for _, _, e in evals]}")
    check(all(e["samples"] == len(val) for _, _, e in evals),
          f"the Leaves evaluated {[e['samples'] for _, _, e in evals]} blocks, the validation blocks are {len(val)}")
    ppl = {f: lm.perplexity(torch.jit.load(os.path.join(out, f)), val)[1]
           for f in ("model.pt", "trained.pt", "reference.pt")}
    leaf = evals[0][2]["perplexity"]
    check(abs(ppl["trained.pt"] - leaf) <= 1e-4 * leaf,
          f"PyTorch perplexity of trained.pt {ppl['trained.pt']:.5f} = the Leaf's {leaf:.5f}")

    # 4. training happened
    for f in ("trained.pt", "reference.pt"):
        check(ppl[f] < ppl["model.pt"] and ppl[f] < vocab,
              f"{f} perplexity {ppl[f]:.2f} < untrained {ppl['model.pt']:.2f} and < vocabulary {vocab}")
    if failures:
        sys.exit(f"example.subword_gpt_short: {len(failures)} check(s) failed")
    print("example.subword_gpt_short: every check holds")


if __name__ == "__main__":
    main()
