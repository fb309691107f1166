"""The summary of tools/device/genesis_gpu.sh, as Markdown for docs/benchmarks.md: where and what
ran (the script's log), every run's figures with its positions against the CPU reference (the check:
within 1e-4) and against qdc's cold run, then qdc against Quadrants on the same backend per scene.

    python3 tools/device/genesis_summary.py RESULTS.jsonl LOG
"""
import json
import sys

import numpy as np

TOLERANCE = 1e-4
# the log's lines that say where and what ran (genesis_gpu.sh writes them)
HEADER = ("genesis_gpu.sh at", "host:", "gpu:", "python ", "genesis ", "quadrants ", "done at")
# the order of the runs in the tables, by scene
ORDER = ("qdc-cold", "qdc-warm", "qdc-prebuilt", "quadrants-cold", "quadrants-warm", "vulkan-cold", "cpu-reference")


def max_difference(positions, reference):
    if reference is None:
        return None
    return float(np.max(np.abs(np.asarray(positions) - np.asarray(reference))))


def text(d):
    return "-" if d is None else f"{d:.1e}"


def every_run(rows, cpu, qdc_cold):
    print("| run | scene | backend / arch / torch | scene.build() s | first step s | step ms | compiles "
          "| max abs(pos - cpu) | max abs(pos - qdc cold) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if not r.get("result"):
            continue
        res, scene = r["result"], r["scene"]
        compiles = "-" if res["compiles"] is None else res["compiles"]
        print(f"| {r['label']} | {scene} | {res['backend']} / {res['arch']} / {res['torch']} | {res['build']:.2f} "
              f"| {res['first_step']:.3f} | {res['step'] * 1e3:.3f} | {compiles} "
              f"| {text(max_difference(res['pos'], cpu.get(scene)))} "
              f"| {text(max_difference(res['pos'], qdc_cold.get(scene)))} |")


def ratio(a, b):
    return "" if a is None or b is None else f"{a / b:.2f}"


def build(res):
    return None if res is None else res["build"]


def built(res, compiles=True):
    if res is None:
        return ""
    return f"{res['build']:.2f} s" + (f" ({res['compiles']} compiled)" if compiles else "")


def timed(res, key, scale, unit):
    return None if res is None else res[key] * scale, "" if res is None else f"{res[key] * scale:.3f} {unit}"


def against_quadrants(rows, cpu):
    """One table a scene: scene.build() cold, warm and prebuilt, steps, manifest build, positions."""
    runs = {(r["label"], r["scene"]): r for r in rows}
    backends = sorted({r["result"]["backend"] for r in rows
                       if r["label"].startswith(("qdc-", "quadrants-")) and r.get("result")})
    print(f"qdc against Quadrants, Genesis's backend {' / '.join(backends) or '-'}, one process a figure:")
    print()
    print("| scene | what | Quadrants | qdc | qdc / Quadrants |")
    print("| --- | --- | --- | --- | --- |")
    for scene in sorted({scene for _, scene in runs}):
        q_cold, q_warm, c_cold, c_warm, c_pre = (runs.get((label, scene), {}).get("result") for label in (
            "quadrants-cold", "quadrants-warm", "qdc-cold", "qdc-warm", "qdc-prebuilt"))
        print(f"| {scene} | scene.build() cold | {built(q_cold, False)} | {built(c_cold)} "
              f"| {ratio(build(c_cold), build(q_cold))} |")
        print(f"| {scene} | scene.build() warm | {built(q_warm, False)} | {built(c_warm)} "
              f"| {ratio(build(c_warm), build(q_warm))} |")
        of = [f"{ratio(build(c_pre), build(q))} of {which}" for q, which in ((q_warm, "warm"), (q_cold, "cold"))
              if ratio(build(c_pre), build(q))]
        print(f"| {scene} | scene.build() prebuilt from the manifest | | {built(c_pre)} | {', '.join(of)} |")
        manifest = runs.get(("qdc-build-manifest", scene), {}).get("manifest_build")
        if manifest is not None:
            counts = manifest["summary"].partition(": ")[2] or "no summary line"  # 'N built, ... in T s'
            print(f"| {scene} | `qdc build --manifest` (a process of its own) | | {manifest['ms'] / 1e3:.1f} s "
                  f"(exit {manifest['exit']}; {counts}) | |")
        for what, key, scale, unit in (("first step (warm)", "first_step", 1.0, "s"),
                                       ("step, mean of the 99 after the first (warm)", "step", 1e3, "ms")):
            (q, q_text), (c, c_text) = timed(q_warm, key, scale, unit), timed(c_warm, key, scale, unit)
            print(f"| {scene} | {what} | {q_text} | {c_text} | {ratio(c, q)} |")
        differences = [text(max_difference(res["pos"], cpu.get(scene))) if res else "" for res in (q_warm, c_warm)]
        print(f"| {scene} | max abs(positions after 100 steps - the CPU run's) | {differences[0]} "
              f"| {differences[1]} | |")


def main():
    results, log = sys.argv[1:]
    rows = [json.loads(line) for line in open(results, encoding="utf-8")]
    # by scene, then qdc, Quadrants, vulkan and the reference (the CPU runs' lines come in between)
    rows.sort(key=lambda r: (r["scene"], ORDER.index(r["label"]) if r["label"] in ORDER else len(ORDER)))
    with open(log, encoding="utf-8") as f:  # read before printing: the script appends this summary to that log
        log_lines = f.readlines()
    for line in log_lines:
        if line.startswith(HEADER):
            print(f"- {line.rstrip()}")
    print()
    # Genesis's CPU configuration (the reference of the check) and qdc's cold run on the GPU backend
    # (the same algorithms as the other GPU runs: their agreement checks Quadrants, the prebuilt cache
    # and the vulkan arch against it)
    cpu = {r["scene"]: r["result"]["pos"] for r in rows if r["label"] == "cpu-reference" and r.get("result")}
    qdc_cold = {r["scene"]: r["result"]["pos"] for r in rows if r["label"] == "qdc-cold" and r.get("result")}
    every_run(rows, cpu, qdc_cold)
    print()
    against_quadrants(rows, cpu)
    print()
    finished = [r for r in rows if r.get("result")]
    if finished:
        print("Final positions:\n\n```")
        for r in finished:
            print(f"{r['label']} {r['scene']}: {np.round(np.asarray(r['result']['pos']), 6).tolist()}")
        print("```\n")
    failed = [f"{r['label']} {r['scene']} (exit {r['exit']})" for r in rows if "exit" in r]
    print("runs without a result: " + (", ".join(failed) if failed else "none"))
    for line in log_lines:
        if line.startswith("skipped"):
            print(line.rstrip())
    differences = [(r, max_difference(r["result"]["pos"], cpu.get(r["scene"]))) for r in finished]
    beyond = [f"{r['label']} {r['scene']} ({d:.1e})" for r, d in differences if d is not None and not d <= TOLERANCE]
    print(f"positions beyond {TOLERANCE:g} of the CPU run: " + (", ".join(beyond) if beyond else "none"))


if __name__ == "__main__":
    main()
