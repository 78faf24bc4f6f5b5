#!/usr/bin/env python3
"""A checkpoint memplan-agent saves from a Hugging Face model loads in transformers with the
source's tokenizer and generation config (fp32, CPU).

A tiny Llama and a byte-level BPE tokenizer are written with transformers' own save_pretrained;
scripts/prepare-data.py tokenizes text with that tokenizer into the agent's token file; the agent
trains two steps with --model and --save; transformers then loads the saved directory: the
tokenizer encodes like the source's, the generation config is the source's, and the model's loss on
a batch is finite and differs from the untrained source's (the weights are the trained ones).
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders

TEXT = ("memplan plans which parameter chunks stay on the card, which blocks recompute or offload "
        "their activations, and how fast the step will be. ") * 40


def make_source(src: pathlib.Path) -> None:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                                                eos_token="</s>")
    fast.save_pretrained(src)
    config = transformers.LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=256,
                                      bos_token_id=fast.bos_token_id,
                                      eos_token_id=fast.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(src, safe_serialization=True)
    transformers.GenerationConfig(bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                                  max_new_tokens=17, do_sample=False).save_pretrained(src)


def loss_of(model, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agent", required=True, help="memplan-agent binary")
    parser.add_argument("--prepare", required=True, help="scripts/prepare-data.py")
    parser.add_argument("--work", required=True, help="scratch directory (recreated)")
    args = parser.parse_args()
    work = pathlib.Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    src, out = work / "src", work / "trained"
    work.mkdir(parents=True)
    make_source(src)
    (work / "text.txt").write_text(TEXT)
    subprocess.run([sys.executable, args.prepare, "--model", str(src), "--out",
                    str(work / "train.tokens"), str(work / "text.txt")], check=True)
    subprocess.run([args.agent, "train", "--model", str(src), "--data", str(work / "train.tokens"),
                    "--steps", "2", "--batch", "2", "--seq", "32", "--lr", "1e-2", "--clip", "0",
                    "--device", "cpu", "--dtype", "fp32", "--save", str(out)], check=True)

    failures = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    source_tok = transformers.AutoTokenizer.from_pretrained(src)
    saved_tok = transformers.AutoTokenizer.from_pretrained(out)
    sample = "which blocks recompute their activations"
    check(saved_tok(sample)["input_ids"] == source_tok(sample)["input_ids"],
          "the saved tokenizer encodes like the source's")
    check(saved_tok.eos_token == source_tok.eos_token, "same EOS token")
    gen = json.loads((out / "generation_config.json").read_text())
    check(gen.get("max_new_tokens") == 17, "generation_config.json is the source's")
    saved = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    source = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    ids = torch.tensor([source_tok(TEXT[:200])["input_ids"][:32]])
    trained_loss, source_loss = loss_of(saved, ids), loss_of(source, ids)
    print(f"loss on a training batch: source {source_loss:.4f}, saved {trained_loss:.4f}")
    check(torch.isfinite(torch.tensor(trained_loss)).item(), "the saved model's loss is finite")
    check(trained_loss < source_loss, "the saved weights are the trained ones (lower loss)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
