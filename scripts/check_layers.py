#!/usr/bin/env python3
"""Checks that the library's includes point down its layers, as docs/ARCHITECTURE.md says.

The table of layers is read from docs/ARCHITECTURE.md itself (the fenced block after the line
marked "layer table"), so the document and the check cannot disagree. Each row names a folder and
what its files may include besides their own folder: other folders of the table, or single files.
A file belongs to the longest folder of the table its path starts with (transport/soft/x.cpp to
transport/soft, transport/memory_lock.cpp to transport). Every `#include "..."` of every file in
the table's folders is resolved the same way ("rdmachan/..." is include/rdmachan/...; a path no
folder holds is looked up beside the including file) and must land in an allowed place.

    check_layers.py [--root DIRECTORY]

Prints each include that points the wrong way as FILE:LINE and exits 1; prints a one-line summary
and exits 0 when there is none.
"""

import argparse
import os
import re
import sys

DOCUMENT = "docs/ARCHITECTURE.md"
MARKER = "layer table"
SOURCE_SUFFIXES = (".hpp", ".cpp", ".h", ".cc", ".cu", ".cuh")
# Quoted includes, and angle ones that name a folder of the table (<rdmachan/...>).
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)')


def read_table(root):
    """The rows of the document's layer table: {folder: [allowed folder or file, ...]}."""
    path = os.path.join(root, DOCUMENT)
    with open(path, encoding="utf-8") as document:
        lines = document.read().splitlines()
    try:
        start = next(index for index, line in enumerate(lines) if MARKER in line and line.lstrip().startswith("<!--"))
        opening = next(index for index in range(start + 1, len(lines)) if lines[index].startswith("```"))
        closing = next(index for index in range(opening + 1, len(lines)) if lines[index].startswith("```"))
    except StopIteration:
        sys.exit(f"check_layers: no layer table in {path} (a '<!-- {MARKER} ... -->' line, then a fenced block)")
    table = {}
    for number in range(opening + 1, closing):
        words = lines[number].split("#", 1)[0].split()
        if not words:
            continue
        folder, allowed = words[0].rstrip("/"), [word.rstrip("/") for word in words[1:] if word != "-"]
        if folder in table:
            sys.exit(f"check_layers: {path}:{number + 1}: {folder} has two rows")
        table[folder] = allowed
    for folder, allowed in table.items():
        for entry in allowed:
            if entry not in table and not os.path.isfile(os.path.join(root, entry)):
                sys.exit(f"check_layers: {path}: {folder} may include '{entry}', which is neither a folder of the table "
                         "nor a file")
    return table


def layer_of(path, table):
    """The longest folder of the table that holds `path`, or None."""
    holders = [folder for folder in table if path.startswith(folder + "/")]
    return max(holders, key=len) if holders else None


def resolve(target, including_file, table, root):
    """The repository path an include names."""
    if target.startswith("rdmachan/"):
        return "include/" + target
    if layer_of(target, table) is not None or os.path.exists(os.path.join(root, target)):
        return target
    beside = os.path.normpath(os.path.join(os.path.dirname(including_file), target))
    return beside if os.path.exists(os.path.join(root, beside)) else target


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                        help="the repository (default: this script's)")
    root = os.path.abspath(parser.parse_args().root)
    table = read_table(root)

    wrong = []
    files = includes = 0
    for folder in table:
        for directory, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.relpath(os.path.join(directory, name), root)
                layer = layer_of(path, table)
                if layer != folder:
                    continue  # a file of a deeper folder of the table: checked under its own row
                files += 1
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as source:
                    for number, line in enumerate(source, 1):
                        match = INCLUDE.match(line)
                        if match is None:
                            continue
                        quoted, angled = match.groups()
                        target = quoted or angled
                        if angled is not None and not target.startswith("rdmachan/") and layer_of(target, table) is None:
                            continue  # a system or third-party header
                        includes += 1
                        resolved = resolve(target, path, table, root)
                        target_layer = layer_of(resolved, table)
                        if target_layer == layer or target_layer in table[layer] or resolved in table[layer]:
                            continue
                        where = f"{target_layer}/" if target_layer else "no folder of the table"
                        allowed = " ".join(table[layer]) or "nothing else"
                        wrong.append(f'{path}:{number}: #include "{target}" reaches into {where} from {layer}/, '
                                     f"which may include only its own folder and: {allowed}")
    for line in wrong:
        print(line)
    if wrong:
        print(f"check_layers: {len(wrong)} include(s) point against the layers of {DOCUMENT} (\"Layers and folders\")")
        return 1
    print(f"check_layers: {includes} includes in {files} files follow the {len(table)} rows of {DOCUMENT}'s layer table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
