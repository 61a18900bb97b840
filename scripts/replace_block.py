#!/usr/bin/env python3
"""Replaces a generated block of a document: the text between "<!-- generated: NAME -->" and
"<!-- end: NAME -->" becomes STAMP (if not empty), a blank line, and the contents of BODY_FILE.
scripts/check_figures.sh reads the stamp's commit.

    scripts/replace_block.py DOCUMENT NAME BODY_FILE STAMP
"""
import re
import sys


def main():
    document, name, body_file, stamp = sys.argv[1:5]
    text = open(document).read()
    body = open(body_file).read().rstrip("\n")
    pattern = re.compile(r"(<!-- generated: %s -->\n).*?(<!-- end: %s -->)" % (re.escape(name), re.escape(name)), re.S)
    if not pattern.search(text):
        sys.exit("%s has no block named %s" % (document, name))
    prefix = stamp + "\n\n" if stamp else ""
    text = pattern.sub(lambda m: m.group(1) + prefix + body + "\n" + m.group(2), text)
    open(document, "w").write(text)


if __name__ == "__main__":
    main()
