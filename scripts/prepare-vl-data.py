#!/usr/bin/env python3
"""Turns image + text samples into a memplan vision-language sample file with the model's own
Hugging Face processor (AutoProcessor: the image processor resizes and patches the images, the
chat template places the image tokens), for
`memplan-agent train --model DIR --data-vl FILE` (docs/agent.md, "Vision-language data").

    python scripts/prepare-vl-data.py --model DIR --out FILE INPUT.jsonl ...

INPUT: one JSON object per line, {"images": ["a.jpg", ...], "text": "...", "response": "..."}:
the images (paths relative to the .jsonl file) and the text of the user's turn, rendered with the
processor's chat template; with "response" the assistant's turn follows and only its tokens are
scored (labels -100 on the prompt), without it every text token is. Image tokens are never scored.
--min-pixels / --max-pixels bound the resized images' area as the processor's arguments do.

FILE is one safetensors file: input_ids int64 [tokens] (the samples one after the other),
labels int64 [tokens], sample_tokens int64 [samples + 1] (where each sample starts),
pixel_values float32 [patches, channels x temporal_patch x patch²] (as the processor emits them),
image_grid_thw int64 [images, 3], sample_images int64 [samples + 1] (where each sample's images
start). Needs transformers, torch, safetensors, pillow and torchvision; nothing is downloaded when
DIR is a local checkpoint.
"""
import argparse
import json
import os
import sys


def samples(path):
    base = os.path.dirname(os.path.abspath(path))
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not JSON: {e}")
            images = record.get("images", [])
            if not isinstance(images, list) or not isinstance(record.get("text", ""), str):
                sys.exit(f"{path}:{number}: expected {{\"images\": [paths], \"text\": str}}")
            yield ([os.path.join(base, p) for p in images], record.get("text", ""),
                   record.get("response"), f"{path}:{number}")


def encode(processor, images, text, response, where):
    from PIL import Image

    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    messages = [{"role": "user", "content": content}]
    pictures = [Image.open(p).convert("RGB") for p in images] or None
    prompt = processor.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=response is not None)
    full = prompt
    if response is not None:
        messages.append({"role": "assistant", "content": [{"type": "text", "text": response}]})
        full = processor.apply_chat_template(messages, tokenize=False)
    out = processor(text=[full], images=pictures, return_tensors="pt")
    ids = out["input_ids"][0]
    labels = ids.clone()
    if response is not None:
        prompt_len = processor(text=[prompt], images=pictures, return_tensors="pt")["input_ids"].shape[1]
        labels[:prompt_len] = -100
    labels[ids == processor.image_token_id] = -100
    grid = out.get("image_grid_thw")
    if pictures and grid is None:
        sys.exit(f"{where}: the processor returned no image_grid_thw")
    return ids, labels, out.get("pixel_values"), grid


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory (or hub id)")
    parser.add_argument("--out", required=True, help="sample file to write (.safetensors)")
    parser.add_argument("--min-pixels", type=int, help="the image processor's min_pixels")
    parser.add_argument("--max-pixels", type=int, help="the image processor's max_pixels")
    parser.add_argument("inputs", nargs="+", help=".jsonl files of samples")
    args = parser.parse_args()

    import torch
    from safetensors.torch import save_file
    from transformers import AutoProcessor

    kwargs = {}
    if args.min_pixels:
        kwargs["min_pixels"] = args.min_pixels
    if args.max_pixels:
        kwargs["max_pixels"] = args.max_pixels
    processor = AutoProcessor.from_pretrained(args.model, **kwargs)
    ids, labels, pixels, grids = [], [], [], []
    sample_tokens, sample_images = [0], [0]
    for path in args.inputs:
        for images, text, response, where in samples(path):
            i, l, p, g = encode(processor, images, text, response, where)
            ids.append(i)
            labels.append(l)
            sample_tokens.append(sample_tokens[-1] + len(i))
            if g is not None:
                pixels.append(p.float())
                grids.append(g.long())
            sample_images.append(sample_images[-1] + (len(g) if g is not None else 0))
    if not ids:
        sys.exit("no samples")
    ip = processor.image_processor
    width = 3 * ip.temporal_patch_size * ip.patch_size ** 2
    tensors = {
        "input_ids": torch.cat(ids).long().contiguous(),
        "labels": torch.cat(labels).long().contiguous(),
        "sample_tokens": torch.tensor(sample_tokens, dtype=torch.long),
        "pixel_values": (torch.cat(pixels) if pixels else torch.zeros(0, width)).contiguous(),
        "image_grid_thw": (torch.cat(grids) if grids
                           else torch.zeros(0, 3, dtype=torch.long)).contiguous(),
        "sample_images": torch.tensor(sample_images, dtype=torch.long),
    }
    save_file(tensors, args.out, metadata={"format": "memplan-vl-samples-v1"})
    print(f"{args.out}: {len(ids)} samples, {sample_tokens[-1]} tokens, {sample_images[-1]} "
          f"images, {tensors['pixel_values'].shape[0]} patches")


if __name__ == "__main__":
    main()
