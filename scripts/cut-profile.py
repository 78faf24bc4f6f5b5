#!/usr/bin/env python3
"""A hardware profile (proto JSON, as `memplan-agent bench --out` writes it) cut to a smaller card:
cut-profile.py IN OUT NAME GIB [HOST_GIB] writes IN with name NAME and gpu_memory_bytes = GIB GiB
(and, given HOST_GIB, host_memory_bytes = HOST_GIB GiB: the node's RAM) to OUT, for
`memplan hardware submit` (plans for a budget below the card's memory, or the host's)."""
import json
import sys

if len(sys.argv) not in (5, 6):
    sys.exit(__doc__)
h = json.load(open(sys.argv[1]))
h["name"] = sys.argv[3]
h["gpu_memory_bytes"] = str(int(float(sys.argv[4]) * (1 << 30)))
h.pop("gpuMemoryBytes", None)
if len(sys.argv) == 6:
    h["host_memory_bytes"] = str(int(float(sys.argv[5]) * (1 << 30)))
    h.pop("hostMemoryBytes", None)
json.dump(h, open(sys.argv[2], "w"))
