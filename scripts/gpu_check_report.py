"""Writes scripts/gpu-check.sh's report (report.md and report.json) from what its steps left in
the output folder so far: called after every step, so a run cut short still reports.

    python3 scripts/gpu_check_report.py OUT BACKEND VULKAN_DEVICE ICD

Reads OUT/steps.tsv (one row a step), devices.txt, gpu.txt, bundle.json (the bundle's), the
GoogleTest JSON files (*.json beside the suites' logs), train-*/metrics.jsonl, gemm_*.json,
torch-*.json and llmc-*.log. Only the standard library.
"""
import glob
import json
import os
import re
import statistics
import sys

WARM = 3  # steps left out of a median: start-up, autotuning, torch.compile


def read(path, default=""):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return default


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def warm_median(values):
    v = values[WARM:] if len(values) > WARM else values[-1:]
    return statistics.median(v) if v else None


def suite(out, tag):
    """A GoogleTest run: counts from its JSON, or from its log when it was cut short."""
    j = load_json(os.path.join(out, tag + ".json"))
    r = {"ran": False}
    if j:
        failed, skipped, passed = [], [], 0
        for s in j.get("testsuites", []):
            for t in s.get("testsuite", []):
                name = f"{s['name']}.{t['name']}"
                if t.get("failures"):
                    failed.append(name)
                elif t.get("result") == "SKIPPED":
                    skipped.append(name)
                elif t.get("status", "RUN") == "RUN":
                    passed += 1
        return {"ran": True, "complete": True, "passed": passed, "failed": failed,
                "skipped": len(skipped)}
    log = read(os.path.join(out, tag + ".log"))
    if log:
        ok = set(re.findall(r"^\[       OK \] (\S+)", log, re.M))
        bad = set(re.findall(r"^\[  FAILED  \] (\S+\.\S+)", log, re.M))
        skip = set(re.findall(r"^\[  SKIPPED \] (\S+\.\S+)", log, re.M))
        r = {"ran": True, "complete": False, "passed": len(ok), "failed": sorted(bad),
             "skipped": len(skip)}
    return r


def train_runs(out):
    runs = {}
    for d in sorted(glob.glob(os.path.join(out, "train-*"))):
        if not os.path.isdir(d):
            continue
        recs = []
        for line in read(os.path.join(d, "metrics.jsonl")).splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "tokens_per_s" in rec and "step" in rec:
                recs.append(rec)
        tag = os.path.basename(d)[len("train-"):]  # cuda_0-gpt2-bf16
        dev, rest = tag.split("-", 1)
        model, prec = rest.rsplit("-", 1)
        runs[tag] = {"device": dev.replace("_", ":"), "model": model, "precision": prec,
                     "steps": len(recs),
                     "tokens_per_s": warm_median([r["tokens_per_s"] for r in recs]),
                     "peak_bytes": max((r.get("memory", {}).get("peak", 0) for r in recs),
                                       default=None),
                     "first_loss": recs[0]["loss"] if recs else None,
                     "last_loss": recs[-1]["loss"] if recs else None}
    return runs


def torch_runs(out):
    runs = {}
    for p in sorted(glob.glob(os.path.join(out, "torch-*.json"))):
        j = load_json(p)
        if not j:
            continue
        tag = os.path.basename(p)[len("torch-"):-len(".json")]
        steps = j.get("steps", [])
        runs[tag] = {"tokens_per_s": warm_median([s["tokens_per_s"] for s in steps]),
                     "steps": len(steps), "torch": j.get("torch"),
                     "peak_device_bytes": j.get("peak_device_bytes"),
                     "last_loss": steps[-1]["loss"] if steps else None}
    return runs


def llmc_runs(out):
    runs = {}
    for p in sorted(glob.glob(os.path.join(out, "llmc-*.log"))):
        tps = [float(x) for x in re.findall(r"\|\s*([\d.]+) tok/s", read(p))]
        runs[os.path.basename(p)[len("llmc-"):-len(".log")]] = {
            "tokens_per_s": warm_median(tps), "steps": len(tps)}
    return runs


