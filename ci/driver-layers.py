#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""The guest driver's layers, checked on its built objects.

guest-driver/README.md holds the table of the driver's files, top to bottom
(between the markers "<!-- layers: top -->" and "<!-- layers: bottom -->");
a file may call only the files below it. This reads each object's defined
and undefined symbols (nm) and fails when:
  - a file calls one above it or on its own row's level of the table order
    (a call up, or a circle);
  - an object of the module (Kbuild's cxl_accel-y) is not in the table, or
    a row names a file that is not built;
  - a symbol another file uses is declared in a header other than its own
    file's (foo.c's in foo.h), or in none.

Usage: ci/driver-layers.py [--readme FILE] [--src DIR] OBJDIR
       ci/driver-layers.py --self-test
"""
import argparse
import os
import re
import subprocess
import sys


def table(readme):
    """The files of the layer table, top first, with their layer names."""
    text = open(readme).read()
    m = re.search(r"<!-- layers: top -->(.*?)<!-- layers: bottom -->", text, re.S)
    if not m:
        sys.exit(f"driver-layers: no layer table in {readme}")
    rows = []
    layer = None
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] == "layer" or (cells[0] and set(cells[0]) <= set("-: ")):
            continue
        if cells[0]:
            layer = cells[0]
        for f in re.findall(r"`([\w-]+)\.c`", cells[1]):
            rows.append((f, layer))
    return rows


def kbuild_objects(src):
    text = open(os.path.join(src, "Kbuild")).read().replace("\\\n", " ")
    m = re.search(r"cxl_accel-y\s*:=([^\n]*)", text)
    return [o[:-2] for o in m.group(1).split()] if m else []


def symbols(objdir, name):
    """(defined, undefined) global symbols of name.o."""
    out = subprocess.run(["nm", os.path.join(objdir, name + ".o")],
                         capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBR":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
    return defined, undefined


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def check(rows, objects, syms, headers):
    """Problems found: rows (file, layer) top first; syms: file -> (def, undef);
    headers: header name -> its text without comments."""
    problems = []
    rank = {}
    for i, (f, layer) in enumerate(rows):
        if f in rank:
            problems.append(f"{f}.c is in the table twice")
        rank[f] = i
    for f in objects:
        if f not in rank:
            problems.append(f"{f}.c is built but in no layer of the table")
    for f in rank:
        if f not in objects:
            problems.append(f"the table names {f}.c, which is not built")
    owner = {}
    for f, (defined, _) in syms.items():
        for s in defined:
            owner[s] = f
    layer_of = dict(rows)
    used = {}
    for f, (_, undefined) in sorted(syms.items()):
        for s in sorted(undefined):
            g = owner.get(s)
            # tracepoints and other generated symbols name no function
            if g is None or g == f or s.startswith("__"):
                continue
            used.setdefault(s, g)
            if f in rank and g in rank and rank[g] <= rank[f]:
                problems.append(
                    f"{f}.c ({layer_of[f]}) calls {s} of {g}.c ({layer_of[g]}), "
                    f"which is not below it")
    for s, g in sorted(used.items()):
        # a function's prototype or a variable's extern, not a struct's name
        decl = r"\b%s\s*[(\[;]" % re.escape(s)
        declared = sorted(h for h, text in headers.items() if re.search(decl, text))
        if f"{g}.h" not in declared:
            problems.append(f"{s} of {g}.c is not declared in {g}.h "
                            f"(found in: {', '.join(declared) or 'no header'})")
        for h in declared:
            if h != f"{g}.h":
                problems.append(f"{h} declares {s}, which is {g}.c's")
    return problems


def self_test():
    rows = [("cdev", "char device"), ("migrate", "migration"), ("vq", "transport")]
    syms = {"cdev": ({"cxla_ioc"}, {"cxla_mig", "cxla_exec"}),
            "migrate": ({"cxla_mig"}, {"cxla_exec"}),
            "vq": ({"cxla_exec"}, set())}
    headers = {"cdev.h": "long cxla_ioc(void);", "migrate.h": "int cxla_mig(void);",
               "vq.h": "int cxla_exec(void);"}
    objects = ["cdev", "migrate", "vq"]
    assert check(rows, objects, syms, headers) == [], check(rows, objects, syms, headers)
    # an upward call: the transport calls migration
    syms["vq"] = ({"cxla_exec"}, {"cxla_mig"})
    p = check(rows, objects, syms, headers)
    assert p == ["vq.c (transport) calls cxla_mig of migrate.c (migration), "
                 "which is not below it"], p
    syms["vq"] = ({"cxla_exec"}, set())
    # a declaration in the wrong header, a file in no layer
    headers["vq.h"] += " int cxla_mig(void);"
    p = check(rows, objects + ["pool"], dict(syms, pool=(set(), set())), headers)
    assert "vq.h declares cxla_mig, which is migrate.c's" in p, p
    assert "pool.c is built but in no layer of the table" in p, p
    print("driver-layers: self-test passed")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("objdir", nargs="?")
    ap.add_argument("--readme")
    ap.add_argument("--src")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return
    if not a.objdir:
        ap.error("OBJDIR needed")
    src = a.src or a.objdir
    readme = a.readme or os.path.join(src, "README.md")
    rows = table(readme)
    objects = kbuild_objects(src)
    syms = {f: symbols(a.objdir, f) for f in objects}
    headers = {h: strip_comments(open(os.path.join(src, h)).read())
               for h in sorted(os.listdir(src))
               if h.endswith(".h") and h not in ("trace.h",)}
    problems = check(rows, objects, syms, headers)
    for p in problems:
        print(f"driver-layers: {p}")
    if problems:
        sys.exit(1)
    print(f"driver-layers: {len(objects)} files in {len({l for _, l in rows})} layers, "
          f"every call goes down")


if __name__ == "__main__":
    main()
