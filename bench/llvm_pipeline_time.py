"""LLVM's share of compiling large CPU kernels, without the rest of the build: capture the LLVM
IR of each CPU module a program compiles, then time LLVM's optimisation and object emission of
those files under qdc's pipeline choice and others, in this process (CPU seconds).

    python bench/llvm_pipeline_time.py capture DIR SCRIPT [ARGS...]
    python bench/llvm_pipeline_time.py time FILE.ll... [--pipeline qdc|before|O3|O1] [--passes]
    python bench/llvm_pipeline_time.py parts FILE.ll... [--threads 1,2] [--rounds 3]

`capture` runs SCRIPT (e.g. `bench/genesis_scene.py box 2 --qdc` with an empty QDC_CACHE_DIR)
and writes each module's IR, as compile_kernel hands it to LLVM, to DIR/<kernel>-<digest>.ll.
`time` optimises each file for the host CPU as compile_kernel does (codegen.optimise, the same
target machine for emission) and prints its largest function, the pipeline, the seconds of
parsing, optimisation and emission and the object's size and digest (equal digests: the same
code). `qdc` is llvm_pipeline's pick by the largest function (O1 without the vectorisers and
the large functions for size above LARGE_FUNCTION instructions, else O3); `before` what qdc did
before it (O3, without the SLP vectoriser above LARGE_FUNCTION); `O3` and `O1` those levels with
and without both vectorisers; `--passes` adds LLVM's own timing of each pass. What qdc marked in
a captured file (`optsize`, `!qdc.llvm_pipeline`) is taken out before each pipeline adds its own.
`parts` builds each file as compile_kernel does (qdc's pipeline, as marked in the file), whole on
this thread and cut into parts (cpu/module_split.py) on each number of `--threads`, in alternating
rounds, and prints the wall and the process's CPU seconds of each (best of the rounds; CPU above
wall: the threads overlapped), whether the library's objects are the same bytes whatever the
threads, and each part's CPU seconds on one thread: the largest, and the wall time two idle cores
would take at best (the parts dealt largest first), which a busy machine does not blur.
"""
import argparse
import hashlib
import os
import re
import runpy
import sys
import time

import llvmlite.binding as llvm

from qdc.compiler.targets.cpu import codegen, parallel_llvm
from qdc.compiler.targets.cpu.llvm_pipeline import LARGE_FUNCTION, Pipeline


def capture(folder: str, script: list) -> None:
    os.makedirs(folder, exist_ok=True)
    add_half_conversions = codegen.with_half_conversions  # the last step before LLVM parses the text

    def saving(text: str) -> str:
        text = add_half_conversions(text)
        name = text.split("\n", 1)[0].split('"')[1]  # ; ModuleID = "kernel"
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        with open(os.path.join(folder, f"{name}-{digest}.ll"), "w", encoding="utf-8") as f:
            f.write(text)
        return text
    codegen.with_half_conversions = saving
    sys.argv = script
    runpy.run_path(script[0], run_name="__main__")


def unmarked(text: str) -> str:
    """`text` without what llvm_pipeline.mark wrote into it."""
    text = re.sub(r"^(define .*) optsize$", r"\1", text, flags=re.M)
    return re.sub(r"^!qdc\.llvm_pipeline = .*$", "", text, flags=re.M)


def sizes(module) -> list:
    """(instructions, [functions]) of each function LLVM optimises, a task body with the regions
    outlined from it (`<body>.outlined<N>`) as one (llvm_pipeline._sizes)."""
    groups: dict = {}
    for fn in module.functions:
        if not fn.is_declaration and b"optnone" not in b" ".join(fn.attributes):
            group = groups.setdefault(re.sub(r"\.outlined\d+(?=$|\.l\d+$)", "", fn.name), [0, []])
            group[0] += sum(1 for block in fn.blocks for _ in block.instructions)
            group[1].append(fn)
    return [tuple(group) for group in groups.values()]


def pipeline_for(name: str, module) -> Pipeline:
    """The pipeline `name` for a parsed module, its large functions marked `optsize` where it says so."""
    large = [fn for size, fns in sizes(module) if size > LARGE_FUNCTION for fn in fns]
    if name == "qdc" and large:
        for fn in large:
            fn.add_function_attribute("optsize")
        return Pipeline(1, False, False, "", tuple(fn.name for fn in large))
    return {"qdc": Pipeline(3, True, True), "before": Pipeline(3, True, not large), "O3": Pipeline(3, True, True),
            "O1": Pipeline(1, False, False)}[name]


