#!/usr/bin/env python3
"""Checks the folder graph that #include lines draw inside agent/ and planner/.

  scripts/check-include-graph.py [--print] [REPO_ROOT]

Fails (exit 1), naming the files, when
  * two folders of one side include each other, directly or through others (a cycle), or
  * agent/ includes planner/ or planner/ includes agent/ (they meet only in proto/ and common/).
--print writes each folder's dependencies (the layering docs/architecture.md and the READMEs state).
"""
import os
import re
import sys
from collections import defaultdict

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([a-z_0-9]+)/[^"]+"', re.M)
SOURCES = ('.h', '.cc', '.cu', '.cuh')


def folder_edges(root, side):
    """{folder: {included folder: [files that include it]}} for side ('agent' or 'planner')."""
    edges = defaultdict(lambda: defaultdict(list))
    crossings = []
    base = os.path.join(root, side)
    for dirpath, _, files in os.walk(base):
        rel = os.path.relpath(dirpath, base).split(os.sep)[0]
        if rel == '.':
            continue
        for name in files:
            if not name.endswith(SOURCES):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding='utf-8', errors='replace') as f:
                text = f.read()
            for top, sub in INCLUDE.findall(text):
                if top == side and sub != rel:
                    edges[rel][sub].append(os.path.relpath(path, root))
                elif top in ('agent', 'planner') and top != side:
                    crossings.append((os.path.relpath(path, root), f'{top}/{sub}'))
        edges.setdefault(rel, defaultdict(list))
    return edges, crossings


def cycles(edges):
    """Strongly connected components with more than one folder (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main(argv):
    show = '--print' in argv
    args = [a for a in argv if a != '--print']
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    failed = False
    for side in ('agent', 'planner'):
        edges, crossings = folder_edges(root, side)
        if show:
            for folder in sorted(edges):
                print(f'{side}/{folder} -> {" ".join(sorted(edges[folder])) or "(none)"}')
        for component in cycles(edges):
            failed = True
            print(f'include cycle in {side}/: {" <-> ".join(component)}', file=sys.stderr)
            for a in component:
                for b in component:
                    for f in edges[a].get(b, [])[:3]:
                        print(f'  {f} includes {side}/{b}/', file=sys.stderr)
        for path, target in crossings:
            failed = True
            print(f'{path} includes {target}/: agent/ and planner/ meet only in proto/ and common/',
                  file=sys.stderr)
    if not failed:
        print('include graph: no folder cycle in agent/ or planner/, no agent <-> planner include')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
