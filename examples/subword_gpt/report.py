#!/usr/bin/python3
"""Prints the subword GPT's figures after run.sh: validation perplexity of the untrained model, of
cairn's merged model (trained.pt) and of the one-process reference (reference.pt), all three
measured by the same function (lm.perplexity) on the same validation blocks, next to the
perplexity each cluster's Leaf reported, the tokens each run trained on, the wall times, and a
sample of each trained model decoded by SentencePiece.

    /usr/bin/python3 examples/subword_gpt/report.py OUT
"""
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the example

import sentencepiece as spm
import torch

import lm


def leaf_evals(out):
    plan = json.load(open(os.path.join(out, "plan.json")))
    for c in plan["clusters"]:
        leaf = c["chain"][-1]
        yield c["index"], c["chain"], json.load(open(os.path.join(out, "nodes", leaf, "result.json")))["eval"]


def main():
    out = sys.argv[1]
    job = json.load(open(os.path.join(out, "job.json.in")))
    td, block = job["training_definition"], job["data"]["block_length"]
    plan = json.load(open(os.path.join(out, "plan.json")))
    clusters = len(plan["clusters"])
    timings = json.load(open(os.path.join(out, "timings.json")))
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "tokenizer.model"))
    torch.set_num_threads(1)
    val = lm.validation_blocks(out, job)
    tokens = clusters * td["max_steps"] * td["batch_size"] * block
    print(f"subword_gpt: vocabulary {sp.get_piece_size()}, validation {len(val)} blocks x {block} tokens; "
          f"each run trained on {tokens} tokens ({clusters} x {td['max_steps']} steps x "
          f"{td['batch_size']} x {block} for cairn, {td['max_steps']} steps x {clusters * td['batch_size']} "
          f"x {block} for the reference)")
    for index, chain, e in leaf_evals(out):
        print(f"subword_gpt: cluster {index} ({' -> '.join(chain)}): Leaf reports validation loss "
              f"{e['loss']:.4f}, perplexity {e['perplexity']:.2f} on {e['samples']} blocks")
    rows = [("untrained model.pt", "model.pt", None),
            ("cairn, 2 clusters (trained.pt)", "trained.pt", timings["cairn_s"]),
            ("PyTorch, one process (reference.pt)", "reference.pt", timings["reference_s"])]
    models = {}
    for name, file, seconds in rows:
        models[file] = torch.jit.load(os.path.join(out, file))
        loss, ppl = lm.perplexity(models[file], val)
        wall = f", {seconds:.0f} s" if seconds is not None else ""
        print(f"subword_gpt: {name:37s} validation loss {loss:.4f}, perplexity {ppl:8.2f}{wall}")
    for file in ("trained.pt", "reference.pt"):
        print(f"subword_gpt: a sample from {file}: {lm.sample(models[file], sp, 'And God said', block=block)}")


if __name__ == "__main__":
    main()
