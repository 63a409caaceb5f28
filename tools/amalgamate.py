#!/usr/bin/env python3
"""amalgamate.py -- gpuarr.h and every file it includes, as one self-contained header.

Usage: tools/amalgamate.py [-o OUT] [HEADER]     (HEADER defaults to gpuarr.h; OUT to stdout)

`make single-header` runs it (build/single-header/gpuarr.h). Each `#include "path"` that names an
existing file is replaced by that file's text, recursively, between
`/* ==== begin <path> ==== */` and `/* ==== end <path> ==== */`. A quoted name is looked up as a C
compiler looks it up: beside the including file, then in the folder of HEADER (the repository
root, as -I. does). System includes (<...>) and quoted names that match no file stay as they are.
The list of files is not written down anywhere: it is what the includes say.

Only real directives count: lines that start, outside a comment, with `#include` (blanks allowed
around the #); an include inside a comment or a string is text. An include inside #if blocks is
inlined in place, so the conditionals still decide. A file is inlined again where it is included
again, exactly as the preprocessor reads it again, unless the later include can only be reached
after the earlier one (it sits inside every #if branch the earlier one sat in) and the file has an
include guard: then the second copy would be empty, and it is left out. (Two backends under
their own GPUARR_NO_<NAME> switches, each including the same generated file, both get a copy:
either may be the one compiled.)

OUT is written only when its text changes, so what depends on it is not rebuilt for nothing.
"""
import argparse
import os
import re
import subprocess
import sys
import textwrap

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
DIRECTIVE = re.compile(r'^\s*#\s*(\w+)\s*(.*)')
# what matters to comments in code: their openers, and strings and character constants whole
TOKEN = re.compile(r"""/\*|//|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?""")


class Scanner:
    """Tells, line by line, whether a line starts outside any comment: tracks /* */ comments
    across lines, and skips // comments, strings and character constants within a line."""

    def __init__(self):
        self.in_comment = False
        self.continued_line_comment = False

    def starts_in_code(self, line):
        return not self.in_comment and not self.continued_line_comment

    def feed(self, line):
        if self.continued_line_comment:
            self.continued_line_comment = line.rstrip("\n").endswith("\\")
            return
        i = 0
        while True:
            if self.in_comment:
                end = line.find("*/", i)
                if end < 0:
                    return
                self.in_comment, i = False, end + 2
            m = TOKEN.search(line, i)
            if not m:
                return
            if m.group() == "/*":
                self.in_comment = True
            elif m.group() == "//":
                self.continued_line_comment = line.rstrip("\n").endswith("\\")
                return
            i = m.end()


def code_lines(text):
    """(line, starts_in_code, scanner after the line) for each line of text."""
    scanner = Scanner()
    for line in text.splitlines(keepends=True):
        in_code = scanner.starts_in_code(line)
        scanner.feed(line)
        yield line, in_code, scanner


def directive(line, in_code):
    """(name, rest) of a preprocessor line outside comments, else (None, None)."""
    m = DIRECTIVE.match(line) if in_code else None
    return (m.group(1), m.group(2).strip()) if m else (None, None)


def has_include_guard(text):
    """True when the file's code is one #ifndef X / #define X ... #endif (or has #pragma once)."""
    code = []  # the directives and code lines, comments and blank lines left out
    for line, in_code, _ in code_lines(text):
        stripped = re.sub(r"/\*.*?\*/|//.*", "", line).strip() if in_code else ""
        if stripped:
            code.append(stripped)
    if any(re.match(r"#\s*pragma\s+once\b", l) for l in code):
        return True
    if len(code) < 3:
        return False
    m = re.match(r"#\s*(?:ifndef\s+(\w+)|if\s+!\s*defined\s*\(?\s*(\w+)\s*\)?)\s*$", code[0])
    if not m or not re.match(r"#\s*define\s+%s\b" % (m.group(1) or m.group(2)), code[1]):
        return False
    depth = 0  # the #ifndef must close on the last line, not before
    for i, l in enumerate(code):
        name = re.match(r"#\s*(\w+)", l)
        name = name.group(1) if name else ""
        if name in ("if", "ifdef", "ifndef"):
            depth += 1
        elif name == "endif":
            depth -= 1
            if depth == 0:
                return i == len(code) - 1
    return False


