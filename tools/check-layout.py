#!/usr/bin/env python3
"""check-layout.py -- the layout README.md describes, checked (make test: compile-tests).

  tools/check-layout.py [repository root]

- backends/ holds backends only: each header fills a gpuarr__backend table, includes no layer and
  calls no function a layer defines;
- layers/ holds layers only: each header fills a gpuarr__layer, and the list at the end of gpuarr.h
  adds each one; the core (gpuarr.h outside that list) calls no function a layer defines, and a
  layer none that a layer included after it defines;
- generated/ files say what made them and the command that remakes them;
- function length over gpuarr.h, backends/ and layers/: median <= 12, p90 <= 30, none over 110.
Prints what it found; exits 1 on the first broken rule.
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
DEF = re.compile(r"^(?:GPUARR__FOR_BACKENDS\s+)?static\b[^;=(]*?\b(gpuarr__\w+)\s*\(", re.M)
FN_START = re.compile(r"^(?:GPUARR_API|GPUARR__FOR_BACKENDS|static)\b[^;]*\)\s*\{\s*$", re.M)


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def headers(folder):
    return sorted(os.path.join(folder, n) for n in os.listdir(os.path.join(ROOT, folder)) if n.endswith(".h"))


def fail(message):
    print("check-layout: " + message)
    sys.exit(1)


def uses(text, names):
    return sorted(n for n in names if re.search(r"\b%s\b" % re.escape(n), text))


def check_folders():
    layer_files = headers("layers")
    layer_defs = {}
    for path in layer_files:
        text = read(path)
        fill = re.search(r"^static void (gpuarr__\w+_layer)\(gpuarr__layer \*l\) \{", text, re.M)
        if not fill:
            fail("%s fills no gpuarr__layer (static void gpuarr__<name>_layer(gpuarr__layer *l))" % path)
        layer_defs[path] = (fill.group(1), set(DEF.findall(strip_comments(text))))
    every_layer_fn = set().union(*(defs for _, defs in layer_defs.values()))
    for path in headers("backends"):
        text = strip_comments(read(path))
        if "gpuarr__backend *" not in text and "gpuarr__backend_" not in text:
            fail("%s is in backends/ but defines no gpuarr__backend table" % path)
        if re.search(r'#\s*include\s+"[^"]*layers/', text):
            fail("%s includes a layer" % path)
        called = uses(text, every_layer_fn)
        if called:
            fail("%s (a backend) calls what a layer defines: %s" % (path, ", ".join(called)))
    core = strip_comments(read("gpuarr.h"))
    start = core.index("static void gpuarr__layer_list(void (*add)(void (*fill)(gpuarr__layer *))) {")
    end = core.index("\n}\n", start)
    listed = core[start:end]
    for path, (fill, _) in layer_defs.items():
        if not re.search(r"\badd\(%s\)" % fill, listed):
            fail("%s's %s is not in gpuarr__layer_list" % (path, fill))
    called = uses(core[:start] + core[end:], every_layer_fn)
    if called:
        fail("the core calls what a layer defines, not through the list: %s" % ", ".join(called))
    order = re.findall(r'#include "(layers/[^"]+)"', core)
    for k, path in enumerate(order):
        later = set().union(set(), *(layer_defs[p][1] for p in order[k + 1:]))
        called = uses(strip_comments(read(path)), later - layer_defs[path][1])
        if called:
            fail("%s calls what a layer included after it defines: %s" % (path, ", ".join(called)))
    print("check-layout: %d backends, %d layers; no backend uses a layer; the core reaches the layers only "
          "through gpuarr__layer_list; each layer uses only those before it" % (len(headers("backends")), len(layer_files)))


def check_generated():
    for path in sorted(os.path.join("generated", n) for n in os.listdir(os.path.join(ROOT, "generated"))):
        head = read(path)[:400]
        if "Generated" not in head or "make " not in head or "Do not edit" not in head:
            fail("%s does not say what made it, the make command that remakes it, and not to edit it" % path)
    print("check-layout: every file in generated/ says what made it and how to remake it")


def function_lengths(text):
    lines = text.split("\n")
    lengths = []
    for i, line in enumerate(lines):
        if FN_START.match(line) and "=" not in line.split("(")[0]:
            depth, j = 0, i
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                if depth <= 0 and j > i - 1 and "}" in lines[j]:
                    break
                j += 1
            lengths.append((j - i + 1, i + 1))
    return lengths


def check_lengths():
    lengths = []
    for path in ["gpuarr.h"] + headers("backends") + headers("layers"):
        lengths += [(n, "%s:%d" % (path, at)) for n, at in function_lengths(strip_comments(read(path)))]
    ns = sorted(n for n, _ in lengths)
    median, p90 = ns[len(ns) // 2], ns[int(len(ns) * 0.9)]
    longest = max(lengths)
    print("check-layout: %d functions: median %d lines, p90 %d, longest %d (%s)" % (len(ns), median, p90, longest[0], longest[1]))
    if median > 12 or p90 > 30 or longest[0] > 110:
        fail("function length over the bounds (median <= 12, p90 <= 30, none over 110)")


check_folders()
check_generated()
check_lengths()
