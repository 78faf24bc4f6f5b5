#!/usr/bin/env python3
"""Where a step's device time goes, from Chrome-trace JSON files written by
`memplan-agent train --kernel-trace FILE` or by torch.profiler (export_chrome_trace).

  scripts/kernel-trace-summary.py TRACE [TRACE ...] [--top N]

For each trace: the span from the first to the last device event, the time the device was busy
(the union of kernel and copy intervals) and idle, the kernel count, the time per kernel class
(GEMM, attention, copies, the rest), and the N kernels with the most time. Several traces are
printed side by side by class, so memplan's step can be read against transformers' one.
"""
import argparse
import collections
import json
import re
import sys

CLASSES = [
    ("nccl", re.compile(r"nccl", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm\d+_.*_tn|splitK", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|mem_eff", re.I)),
    ("norm/softmax/loss", re.compile(r"norm|softmax|cross_entropy|nll|log_softmax", re.I)),
    ("reduce", re.compile(r"reduce", re.I)),
    ("copy/cast", re.compile(r"copy|cast|cat|index|gather|scatter", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled", re.I)),
]


def classify(name, cat):
    if cat == "gpu_memcpy":
        return "memcpy"
    if cat == "gpu_memset":
        return "memset"
    for label, pattern in CLASSES:
        if pattern.search(name):
            return label
    return "other"


def union_length(intervals):
    total, end = 0.0, None
    start = None
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None:
                total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    if end is not None:
        total += end - start
    return total


def intersect_length(a, b):
    """Length of the overlap of two interval sets (each merged first)."""
    def merged(xs):
        out = []
        for s, e in sorted(xs):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out
    a, b = merged(a), merged(b)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarise(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in
              ("kernel", "gpu_memcpy", "gpu_memset")]
    if not device:
        sys.exit(f"{path}: no device events (was the trace taken on a GPU?)")
    intervals = [(e["ts"], e["ts"] + e["dur"]) for e in device]
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    busy = union_length(intervals)
    by_class = collections.Counter()
    by_name = collections.Counter()
    count = collections.Counter()
    for e in device:
        c = classify(e["name"], e["cat"])
        by_class[c] += e["dur"]
        key = e["name"][:90]
        by_name[key] += e["dur"]
        count[key] += 1
    kernels = sum(1 for e in device if e["cat"] == "kernel")
    # Collectives beside compute: how much NCCL time no other device work covers (exposed), and
    # how much compute ran while a collective was on the device (where the two share SMs).
    nccl = [(e["ts"], e["ts"] + e["dur"]) for e in device if classify(e["name"], e["cat"]) == "nccl"]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in device
               if e["cat"] == "kernel" and classify(e["name"], e["cat"]) != "nccl"]
    compute_busy = union_length(compute)
    both = intersect_length(nccl, compute)
    return dict(path=path, span=span, busy=busy, kernels=kernels, by_class=by_class,
                by_name=by_name, count=count, compute_busy=compute_busy,
                nccl_busy=union_length(nccl), nccl_beside_compute=both)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    rows = [summarise(p) for p in args.traces]
    ms = lambda us: f"{us / 1e3:9.2f}"
    print(f"{'':24}" + "".join(f"{r['path'][-22:]:>24}" for r in rows))
    print(f"{'device span ms':24}" + "".join(f"{ms(r['span']):>24}" for r in rows))
    print(f"{'device busy ms':24}" + "".join(f"{ms(r['busy']):>24}" for r in rows))
    print(f"{'device idle ms':24}" + "".join(f"{ms(r['span'] - r['busy']):>24}" for r in rows))
    print(f"{'kernels':24}" + "".join(f"{r['kernels']:>24}" for r in rows))
    print(f"{'compute busy ms':24}" + "".join(f"{ms(r['compute_busy']):>24}" for r in rows))
    print(f"{'nccl busy ms':24}" + "".join(f"{ms(r['nccl_busy']):>24}" for r in rows))
    print(f"{'nccl beside compute ms':24}" +
          "".join(f"{ms(r['nccl_beside_compute']):>24}" for r in rows))
    print(f"{'nccl exposed ms':24}" +
          "".join(f"{ms(r['nccl_busy'] - r['nccl_beside_compute']):>24}" for r in rows))
    classes = sorted({c for r in rows for c in r["by_class"]},
                     key=lambda c: -max(r["by_class"][c] for r in rows))
    for c in classes:
        print(f"{c + ' ms':24}" + "".join(f"{ms(r['by_class'][c]):>24}" for r in rows))
    for r in rows:
        print(f"\n{r['path']}: the {args.top} kernels with the most time")
        for name, us in r["by_name"].most_common(args.top):
            print(f"  {us / 1e3:9.2f} ms  {r['count'][name]:6d}x  {name}")


if __name__ == "__main__":
    main()
