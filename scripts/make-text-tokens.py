#!/usr/bin/env python3
"""Tokenizes real text into a memplan token file (agent/io/token_file.h), for loss curves on text
rather than the synthetic stream.

    scripts/make-text-tokens.py --out FILE [--vocab 8192] [CORPUS ...]

CORPUS defaults to text that every Debian 12 Python ships: pydoc's topic help
(pydoc_data/topics.py, ~750 KB of English documentation) and the licence texts under
/usr/share/common-licenses. A byte-level BPE tokenizer with --vocab entries is trained on the
corpus (Hugging Face `tokenizers`, deterministic for a given corpus) and saved next to FILE as
FILE.tokenizer.json; the token ids go to FILE with the MPTOKENS header (uint16 ids).
"""
import argparse
import glob
import os
import struct
import sys

import pydoc_data.topics


def default_corpus():
    texts = [("pydoc_data/topics", "\n\n".join(pydoc_data.topics.topics.values()))]
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append((path, f.read()))
    return texts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="token file to write")
    parser.add_argument("--vocab", type=int, default=8192,
                        help="BPE vocabulary size, 256..65536 (default 8192)")
    parser.add_argument("corpus", nargs="*", help="text files (default: see --help)")
    args = parser.parse_args()
    if not 256 <= args.vocab <= 65536:
        sys.exit(f"--vocab must be in [256, 65536], got {args.vocab}")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if args.corpus:
        texts = []
        for path in args.corpus:
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append((path, f.read()))
    else:
        texts = default_corpus()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((t for _, t in texts), trainer=trainer)
    ids = []
    for _, text in texts:
        ids.extend(tokenizer.encode(text).ids)
    vocab = tokenizer.get_vocab_size()
    with open(args.out, "wb") as f:
        f.write(b"MPTOKENS" + struct.pack("<IIQQ", 1, 2, len(ids), vocab))
        f.write(struct.pack(f"<{len(ids)}H", *ids))
    tokenizer.save(args.out + ".tokenizer.json")
    chars = sum(len(t) for _, t in texts)
    print(f"{args.out}: {len(ids)} tokens, vocab {vocab}, from {len(texts)} texts "
          f"({chars} characters, {chars / max(len(ids), 1):.2f} per token)")


if __name__ == "__main__":
    main()