def time_files(files: list, pipeline_name: str, passes: bool) -> None:
    total = [0.0, 0.0, 0.0]
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = unmarked(f.read())
        t0 = time.process_time()
        module = llvm.parse_assembly(text, context=llvm.create_context())
        module.verify()
        parse = time.process_time() - t0
        largest = max((size for size, _ in sizes(module)), default=0)
        pipeline = pipeline_for(pipeline_name, module)
        t1 = time.process_time()  # counting the instructions is not LLVM's time
        if passes:
            llvm.set_time_passes(True)
        module, tm = codegen.optimise(module, 3, pipeline=pipeline)
        t2 = time.process_time()
        obj = tm.emit_object(module)
        t3 = time.process_time()
        print(f"{os.path.basename(path):<56} largest {largest:6d}  {pipeline.describe():<44} parse {parse:5.2f} "
              f"optimise {t2 - t1:5.2f} emit {t3 - t2:5.2f} s  object {len(obj):8d} B "
              f"{hashlib.sha256(obj).hexdigest()[:12]}", flush=True)
        if passes:
            print(llvm.report_and_reset_timings())
            llvm.set_time_passes(False)
        for i, t in enumerate((parse, t2 - t1, t3 - t2)):
            total[i] += t
    print(f"all {len(files)} modules: parse {total[0]:.2f}, optimise {total[1]:.2f}, emit {total[2]:.2f} s CPU")


def time_parts(files: list, threads: list, rounds: int) -> None:
    from qdc.compiler.compile_threads import limited_threads
    from qdc.compiler.targets.cpu.module_split import split_module
    from qdc.compiler.targets.cpu.platforms import cpu_levels, host_platform
    levels = cpu_levels("native", host_platform())
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        pipeline = Pipeline(1, False, False) if "!qdc.llvm_pipeline" in text else Pipeline(3, True, True)
        split = split_module(text)
        if split is None:
            print(f"{os.path.basename(path):<56} whole (below the parts' threshold)")
            continue
        how = [("whole", 1, lambda: codegen._build_whole(text, 3, host_platform(), levels, pipeline, [], {}, False,
                                                          True, False))]
        how += [(f"parts, {n} thread{'s' if n > 1 else ''}", n,
                 lambda: codegen._build_parts(split, text, 3, host_platform(), levels, pipeline, [], {}, False, True,
                                              False))
                for n in threads]
        best, objects, part_cpu = {}, {}, {}
        run_parts = parallel_llvm.run_parts

        def timed_parts(work, parts, sizes):  # each part's CPU seconds, on one thread
            results, times = run_parts(work, parts, sizes)
            for i, t in enumerate(times):
                cpu = sum(step[1] for step in t.steps.values())
                part_cpu[i] = min(part_cpu.get(i, cpu), cpu)
            return results, times
        for _ in range(rounds):
            for name, n, build in how:
                parallel_llvm.run_parts = timed_parts if n == 1 else run_parts
                with limited_threads(n):
                    w, c = time.perf_counter(), time.process_time()
                    built = build()
                    wall, cpu = time.perf_counter() - w, time.process_time() - c
                objects[name] = built.objects
                best[name] = min(best.get(name, (wall, cpu)), (wall, cpu))
        parallel_llvm.run_parts = run_parts
        same = len({tuple(objects[name]) for name, _, _ in how[1:]}) == 1
        print(f"{os.path.basename(path):<56} {len(split[0])} parts of "
              f"{', '.join(str(part.count(chr(10))) for part in split[0])} lines; objects the same bytes whatever "
              f"the threads: {same}")
        for name, _, _ in how:
            wall, cpu = best[name]
            print(f"    {name:<20} wall {wall:6.3f} s  CPU {cpu:6.3f} s", flush=True)
        loads = [0.0, 0.0]  # the parts dealt largest first to the less loaded of two threads
        for cpu in sorted(part_cpu.values(), reverse=True):
            loads[loads.index(min(loads))] += cpu
        print(f"    parts' CPU on one thread: largest {max(part_cpu.values()):.3f} of {sum(part_cpu.values()):.3f} s; "
              f"on two idle cores at best {max(loads):.3f} s", flush=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "capture":
        capture(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["time", "parts"])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--pipeline", default="qdc", choices=["qdc", "before", "O3", "O1"])
    parser.add_argument("--passes", action="store_true", help="print LLVM's timing of each pass")
    parser.add_argument("--threads", default="1,2", help="parts: the thread counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.mode == "parts":
        time_parts(args.files, [int(n) for n in args.threads.split(",")], args.rounds)
    else:
        time_files(args.files, args.pipeline, args.passes)


if __name__ == "__main__":
    main()
