"""A huge task body with its large regions outlined (compiler/targets/llvm/llvm_outline.py)
against the same body in one function: build time and run time, in alternating rounds.

    python3 bench/bench_outline.py [--groups 6] [--stages 10] [--n 16384] [--rounds 3]

The kernel is generated (`huge_kernel_source`, also the tests' kernel): a parallel loop whose
body has `groups` serial loops of `stages` steps each (branches on integers, a short inner
loop with a `break`, local variables carried from step to step), an atomic sum, a `while` loop,
and a large `if` holding a `continue` of the task's loop, which is not outlined. Each round
builds it cold both ways (`qdc build -j 1`, one thread; then the same kernel's LLVM work on
every core, as direct mode compiles it) and times launches over `--n` elements; the results
must be the same bytes. The task keeps the scalar code (QDC_CPU_WIDEN=0), as Genesis's large
task bodies do.
"""
import argparse
import os
import statistics
import sys
import tempfile
import textwrap
import time


def _stage(s: int) -> str:
    """One step: it branches on integers only (i, k), so that float32 and Python's floats take
    the same paths."""
    return f'''
            if (i + k) % {2 + s % 5} == {s % 2}:
                t = acc * 0.5 + x[i] * {0.1 * (s % 7 + 1):.3f}
                for j in range({2 + s % 3}):
                    v[(k + j) % 4] = v[(k + j) % 4] * 0.5 + t
                    if j + k > {5 + s % 4}:
                        break
                acc = acc * 0.25 + v[({s} + k) % 4]
                k += 1
            else:
                acc = acc - {0.01 * (s % 10):.3f}
                k += 2
            if k > 40:
                k = k - 37'''


def huge_kernel_source(groups: int = 4, stages: int = 8) -> str:
    """The source of a module defining kernel `huge(x, y, total)` (module docstring): ~50
    statements a step, after the compiler's passes."""
    body = []
    for g in range(groups):
        body.append(f"        for r{g} in range({1 + g % 2}):")
        body += [_stage(g * stages + s) for s in range(stages)]
        body.append(textwrap.indent(textwrap.dedent(f'''
            m = 0
            while m < {1 + g}:
                m += 1
                acc = acc + 0.125
            total[0] += acc'''), "    " * 2))
    guarded = "\n".join(_stage(100 + s) for s in range(stages))
    return textwrap.dedent('''
        import qdc as qd

        F = qd.types.ndarray(dtype=qd.f32, ndim=1)


        @qd.kernel
        def huge(x: F, y: F, total: F):
            for i in range(x.shape[0]):
                acc = 0.0
                k = 0
                v = qd.Vector([0.0, 0.0, 0.0, 0.0])  # indexed at run time: a local array
        ''') + "\n".join(body) + textwrap.indent(textwrap.dedent(f'''
        if x[i] > -100.0:
            {textwrap.indent(textwrap.dedent(guarded), "    " * 3).strip()}
            if k == 1000:
                continue
        y[i] = acc + v[0] + v[1] * 2.0 + v[2] * 3.0 + v[3] * 4.0 + k
        '''), "    " * 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--stages", type=int, default=10)
    parser.add_argument("--n", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--launches", type=int, default=30)
    args = parser.parse_args()
    os.environ["QDC_CPU_WIDEN"] = "0"
    import numpy as np
    from qdc.compiler import compile_threads
    from qdc.compiler.commands import build as build_mod
    from qdc.compiler.driver.options import resolve
    from qdc.compiler.targets.cpu import codegen
    from qdc.compiler.targets.cpu.target import TARGET as CPU
    from qdc.compiler.targets.llvm import llvm_outline
    from qdc.runtime.loader import load

    folder = tempfile.mkdtemp(prefix="bench-outline-")
    with open(os.path.join(folder, "huge_src.py"), "w", encoding="utf-8") as f:
        f.write(huge_kernel_source(args.groups, args.stages))
    sys.path.insert(0, folder)
    import huge_src
    from qdc.compiler.driver import kernel as K
    from qdc.compiler.driver.options import Options
    primal = huge_src.huge._primal
    compiled = K.compile_kernel(primal.fn, primal.params, Options())
    task = compiled.ir.tasks[0]
    threshold = llvm_outline.OUTLINED_TASK_STATEMENTS
    print(f"task body: {llvm_outline._statements(task.body)} statements, "
          f"{len(llvm_outline.outlined_regions(task))} regions outlined; {compile_threads.compile_threads()} threads")
    x = np.random.default_rng(0).uniform(-1.0, 1.0, args.n).astype(np.float32)
    results = {"outlined": [], "whole": []}
    for r in range(args.rounds):
        for name, statements in (("outlined", threshold), ("whole", 10 ** 9)):
            llvm_outline.OUTLINED_TASK_STATEMENTS = statements
            cache = os.path.join(folder, f"cache-{name}-{r}")
            w, c = time.perf_counter(), time.process_time()
            report = build_mod.build([os.path.join(folder, "huge_src.py")], ["cpu"], resolve({}, {}), cache, jobs=1,
                                     log=lambda text: None)
            build_wall, build_cpu = time.perf_counter() - w, time.process_time() - c
            assert report.ok, report.errors
            w = time.perf_counter()
            codegen.compile_kernel(compiled.ir, compiled.meta, 3, target=CPU)  # LLVM's work on every core
            threaded = time.perf_counter() - w
            kernel = load(cache, "huge_src").huge
            y, total = np.zeros_like(x), np.zeros(1, np.float32)
            kernel(x, y, total)
            times = []
            for _ in range(args.launches):
                w = time.perf_counter()
                kernel(x, y, total)
                times.append(time.perf_counter() - w)
            results[name].append(y.copy())
            print(f"round {r + 1} {name:<9} build -j1 {build_wall:5.2f} s wall / {build_cpu:5.2f} s CPU; "
                  f"compile_kernel on every core {threaded:5.2f} s wall; launch median {statistics.median(times) * 1e3:7.3f} ms, "
                  f"best {min(times) * 1e3:7.3f} ms", flush=True)
    llvm_outline.OUTLINED_TASK_STATEMENTS = threshold
    same = all(np.array_equal(a, b) for a, b in zip(results["outlined"], results["whole"]))
    print(f"results the same bytes outlined and whole: {same}")


if __name__ == "__main__":
    main()
