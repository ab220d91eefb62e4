#!/usr/bin/python3
"""The subword GPT's data: the King James Bible (Debian's bible-kjv-text, read through its `bible`
program), split by chapter into training and validation text, a SentencePiece BPE tokenizer
trained on the training text only, and the token ids written as llm.c uint16 shards (cairn's
`tokens` format).

    /usr/bin/python3 examples/subword_gpt/make_data.py --out DIR [--vocab 4000] [--shards 4]

Writes under DIR:
  corpus/train.txt, corpus/val.txt   one verse per line, in shard order (the text the shards hold)
  tokenizer.model, tokenizer.vocab   spm_train --model_type=bpe --vocab_size=V --random_seed=0
  shards/train/train_NN.bin          training chapters dealt round robin to --shards files
  shards/val/val_00.bin              validation chapters: every --val-every'th chapter
  data.json                          counts (chapters, verses, tokens per shard)

Every verse is encoded on its own and followed by the end-of-sequence id (</s>), so a shard is a
stream of verses. Shard layout (llm.c, what cairn's TokenDataset reads): 256 little-endian int32 of
header (magic 20240520, version 1, token count), then the token ids as little-endian uint16.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np
import sentencepiece as spm

MAGIC, VERSION = 20240520, 1
VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def read_bible():
    """[(book, chapter, [verse text, ...]), ...] in canonical order, from the `bible` program."""
    try:
        out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], check=True, capture_output=True,
                             text=True).stdout
    except FileNotFoundError:
        sys.exit("make_data: the `bible` program is missing (Debian package bible-kjv; tools/setup.sh installs it)")
    chapters = []
    for n, line in enumerate(out.splitlines(), 1):
        m = VERSE.match(line)
        if not m:
            sys.exit(f"make_data: bible output line {n} is not `<Book><chapter>:<verse> <text>`: {line[:60]!r}")
        book, chapter, text = m.group(1), int(m.group(2)), " ".join(m.group(4).split())
        if not chapters or chapters[-1][:2] != (book, chapter):
            chapters.append((book, chapter, []))
        chapters[-1][2].append(text)
    return chapters


def write_shard(path, ids):
    header = np.zeros(256, dtype="<i4")
    header[:3] = [MAGIC, VERSION, len(ids)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(ids, dtype="<u2").tobytes())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--val-every", type=int, default=20, help="chapter k is validation when k %% N == N-1")
    a = p.parse_args()
    if not 300 <= a.vocab <= 65535:
        p.error("--vocab must be in [300, 65535] (uint16 shards)")
    chapters = read_bible()
    val = [c for k, c in enumerate(chapters) if k % a.val_every == a.val_every - 1]
    train = [c for k, c in enumerate(chapters) if k % a.val_every != a.val_every - 1]
    shards = [train[s::a.shards] for s in range(a.shards)]

    for d in ("corpus", "shards/train", "shards/val"):
        os.makedirs(os.path.join(a.out, d), exist_ok=True)
    train_lines = [v for shard in shards for c in shard for v in c[2]]
    val_lines = [v for c in val for v in c[2]]
    for name, lines in (("train", train_lines), ("val", val_lines)):
        with open(os.path.join(a.out, "corpus", f"{name}.txt"), "w") as f:
            f.write("".join(line + "\n" for line in lines))

    # The tokenizer sees the training text only. One thread: the merges are then the same run to run.
    prefix = os.path.join(a.out, "tokenizer")
    subprocess.run(["spm_train", f"--input={a.out}/corpus/train.txt", f"--model_prefix={prefix}",
                    f"--vocab_size={a.vocab}", "--model_type=bpe", "--character_coverage=1.0",
                    "--num_threads=1", "--random_seed=0", "--minloglevel=2"], check=True)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    eos = sp.eos_id()

    def stream(chs):
        ids = []
        for verse_ids in sp.encode([v for c in chs for v in c[2]]):
            ids += verse_ids + [eos]
        return ids

    summary = {"source": "bible-kjv-text (bible -f gen1:1-rev22:21)", "vocab": sp.get_piece_size(),
               "eos": eos, "chapters": len(chapters), "val_every": a.val_every, "train": [], "val": []}
    for s, shard in enumerate(shards):
        ids = stream(shard)
        write_shard(os.path.join(a.out, "shards/train", f"train_{s:02d}.bin"), ids)
        summary["train"].append({"file": f"shards/train/train_{s:02d}.bin", "chapters": len(shard),
                                 "verses": sum(len(c[2]) for c in shard), "tokens": len(ids)})
    ids = stream(val)
    write_shard(os.path.join(a.out, "shards/val/val_00.bin"), ids)
    summary["val"].append({"file": "shards/val/val_00.bin", "chapters": len(val),
                           "verses": len(val_lines), "tokens": len(ids)})
    with open(os.path.join(a.out, "data.json"), "w") as f:
        json.dump(summary, f, indent=2)
    tr = sum(x["tokens"] for x in summary["train"])
    print(f"make_data: {len(chapters)} chapters -> {len(train)} training ({len(train_lines)} verses, {tr} tokens "
          f"in {a.shards} shards), {len(val)} validation ({len(val_lines)} verses, {len(ids)} tokens); "
          f"BPE vocabulary {sp.get_piece_size()}")


if __name__ == "__main__":
    main()
