#!/usr/bin/env python3
"""Where a CI run's time went, from the tools' own records (no timer of ours in a test).

  python3 scripts/ci_timings.py BUILD_DIR [BUILD_DIR ...] [--top N]
  python3 scripts/ci_timings.py BUILD_DIR --costs tests/ctest_costs.txt

--costs writes the per-test times of BUILD_DIR's last ctest run in the format of ctest's
CTestCostData.txt (name, runs, seconds), which tests/CMakeLists.txt copies into a fresh build
folder so that the first run already starts the long tests first.

For each build folder:
  - the build: ninja's own log (BUILD_DIR/.ninja_log, the last build's entries), per target the
    summed compile/link time and its wall-clock span, then the N slowest single steps;
  - the tests: ctest's log of its last run (BUILD_DIR/Testing/Temporary/LastTest.log, or a
    JUnit report BUILD_DIR/ctest-junit.xml from `ctest --output-junit`), the summed test time
    per device (conformance cases) or suite, and the N slowest tests.
Phase times (configure, build, test of each suite) come from the file .ci/run writes
(BUILD_DIR/ci-phases.tsv: phase, seconds), when present.
"""
import argparse
import collections
import os
import re
import sys
import xml.etree.ElementTree as ET


def ninja_steps(build_dir):
    """The last build's steps: (start_s, end_s, output). ninja appends a line per output as each
    step ends, so within one build the end times never decrease; a later build starts its clock
    again at zero. The log is cut where an end time falls, and a step with several outputs (the
    same start, end and command hash) is counted once."""
    path = os.path.join(build_dir, ".ninja_log")
    if not os.path.exists(path):
        return []
    runs, cur, seen, last_end = [], [], set(), -1
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 5:
                continue
            start, end = int(parts[0]), int(parts[1])
            if end < last_end and cur:
                runs.append(cur)
                cur, seen = [], set()
            last_end = end
            key = (start, end, parts[4])
            if key in seen:
                continue
            seen.add(key)
            cur.append((start / 1000.0, end / 1000.0, parts[3]))
    if cur:
        runs.append(cur)
    # The largest of the recorded builds is the one that built the tree (a later no-op or
    # incremental build has few entries).
    return max(runs, key=len) if runs else []


TARGET_RE = re.compile(r"CMakeFiles/([^/]+)\.dir/")


def target_of(output):
    m = TARGET_RE.search(output)
    if m:
        return m.group(1)
    if "/shaders/" in output or output.endswith(".spv") or output.endswith(".spv.h"):
        return "(shaders)"
    return os.path.basename(output)