class Amalgamator:
    def __init__(self, root):
        self.root = root
        self.branches = []   # the #if branches open at this point of the output, by serial number
        self.serial = 0
        self.inlined = {}    # real path -> branches open where it was first inlined
        self.guarded = {}    # real path -> has an include guard
        self.active = []     # the files being inlined, innermost last
        self.files = []      # each file inlined, in order (for the top comment)

    def resolve(self, name, including_dir):
        for base in (including_dir, self.root):
            path = os.path.normpath(os.path.join(base, name))
            if os.path.isfile(path):
                return path
        return None

    def label(self, path):
        return os.path.relpath(path, self.root)

    def track(self, name):
        """Keeps self.branches in step with the conditional directive name."""
        if name in ("if", "ifdef", "ifndef"):
            self.serial += 1
            self.branches.append(self.serial)
        elif name in ("elif", "elifdef", "elifndef", "else") and self.branches:
            self.serial += 1
            self.branches[-1] = self.serial
        elif name == "endif" and self.branches:
            self.branches.pop()

    def covered(self, real):
        """True when an earlier copy of real is surely read before this point, and guarded."""
        first = self.inlined.get(real)
        return (first is not None and self.branches[: len(first)] == first
                and self.guarded[real])

    def expand(self, path, out):
        real = os.path.realpath(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.active.append(real)
        for line, in_code, after in code_lines(text):
            m = INCLUDE.match(line) if in_code else None
            target = m and self.resolve(m.group(1), os.path.dirname(path))
            if target:
                self.include(target, out)
                # a comment opened after the name goes on over the next lines: reopen it
                if after.in_comment or after.continued_line_comment:
                    out.append("/*\n" if after.in_comment else "// \\\n")
            else:
                self.track(directive(line, in_code)[0])
                out.append(line if line.endswith("\n") else line + "\n")
        self.active.pop()

    def include(self, target, out):
        real, label = os.path.realpath(target), self.label(target)
        if real not in self.guarded:
            with open(target, encoding="utf-8") as f:
                self.guarded[real] = has_include_guard(f.read())
        if self.covered(real) or (real in self.active and self.guarded[real]):
            out.append("/* ==== %s: inlined above (include guard) ==== */\n" % label)
            return
        if real in self.active:
            sys.exit("amalgamate: %s includes itself and has no include guard" % label)
        if real not in self.inlined:
            self.inlined[real] = list(self.branches)
            self.files.append(label)
        depth = len(self.branches)
        out.append("/* ==== begin %s ==== */\n" % label)
        self.expand(target, out)
        out.append("/* ==== end %s ==== */\n" % label)
        if len(self.branches) != depth:
            sys.exit("amalgamate: %s leaves an #if open or closes one it did not open" % label)


def describe(root):
    try:
        r = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty"],
                           capture_output=True, text=True, check=True)
        return r.stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def banner(header, text, files, commit):
    m = re.search(r'^\s*#\s*define\s+GPUARR_VERSION_STRING\s+"([^"]*)"', text, re.M)
    version = m.group(1) if m else "unknown"
    folders = " ".join(sorted({f.split(os.sep)[0] + "/" for f in files if os.sep in f}))
    paragraphs = [
        "%s -- gpuarr %s as one file (commit %s)." % (header, version, commit),
        "GENERATED by `make single-header` (tools/amalgamate.py) from the repository's %s and its "
        "folders (%s). Do not edit: edit those and run the command again. It is the same library "
        "as %s with its folders: each file the header includes with a quoted #include is inlined "
        "where it was included, between ==== begin / end banners. Use it as the manual below "
        "says, with nothing else to copy." % (header, folders, header),
        "Inlined, in order: %s." % ", ".join(files),
    ]
    lines = []
    for p in paragraphs:
        lines += [" * " + l for l in textwrap.wrap(p, 94)] + [" *"]
    return "/*" + lines[0][2:] + "\n" + "\n".join(lines[1:-1]) + "\n */\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("header", nargs="?", default="gpuarr.h")
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    root = os.path.dirname(os.path.abspath(args.header))
    with open(args.header, encoding="utf-8") as f:
        top = f.read()
    a = Amalgamator(root)
    body = []
    a.expand(os.path.abspath(args.header), body)
    if a.branches:
        sys.exit("amalgamate: %s leaves an #if open" % args.header)
    text = banner(os.path.basename(args.header), top, a.files, describe(root)) + "".join(body)
    if not args.output:
        sys.stdout.write(text)
        return
    try:
        with open(args.output, encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    tmp = args.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, args.output)


if __name__ == "__main__":
    main()
