#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""Validates what ci/run-guest.sh --results DIR wrote for CI systems.

Usage: ci/check-results.py DIR...     check each results folder
       ci/check-results.py --self-test

results.ktap (KTAP version 1): the version line, a plan "1..N", then exactly
N result lines "ok|not ok <n> <name>[ # <directive or detail>]" numbered 1..N
in order (comment lines starting with "#" allowed). junit.xml, parsed with
xml.etree: one <testsuite> whose tests, failures and skipped attributes
match its <testcase>s (failures: with a <failure>, skipped: with a
<skipped>), every testcase named. Both files must describe the same tests
in the same order with the same verdicts, and the summary line
("P passed, F failed, S skipped") must add up to them. Prints one line per
folder; exit status 1 if any is invalid.
"""
import os
import re
import sys
import tempfile
import xml.etree.ElementTree as ET

RESULT = re.compile(r"^(ok|not ok) (\d+) (\S+)(?: # (.*))?$")
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed, (\d+) skipped$")


class Invalid(Exception):
    pass


def parse_ktap(path):
    """[(name, verdict)] with verdict PASS, FAIL or SKIP."""
    with open(path, encoding="utf-8") as f:
        lines = [ln.rstrip("\n") for ln in f]
    if not lines or lines[0] != "KTAP version 1":
        raise Invalid(f"{path}: first line is not 'KTAP version 1'")
    if len(lines) < 2 or not re.fullmatch(r"1\.\.(\d+)", lines[1]):
        raise Invalid(f"{path}: second line is not a plan '1..N'")
    planned = int(lines[1][3:])
    tests = []
    for i, line in enumerate(lines[2:], start=3):
        if line.startswith("#") or not line.strip():
            continue
        m = RESULT.match(line)
        if not m:
            raise Invalid(f"{path}:{i}: not a KTAP result line: {line!r}")
        if int(m.group(2)) != len(tests) + 1:
            raise Invalid(f"{path}:{i}: test number {m.group(2)}, expected {len(tests) + 1}")
        directive = m.group(4) or ""
        if m.group(1) == "not ok":
            verdict = "FAIL"
        elif directive.startswith("SKIP"):
            verdict = "SKIP"
        else:
            verdict = "PASS"
        tests.append((m.group(3), verdict))
    if len(tests) != planned:
        raise Invalid(f"{path}: plan says {planned} tests, {len(tests)} result lines")
    return tests


def parse_junit(path):
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise Invalid(f"{path}: not well-formed XML: {e}") from e
    if root.tag != "testsuite":
        raise Invalid(f"{path}: root element is <{root.tag}>, expected <testsuite>")
    try:
        declared = {k: int(root.get(k)) for k in ("tests", "failures", "skipped")}
    except (TypeError, ValueError) as e:
        raise Invalid(f"{path}: testsuite attributes tests/failures/skipped missing or not numbers") from e
    if not root.get("name"):
        raise Invalid(f"{path}: testsuite without a name")
    tests = []
    for tc in root:
        if tc.tag != "testcase":
            raise Invalid(f"{path}: unexpected <{tc.tag}> in the testsuite")
        if not tc.get("name") or not tc.get("classname"):
            raise Invalid(f"{path}: a testcase without name or classname")
        kinds = [c.tag for c in tc]
        if kinds not in ([], ["failure"], ["skipped"]):
            raise Invalid(f"{path}: testcase {tc.get('name')} has {kinds}")
        verdict = {(): "PASS", ("failure",): "FAIL", ("skipped",): "SKIP"}[tuple(kinds)]
        tests.append((tc.get("name"), verdict))
    counted = {
        "tests": len(tests),
        "failures": sum(v == "FAIL" for _, v in tests),
        "skipped": sum(v == "SKIP" for _, v in tests),
    }
    if counted != declared:
        raise Invalid(f"{path}: testsuite says {declared}, its testcases are {counted}")
    return tests


def check(folder):
    ktap = parse_ktap(os.path.join(folder, "results.ktap"))
    junit = parse_junit(os.path.join(folder, "junit.xml"))
    if ktap != junit:
        diff = next((i for i, (a, b) in enumerate(zip(ktap, junit)) if a != b), min(len(ktap), len(junit)))
        raise Invalid(f"{folder}: KTAP and JUnit disagree from test {diff + 1}: "
                      f"{ktap[diff:diff + 1]} against {junit[diff:diff + 1]}")
    summary_path = os.path.join(folder, "summary")
    with open(summary_path, encoding="utf-8") as f:
        m = SUMMARY.match(f.read().strip())
    if not m:
        raise Invalid(f"{summary_path}: not 'P passed, F failed, S skipped'")
    counts = tuple(sum(v == w for _, v in ktap) for w in ("PASS", "FAIL", "SKIP"))
    if tuple(int(x) for x in m.groups()) != counts:
        raise Invalid(f"{summary_path}: says {m.group(0)}, the results are {counts}")
    return counts


def self_test():
    """The checker accepts what run-guest.sh writes and refuses broken files."""
    good_ktap = ("KTAP version 1\n1..3\nok 1 a # fine\nnot ok 2 b # broke\n"
                 "ok 3 c # SKIP no device\n")
    good_xml = ('<?xml version="1.0" encoding="UTF-8"?>\n'
                '<testsuite name="s" tests="3" failures="1" skipped="1" time="1.0">\n'
                '  <testcase classname="s" name="a"></testcase>\n'
                '  <testcase classname="s" name="b"><failure message="broke"/></testcase>\n'
                '  <testcase classname="s" name="c"><skipped message="no device"/></testcase>\n'
                '</testsuite>\n')
    summary = "1 passed, 1 failed, 1 skipped\n"
    bad = {
        "plan": (good_ktap.replace("1..3", "1..4"), good_xml, summary),
        "numbering": (good_ktap.replace("not ok 2", "not ok 5"), good_xml, summary),
        "version": (good_ktap.replace("KTAP version 1", "TAP version 13"), good_xml, summary),
        "junit counts": (good_ktap, good_xml.replace('failures="1"', 'failures="0"'), summary),
        "junit xml": (good_ktap, good_xml.replace("</testsuite>", ""), summary),
        "disagree": (good_ktap.replace("not ok 2 b", "ok 2 b"), good_xml, summary),
        "summary": (good_ktap, good_xml, "3 passed, 0 failed, 0 skipped\n"),
    }
    with tempfile.TemporaryDirectory() as d:
        def write(k, x, s):
            for name, text in (("results.ktap", k), ("junit.xml", x), ("summary", s)):
                with open(os.path.join(d, name), "w", encoding="utf-8") as f:
                    f.write(text)
        write(good_ktap, good_xml, summary)
        assert check(d) == (1, 1, 1)
        for what, files in bad.items():
            write(*files)
            try:
                check(d)
            except Invalid:
                continue
            raise AssertionError(f"a broken file passed: {what}")
    print(f"check-results: self-test passed (1 good folder, {len(bad)} broken ones refused)")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    bad = 0
    for folder in argv:
        try:
            p, f, s = check(folder)
            print(f"check-results: {folder}: KTAP and JUnit valid ({p} passed, {f} failed, {s} skipped)")
        except (Invalid, OSError) as e:
            print(f"check-results: INVALID {e}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
