#!/usr/bin/env python3
"""Tokenizes text or chat data with a model's own Hugging Face tokenizer into a memplan token file
(agent/io/token_file.h: the MPTOKENS header, then uint16 or uint32 ids), for
`memplan-agent train --model DIR --data FILE`.

    .venv/bin/python scripts/prepare-data.py --model DIR --out FILE INPUT ...

INPUT: a .jsonl file, one JSON object per line, either {"text": "..."} or {"messages": [{"role":
"user", "content": "..."}, ...]} (rendered with the tokenizer's chat template,
apply_chat_template), or any other file, read as one plain-text document. Documents are
concatenated, each followed by the tokenizer's EOS token (--no-eos: none), as the agent's batcher
cuts windows across them. Ids are 2 bytes when the vocabulary fits (<= 65536), else 4; the header's
vocabulary is config.json's vocab_size when DIR has one (every id is checked below it), else the
tokenizer's length. Needs transformers (AutoTokenizer.from_pretrained(DIR)); nothing is downloaded.
"""
import argparse
import array
import json
import os
import struct
import sys

MAGIC = b"MPTOKENS"
VERSION = 1


def documents(path, fmt):
    """Yields ("text", str) or ("chat", messages) for each document of `path`."""
    is_jsonl = fmt != "text" and (fmt in ("jsonl", "chat") or path.endswith(".jsonl"))
    if not is_jsonl:
        with open(path, encoding="utf-8") as f:
            yield "text", f.read()
        return
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not JSON: {e}")
            if isinstance(record, dict) and isinstance(record.get("messages"), list):
                yield "chat", record["messages"]
            elif isinstance(record, dict) and isinstance(record.get("text"), str):
                yield "text", record["text"]
            else:
                sys.exit(f'{path}:{number}: need {{"text": str}} or {{"messages": [...]}}')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--out", required=True, help="token file to write")
    parser.add_argument("--format", choices=["auto", "text", "jsonl"], default="auto",
                        help="auto: .jsonl files are JSON lines, others plain text")
    parser.add_argument("--no-eos", action="store_true", help="no EOS token after each document")
    parser.add_argument("inputs", nargs="+", help="text or JSON-lines files")
    args = parser.parse_args()
    try:
        from transformers import AutoTokenizer
    except ImportError:
        sys.exit(f"prepare-data.py needs the transformers package, which {sys.executable} lacks: "
                 "install it into that environment (pip install transformers) or run the script "
                 "with a Python that has it")
    if not os.path.isdir(args.model):
        sys.exit(f"--model {args.model}: not a directory")
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    vocab = len(tokenizer)
    config_path = os.path.join(args.model, "config.json")
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        vocab = int(config.get("text_config", config).get("vocab_size", vocab))
    eos = None if args.no_eos else tokenizer.eos_token_id

    ids = array.array("I")
    n_docs = n_chat = 0
    for path in args.inputs:
        for kind, doc in documents(path, args.format):
            if kind == "chat":
                if not getattr(tokenizer, "chat_template", None):
                    sys.exit(f"{path}: chat records, but the tokenizer of {args.model} has no "
                             "chat template")
                # The rendered text already holds the template's special tokens.
                text = tokenizer.apply_chat_template(doc, tokenize=False)
                doc_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                n_chat += 1
            else:
                doc_ids = tokenizer(doc)["input_ids"]
            ids.extend(doc_ids)
            if eos is not None and (not doc_ids or doc_ids[-1] != eos):
                ids.append(eos)
            n_docs += 1
    if not ids:
        sys.exit("no tokens: the inputs are empty")
    top = max(ids)
    if top >= vocab:
        sys.exit(f"token id {top} is outside the model's vocabulary ({vocab} ids, config.json)")
    token_bytes = 2 if vocab <= 65536 else 4
    out_ids = array.array("H", ids) if token_bytes == 2 else ids
    if sys.byteorder != "little":
        out_ids.byteswap()
    with open(args.out, "wb") as f:
        f.write(MAGIC + struct.pack("<IIQQ", VERSION, token_bytes, len(ids), vocab))
        out_ids.tofile(f)
    print(f"{args.out}: {len(ids)} tokens from {n_docs} documents ({n_chat} chats), "
          f"vocab {vocab}, {token_bytes} bytes per token, tokenizer of {args.model}")


if __name__ == "__main__":
    main()
