#!/usr/bin/env python3
"""Every include of the product's code points down.

The product's folders, top to bottom (docs/architecture.md, "Modules"):
each may include its own folder's headers and those of any folder below
it, never one above; the public headers (runtime/include/refit/) are
the API's types and may be included anywhere. A folder that is not in the
list, or a header that resolves nowhere, fails too, so that a new folder
is placed on purpose.

    check_layers.py SOURCE_DIR
"""
import os
import re
import sys

# Top to bottom. Folders on one row are peers: neither includes the other.
LAYERS = [
    ["runtime/src/api", "runtime/src/agent"],
    ["runtime/src/session"],
    ["runtime/src/generator"],
    ["runtime/src/source"],
    ["runtime/src/transport"],
    ["runtime/src/device"],
    ["runtime/src/mpi"],
    ["runtime/src/fault"],
    ["runtime/src/config"],
    ["reshard", "kernels"],
    ["core"],
]
PUBLIC = "runtime/include"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SUFFIXES = (".c", ".h", ".cu", ".cuh")


def level_of(folder):
    for level, row in enumerate(LAYERS):
        if folder in row:
            return level
    return None


def folder_of(relpath):
    """The layer folder that holds relpath (longest match), or None."""
    best = None
    for row in LAYERS:
        for folder in row:
            if relpath.startswith(folder + "/") and (best is None or len(folder) > len(best)):
                best = folder
    return best


def resolve(src_dir, including, name):
    """Where `#include "name"` in `including` lands: the including file's
    folder first, then the include path the build gives (runtime/include,
    runtime/src, the source root), as the compiler searches."""
    for base in (os.path.dirname(including), PUBLIC, "runtime/src", ""):
        cand = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(src_dir, cand)):
            return cand
    return None


def main():
    src_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    problems = []
    roots = [f for row in LAYERS for f in row]
    # Every folder under runtime/src holds code of one layer.
    for entry in sorted(os.listdir(os.path.join(src_dir, "runtime/src"))):
        path = os.path.join("runtime/src", entry)
        if os.path.isdir(os.path.join(src_dir, path)) and path not in roots:
            problems.append(f"{path}/: a folder of runtime/src that LAYERS does not place")
        elif entry.endswith(SUFFIXES):
            problems.append(f"{path}: code directly in runtime/src, outside every folder")
    checked = 0
    for root in roots:
        top = os.path.join(src_dir, root)
        for dirpath, _, files in os.walk(top):
            for f in sorted(files):
                if not f.endswith(SUFFIXES):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), src_dir)
                mine = folder_of(rel)
                with open(os.path.join(src_dir, rel), encoding="utf-8") as fh:
                    text = fh.read()
                for m in INCLUDE.finditer(text):
                    name = m.group(1)
                    line = text.count("\n", 0, m.start()) + 1
                    target = resolve(src_dir, rel, name)
                    checked += 1
                    if target is None:
                        # Headers of other projects (bench_util.h of the kernels'
                        # benchmarks sits beside them) resolve above; a miss is a typo.
                        problems.append(f'{rel}:{line}: "{name}" resolves to no file')
                        continue
                    if target.startswith(PUBLIC + "/"):
                        continue
                    theirs = folder_of(target)
                    if theirs is None:
                        problems.append(f'{rel}:{line}: "{name}" is {target}, outside '
                                        "the product's folders")
                    elif theirs != mine and level_of(theirs) <= level_of(mine):
                        problems.append(f'{rel}:{line}: "{name}" points up or sideways: '
                                        f"{mine}/ may include only folders below it, "
                                        f"and {theirs}/ is not")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) break the layering "
              "(move the code down, or place the folder in LAYERS and "
              "docs/architecture.md)")
        return 1
    if checked < 300:
        print(f"check_layers: only {checked} includes seen: wrong source directory?")
        return 1
    print(f"check_layers: {checked} includes, every one points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