def report_build(build_dir, top):
    steps = ninja_steps(build_dir)
    if not steps:
        print(f"  build: no {build_dir}/.ninja_log")
        return
    wall = max(e for _, e, _ in steps) - min(s for s, _, _ in steps)
    busy = sum(e - s for s, e, _ in steps)
    print(f"  build: {len(steps)} steps, {wall:.0f} s wall, {busy:.0f} s of step time "
          f"(ninja's log; a step's time includes waiting for the other cores)")
    per = collections.defaultdict(lambda: [0.0, 1e18, 0.0, 0])
    for s, e, out in steps:
        t = per[target_of(out)]
        t[0] += e - s
        t[1] = min(t[1], s)
        t[2] = max(t[2], e)
        t[3] += 1
    print(f"  {'target':<44} {'steps':>5} {'sum s':>8} {'span s':>8}")
    for name, (tot, first, lastend, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {name:<44} {n:>5} {tot:>8.1f} {lastend - first:>8.1f}")
    print(f"  slowest {top} steps:")
    for s, e, out in sorted(steps, key=lambda x: x[0] - x[1])[:top]:
        print(f"  {e - s:>8.1f}  {out}")


def junit_cases(path):
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    cases = []
    for suite in suites:
        for tc in suite.findall("testcase"):
            status = "passed"
            if tc.find("failure") is not None:
                status = "failed"
            elif tc.find("skipped") is not None:
                status = "skipped"
            cases.append((float(tc.get("time", "0")), tc.get("name", "?"), status, "?"))
    return cases


TEST_RE = re.compile(r"^\d+/\d+ Test: (.*)$")
TIME_RE = re.compile(r"^Test time =\s*([0-9.]+) sec")


def lastlog_cases(path):
    """ctest's own log of its last run (Testing/Temporary/LastTest.log): per test a block
    "i/N Test: name" ... "Test time = S sec" ... "Test Passed." / "Test Failed." / a skip."""
    cases, name, secs, skipped, exe = [], None, None, False, "?"
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = TEST_RE.match(line)
            if m:
                name, secs, skipped = m.group(1).split("  #")[0].strip(), None, False
                exe = "?"
                continue
            if name is not None and line.startswith("Command: "):
                exe = os.path.basename(line[len("Command: "):].split('"')[1] if '"' in line
                                       else line.split()[1])
            if name is None:
                continue
            if "[  SKIPPED ]" in line or "Skipped" == line.strip():
                skipped = True
            m = TIME_RE.match(line)
            if m:
                secs = float(m.group(1))
                continue
            if secs is not None and line.startswith("Test "):
                status = "passed" if line.startswith("Test Passed") else "failed"
                if skipped or "Skipped" in line or "Not Run" in line:
                    status = "skipped"
                cases.append((secs, name, status, exe))
                name = None
    return cases


def report_tests(build_dir, top):
    junit = os.path.join(build_dir, "ctest-junit.xml")
    lastlog = os.path.join(build_dir, "Testing", "Temporary", "LastTest.log")
    if os.path.exists(lastlog):
        cases = lastlog_cases(lastlog)
    elif os.path.exists(junit):
        cases = junit_cases(junit)
    else:
        print(f"  tests: no {lastlog} (ctest has not run here)")
        return
    total = sum(c[0] for c in cases)
    counts = collections.Counter(c[2] for c in cases)
    print(f"  tests: {len(cases)} ({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}),"
          f" {total:.0f} s of test time (ctest's log; with -j2 two run at once)")
    groups = collections.defaultdict(lambda: [0.0, 0])
    for t, name, _, exe in cases:
        # A conformance case "On/Matmul.Foo/vulkan_0" counts for its device.
        dev = name.rsplit("/", 1)[-1] if "/" in name else ""
        dev = dev if re.fullmatch(r"[a-z0-9]+_(\d+|unavailable)", dev) else ""
        key = exe + (" " + dev if dev else "")
        groups[key][0] += t
        groups[key][1] += 1
    print(f"  {'executable [device]':<44} {'tests':>5} {'sum s':>8}")
    for key, (t, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {key:<44} {n:>5} {t:>8.1f}")
    print(f"  slowest {top} tests:")
    for t, name, status, _ in sorted(cases, key=lambda c: -c[0])[:top]:
        print(f"  {t:>8.1f}  {name}{'' if status == 'passed' else '  (' + status + ')'}")


def write_costs(build_dir, out):
    lastlog = os.path.join(build_dir, "Testing", "Temporary", "LastTest.log")
    if not os.path.exists(lastlog):
        print(f"ci_timings: no {lastlog}: run ctest there first", file=sys.stderr)
        return 2
    cases = [c for c in lastlog_cases(lastlog) if c[2] != "skipped"]
    with open(out, "w") as f:
        for t, name, _, _ in sorted(cases, key=lambda c: c[1]):
            f.write(f"{name} 1 {max(t, 0.01):.2f}\n")
        f.write("---\n")
    print(f"ci_timings: {len(cases)} test costs written to {out}")
    return 0


def report_phases(build_dir):
    path = os.path.join(build_dir, "ci-phases.tsv")
    if not os.path.exists(path):
        return
    print("  phases (.ci/run):")
    with open(path) as f:
        for line in f:
            name, secs = line.rstrip("\n").split("\t")
            print(f"  {float(secs):>8.0f} s  {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build_dirs", nargs="+")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--costs", metavar="FILE",
                    help="write the last run's test times as a ctest cost file and exit")
    args = ap.parse_args()
    if args.costs:
        return write_costs(args.build_dirs[0], args.costs)
    for d in args.build_dirs:
        print(f"== {d}")
        report_phases(d)
        report_build(d, args.top)
        report_tests(d, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