def main():
    out, backend, vk, icd = (sys.argv[1:] + [""] * 4)[:4]
    steps = []
    for line in read(os.path.join(out, "steps.tsv")).splitlines()[1:]:
        f = line.split("\t")
        if len(f) >= 5:
            steps.append({"step": f[0], "status": f[1], "exit": f[2], "seconds": f[3], "log": f[4]})
    manifest = load_json(os.path.join(out, "bundle.json"))
    dev_tag = f"{backend}_0"
    suites = {}
    for name in ("test_ops", "test_model"):
        suites[f"{name} {backend}:0"] = suite(out, f"{name}_{dev_tag}")
    if vk:
        suites[f"test_ops {vk}"] = suite(out, f"test_ops_{vk.replace(':', '_')}")
        suites[f"test_vulkan {vk}"] = suite(out, "test_vulkan")
    gemm = {k: (load_json(os.path.join(out, f"gemm_{k}.json")) or {}).get("rows", [])
            for k in ("library", "own", "vulkan")}
    train, torch, llmc = train_runs(out), torch_runs(out), llmc_runs(out)
    native = [suites[f"{n} {backend}:0"] for n in ("test_ops", "test_model")]
    report = {
        "backend": backend, "vulkan_device": vk, "vulkan_icd": icd,
        "vulkan_validation": "off (the Khronos validation layer is not on the GPU machine)",
        "gpu": read(os.path.join(out, "gpu.txt")).strip(),
        "bundle": {k: manifest.get(k) for k in ("git_commit", "git_dirty", "backend_abi",
                                                 "build_date", "bundle_date", "built_on")}
        if manifest else None,
        "steps": steps, "suites": suites, "gemm": gemm, "train": train, "pytorch": torch,
        "pytorch_version": read(os.path.join(out, "torch_version.txt")).strip(), "llmc": llmc,
        "gpu_suites_passed": all(s.get("complete") and s["passed"] > 0 and not s["failed"]
                                 for s in native),
    }
    with open(os.path.join(out, "report.json.tmp"), "w") as f:
        json.dump(report, f, indent=1)
    os.replace(os.path.join(out, "report.json.tmp"), os.path.join(out, "report.json"))

    md = [f"# gpu-check on {backend}:0", ""]
    if report["gpu"]:
        md += [f"GPU: {report['gpu']}", ""]
    if manifest:
        b = report["bundle"]
        md += [f"Bundle: commit {b['git_commit']}{' (dirty)' if b['git_dirty'] else ''}, backend "
               f"ABI {b['backend_abi']}, built {b['build_date']} on {b['built_on']}", ""]
    devices = read(os.path.join(out, "devices.txt")).strip()
    if devices:
        md += ["```", devices, "```", ""]
    md += ["## Steps", "", "| step | status | exit | seconds |", "|---|---|---|---|"]
    md += [f"| {s['step']} | {s['status']} | {s['exit']} | {s['seconds']} |" for s in steps]
    md += ["", "## Tests", "",
           f"Vulkan: {vk or 'no GPU device listed'}"
           f"{f' (ICD {icd})' if icd else ''}, {report['vulkan_validation']}.", "",
           "| suite | passed | failed | skipped | complete |", "|---|---|---|---|---|"]
    for name, s in suites.items():
        if not s.get("ran"):
            md.append(f"| {name} | - | - | - | not run |")
            continue
        md.append(f"| {name} | {s['passed']} | {len(s['failed'])} | {s['skipped']} | "
                  f"{'yes' if s['complete'] else 'no (cut short: from the log)'} |")
    for name, s in suites.items():
        for t in s.get("failed", []):
            md.append(f"- {name}: FAILED {t}")
    if gemm["library"] or gemm["own"] or gemm["vulkan"]:
        md += ["", "## GEMM (GFLOP/s, median)", "",
               "| dtype | shape | M x N x K | library | own | own / library | vulkan | vulkan / library |",
               "|---|---|---|---|---|---|---|---|"]
        rows = gemm["library"] or gemm["own"] or gemm["vulkan"]
        for i, r in enumerate(rows):
            lib = gemm["library"][i]["gflops"] if i < len(gemm["library"]) else None
            own = gemm["own"][i]["gflops"] if i < len(gemm["own"]) else None
            vkg = gemm["vulkan"][i]["gflops"] if i < len(gemm["vulkan"]) else None
            f = lambda v: f"{v:,.0f}" if v else "-"  # noqa: E731
            ratio = lambda v: f"{v / lib:.2f}" if v and lib else "-"  # noqa: E731
            md.append(f"| {r['dtype']} | {r['shape']} | {r['M']}x{r['N']}x{r['K']} | {f(lib)} | "
                      f"{f(own)} | {ratio(own)} | {f(vkg)} | {ratio(vkg)} |")
    md += ["", "## Training tokens/s (median of the steps after the first three)", "",
           "| model | precision | device | crosstrain | loss first -> last | PyTorch eager | "
           "torch.compile | llm.c | peak memory GiB, crosstrain / PyTorch eager |",
           "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: f"{v:,.0f}" if v else "-"  # noqa: E731
    for tag, r in train.items():
        key = f"{r['model']}-{r['precision']}"
        loss = (f"{r['first_loss']:.3f} -> {r['last_loss']:.3f}"
                if r["first_loss"] is not None else "-")
        peers = torch if r["device"] == f"{backend}:0" else {}  # peers beside the native runs
        t = peers.get(key, {}).get("tokens_per_s")
        c = peers.get(key + "-compile", {}).get("tokens_per_s")
        lc = (llmc if peers is torch else {}).get(key, {}).get("tokens_per_s")
        gib = lambda b: f"{b / 2**30:.1f}" if b else "-"  # noqa: E731
        mem = f"{gib(r['peak_bytes'])} / {gib(peers.get(key, {}).get('peak_device_bytes'))}"
        md.append(f"| {r['model']} | {r['precision']} | {r['device']} | {fmt(r['tokens_per_s'])} "
                  f"| {loss} | {fmt(t)} | {fmt(c)} | {fmt(lc)} | {mem} |")
    md += ["", "Batch: tiny 4 x 256, gpt2 16 x 1024, smollm-135m 4 x 2048. PyTorch "
           "(scripts/torch_train.py): SDPA attention (GPT-2; transformers' sdpa for SmolLM), fused "
           f"AdamW; {report['pytorch_version'] or 'not run'}.", ""]
    with open(os.path.join(out, "report.md.tmp"), "w") as f:
        f.write("\n".join(md))
    os.replace(os.path.join(out, "report.md.tmp"), os.path.join(out, "report.md"))
    print("\n".join(md))


if __name__ == "__main__":
    main()
