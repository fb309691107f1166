"""CUDA device benchmarks on a GPU, side by side in one process (docs/benchmarks.md):
- bandwidth over 2^26 f32: saxpy (a qdc kernel on qd.ndarrays: reads 2 arrays, writes 1) against
  PyTorch's `b.add_(a, alpha=2)`, and a qdc copy kernel against cuMemcpyDtoD and `b.copy_(a)`;
- fills of 2^20 elements (f32, f64 with distinct halves, a vec3 of f32) against PyTorch's `fill_`;
- launch overhead: a one-element qdc kernel (one thread really runs and writes) against a raw
  cuLaunchKernel (cuda-bindings) of its own PTX and ctx, enqueued (2000 launches, then one sync)
  and launched + synchronised one at a time (a ctypes call of libcuda's cuLaunchKernel measured
  7.5 us against the binding's 5.5 on an H200: the binding is the faster way in);
- `--variants`: the same saxpy and copy as hand-written PTX (32-bit indices, ld.global.nc for the
  read-only input, 128-bit vector loads, loads of several grid-stride iterations issued first) on
  the grid cap and on a full grid, to see what the emitted code leaves on the table.
PyTorch peers where torch imports with CUDA. Every time is the best of 5 rounds of `inner` calls
ended by a synchronisation.
Run: python3 bench/bench_cuda.py [--variants]"""
import argparse
import ctypes
import time
import traceback

import numpy as np

import qdc as qd
from qdc.runtime import context

N = 1 << 26
FILL_N = 1 << 20


@qd.kernel
def saxpy(a: qd.f32, x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    for i in x:
        y[i] = a * x[i] + y[i]


@qd.kernel
def copy_kernel(x: qd.types.ndarray(qd.f32, ndim=1), y: qd.types.ndarray(qd.f32, ndim=1)):
    for i in x:
        y[i] = x[i]


@qd.kernel
def one_element(a: qd.types.ndarray(qd.f32, ndim=1)):
    for i in range(1):
        a[i] = a[i] + 1.0


def best_of(run, repeats=5, inner=20, sync=None):
    sync = sync or context.current().device.wait
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        for _ in range(inner):
            run()
        sync()
        times.append((time.perf_counter() - t) / inner)
    return min(times)


def torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def loaded_kernel(dev, name):
    import gc
    from qdc.runtime.devices.stream import StreamKernel
    return next(o for o in gc.get_objects() if isinstance(o, StreamKernel) and o.meta.name == name)


def bandwidth(dev, torch):
    cu = dev.cu
    x, y = qd.ndarray(qd.f32, shape=(N,)), qd.ndarray(qd.f32, shape=(N,))
    x.from_numpy(np.ones(N, np.float32))
    saxpy(2.0, x, y)
    copy_kernel(x, y)
    t_saxpy = best_of(lambda: saxpy(2.0, x, y))
    t_copy = best_of(lambda: copy_kernel(x, y))
    src, dst = x.allocation(), y.allocation()
    t_memcpy = best_of(lambda: cu.cuMemcpyDtoDAsync(dst.ptr, src.ptr, 4 * N, dev.stream))
    print(f"saxpy 2^26 f32: qdc {t_saxpy * 1e3:.3f} ms = {12 * N / t_saxpy / 1e9:.0f} GB/s")
    print(f"copy 2^26 f32: qdc kernel {t_copy * 1e3:.3f} ms = {8 * N / t_copy / 1e9:.0f} GB/s; cuMemcpyDtoD "
          f"{t_memcpy * 1e3:.3f} ms = {8 * N / t_memcpy / 1e9:.0f} GB/s; qdc / cuMemcpyDtoD {t_memcpy / t_copy:.3f}")
    if torch is not None:
        a, b = torch.ones(N, device="cuda"), torch.zeros(N, device="cuda")
        t_add = best_of(lambda: b.add_(a, alpha=2), sync=torch.cuda.synchronize)
        t_tcopy = best_of(lambda: b.copy_(a), sync=torch.cuda.synchronize)
        print(f"PyTorch {torch.__version__}: add_ {t_add * 1e3:.3f} ms = {12 * N / t_add / 1e9:.0f} GB/s; copy_ "
              f"{t_tcopy * 1e3:.3f} ms = {8 * N / t_tcopy / 1e9:.0f} GB/s")
        print(f"qdc saxpy / PyTorch add_: {t_add / t_saxpy:.3f} (goal >= 0.95); qdc copy / PyTorch copy_: "
              f"{t_tcopy / t_copy:.3f}")
    else:
        print("PyTorch with CUDA is not installed here: no PyTorch peers")
    return x, y


def fills(dev, torch):
    cases = [("f32", qd.field(qd.f32, shape=FILL_N), 1.5), ("f32 zero", qd.field(qd.f32, shape=FILL_N), 0.0),
             ("f64", qd.field(qd.f64, shape=FILL_N), 1.1), ("vec3 f32", qd.Vector.field(3, qd.f32, shape=FILL_N), 2.5)]
    for name, f, value in cases:
        f.fill(value)
        t = best_of(lambda: f.fill(value), inner=100)
        assert (f.to_numpy() == np.float64(value).astype(f.to_numpy().dtype)).all()
        print(f"fill 2^20 {name}: qdc {t * 1e6:.1f} us")
    if torch is not None:
        a = torch.zeros(FILL_N, device="cuda")
        t = best_of(lambda: a.fill_(1.5), inner=100, sync=torch.cuda.synchronize)
        print(f"fill 2^20 f32: PyTorch fill_ {t * 1e6:.1f} us")
    g = qd.field(qd.f32, shape=FILL_N, needs_grad=True)
    t = best_of(lambda: g.grad.fill(0.0), inner=100)
    print(f"x.grad.fill(0.0), 2^20 f32: qdc {t * 1e6:.1f} us")
    one = qd.field(qd.f32, shape=FILL_N)
    t = best_of(lambda: one.__setitem__(12345, 2.0), inner=1000)
    print(f"one element write (x[i] = v), queued: qdc {t * 1e6:.2f} us")


QUADRANTS_FILL = """
import time, quadrants as qd
qd.init(arch=qd.cuda, log_level="error")
f = qd.field(qd.f32, shape=1 << 20)
f.fill(0.0); qd.sync()
best = 1e9
for _ in range(5):
    t = time.perf_counter()
    for _ in range(100):
        f.fill(0.0)
    qd.sync()
    best = min(best, (time.perf_counter() - t) / 100)
v = getattr(qd, "__version__", "?")
print(".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v).replace(" ", ""), best)
"""


def quadrants_fill():
    """Quadrants' `fill(0.0)` of 2^20 f32 on the same GPU, in a process of its own."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", QUADRANTS_FILL], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        print(f"Quadrants fill: not measured ({(done.stderr.strip().splitlines() or ['?'])[-1]})")
        return
    version, best = done.stdout.split()[-2:]
    print(f"fill 2^20 f32 zero: Quadrants {version} {float(best) * 1e6:.1f} us")


def launch_overhead(dev):
    cu = dev.cu
    one = qd.ndarray(qd.f32, shape=(1,))
    one_element(one)
    dev.wait()
    loaded = loaded_kernel(dev, "one_element")
    task, ctx = loaded.tasks[0], next(iter(loaded.ctx_copies.values()))
    fn, addr, stream = task.function, ctx.params_address, dev.stream
    block = task.block_dim
    launch = cu.cuLaunchKernel
    rows = [("qdc one_element(a)", lambda: one_element(one)),
            ("raw cuLaunchKernel (cuda-bindings)", lambda: launch(fn, 1, 1, 1, block, 1, 1, 0, stream, addr, 0))]
    before = one.to_numpy()[0]
    results = {}
    for name, run in rows:
        enqueue = best_of(run, inner=2000)
        synced = best_of(lambda: (run(), dev.wait()), inner=500)
        results[name] = (enqueue, synced)
    runs = one.to_numpy()[0] - before
    assert runs > 0, "the one-element kernel did not run"
    base = results["raw cuLaunchKernel (cuda-bindings)"]
    for name, (enqueue, synced) in results.items():
        print(f"{name}: enqueue {enqueue * 1e6:.2f} us, launch + sync {synced * 1e6:.2f} us; / cuda-bindings raw "
              f"{enqueue / base[0]:.2f} / {synced / base[1]:.2f} (goal <= 1.3)")


# ---- hand-written PTX variants -------------------------------------------------------------------

PTX_HEAD = ".version 7.0\n.target sm_70\n.address_size 64\n"


def ptx_kernel(name: str, op: str, vector: int, unroll: int, nc: bool) -> str:
    """y[i] = 2x[i] + y[i] (op saxpy) or y[i] = x[i] (copy) over n elements with 32-bit indices:
    `vector` elements a load (1 or 4), `unroll` grid-stride iterations whose loads go first."""
    ld_x = "ld.global.nc" if nc else "ld.global"
    width = f".v{vector}" if vector > 1 else ""
    regs = lambda base, k: "{" + ", ".join(f"%f{base + k * vector + j}" for j in range(vector)) + "}" if vector > 1 \
        else f"%f{base + k}"
    lines = [f".visible .entry {name}(.param .u64 px, .param .u64 py, .param .u32 pn)", "{",
             "  .reg .pred %p<4>; .reg .b32 %r<16>; .reg .f32 %f<80>; .reg .b64 %rd<40>;",
             "  ld.param.u64 %rd1, [px]; ld.param.u64 %rd2, [py]; ld.param.u32 %r1, [pn];",
             "  cvta.to.global.u64 %rd1, %rd1; cvta.to.global.u64 %rd2, %rd2; mov.f32 %f79, 0f40000000;",
             "  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;",
             "  mad.lo.u32 %r5, %r2, %r3, %r4;", "  mov.u32 %r6, %nctaid.x; mul.lo.u32 %r6, %r6, %r3;",
             f"  mul.lo.u32 %r7, %r6, {unroll};", f"  mul.lo.u32 %r8, %r6, {unroll - 1};", "FULL:",
             "  add.u32 %r9, %r5, %r8; setp.ge.u32 %p1, %r9, %r1; @%p1 bra TAIL;"]
    for k in range(unroll):  # the loads of every unrolled iteration first
        lines.append(f"  mad.lo.u32 %r10, %r6, {k}, %r5; mul.wide.u32 %rd3, %r10, {4 * vector};")
        lines.append(f"  add.u64 %rd{10 + k}, %rd1, %rd3; add.u64 %rd{20 + k}, %rd2, %rd3;")
        lines.append(f"  {ld_x}{width}.f32 {regs(0, k)}, [%rd{10 + k}];")
        if op == "saxpy":
            lines.append(f"  ld.global{width}.f32 {regs(40, k)}, [%rd{20 + k}];")
    for k in range(unroll):
        if op == "saxpy":
            for j in range(vector):
                lines.append(f"  fma.rn.f32 %f{40 + k * vector + j}, %f79, %f{k * vector + j}, %f{40 + k * vector + j};")
            lines.append(f"  st.global{width}.f32 [%rd{20 + k}], {regs(40, k)};")
        else:
            lines.append(f"  st.global{width}.f32 [%rd{20 + k}], {regs(0, k)};")
    lines += ["  add.u32 %r5, %r5, %r7; bra FULL;", "TAIL:", "  setp.ge.u32 %p2, %r5, %r1; @%p2 bra DONE;",
              f"  mul.wide.u32 %rd3, %r5, {4 * vector}; add.u64 %rd10, %rd1, %rd3; add.u64 %rd20, %rd2, %rd3;",
              f"  {ld_x}{width}.f32 {regs(0, 0)}, [%rd10];"]
    if op == "saxpy":
        lines.append(f"  ld.global{width}.f32 {regs(40, 0)}, [%rd20];")
        lines += [f"  fma.rn.f32 %f{40 + j}, %f79, %f{j}, %f{40 + j};" for j in range(vector)]
        lines.append(f"  st.global{width}.f32 [%rd20], {regs(40, 0)};")
    else:
        lines.append(f"  st.global{width}.f32 [%rd20], {regs(0, 0)};")
    lines += ["  add.u32 %r5, %r5, %r6; bra TAIL;", "DONE:", "  ret;", "}"]
    return "\n".join(lines) + "\n"


def variants(dev, x, y):
    cu = dev.cu
    specs = [(op, vector, unroll, nc) for op in ("saxpy", "copy") for vector in (1, 4) for unroll in (1, 4)
             for nc in (False, True)]
    names = [f"{op}_v{vector}_u{unroll}{'_nc' if nc else ''}" for op, vector, unroll, nc in specs]
    ptx = PTX_HEAD + "".join(ptx_kernel(n, *s) for n, s in zip(names, specs))
    module = dev.driver.check(cu.cuModuleLoadData(ptx.encode() + b"\0"), "loading the PTX variants")
    xp, yp = x.allocation().ptr, y.allocation().ptr
    sm_blocks = dev.grid_cap(256)
    for name, (op, vector, unroll, nc) in zip(names, specs):
        fn = dev.driver.check(cu.cuModuleGetFunction(module, name.encode()), name)
        count = N // vector
        args = [ctypes.c_uint64(xp), ctypes.c_uint64(yp), ctypes.c_uint32(count)]
        params = (ctypes.c_void_p * 3)(*[ctypes.addressof(a) for a in args])
        addr = ctypes.addressof(params)
        row = []
        for grid_name, grid in (("grid cap", min(sm_blocks, -(-count // 256))), ("full grid", -(-count // 256)),
                                ("one wave", dev.sm_count * dev.threads_per_sm // 256)):
            run = lambda grid=grid: cu.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, dev.stream, addr, 0)
            run()
            t = best_of(run)
            moved = (12 if op == "saxpy" else 8) * N
            row.append(f"{grid_name} {moved / t / 1e9:.0f}")
        print(f"PTX {name}: GB/s " + ", ".join(row))
    # qdc's own saxpy task on a full grid instead of the grid cap
    loaded = loaded_kernel(dev, "saxpy")
    task, ctx = loaded.tasks[0], next(iter(loaded.ctx_copies.values()))
    for grid in (dev.grid_cap(task.block_dim), -(-N // task.block_dim)):
        run = lambda grid=grid: cu.cuLaunchKernel(task.function, grid, 1, 1, task.block_dim, 1, 1, 0, dev.stream,
                                                  ctx.params_address, 0)
        t = best_of(run)
        print(f"qdc saxpy PTX on {grid} blocks: {12 * N / t / 1e9:.0f} GB/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", action="store_true", help="also the hand-written PTX variants")
    args = ap.parse_args()
    qd.init(arch="cuda")
    dev = context.current().device
    torch = torch_cuda()
    print(dev.name)
    print(f"graphs: {dev.has_graphs} (missing calls: {getattr(dev.driver, 'missing_graph_calls', None)})")
    x = y = None
    for section in ("bandwidth", "fills", "quadrants_fill", "launch_overhead", "variants"):
        if section == "variants" and not args.variants:
            continue
        try:
            if section == "bandwidth":
                x, y = bandwidth(dev, torch)
            elif section == "variants":
                variants(dev, x, y)
            elif section == "quadrants_fill":
                quadrants_fill()
            else:
                globals()[section](dev, *((torch,) if section == "fills" else ()))
        except Exception:  # noqa: BLE001 - one section failing must not hide the others' figures
            print(f"{section} failed:\n{traceback.format_exc()}")


if __name__ == "__main__":
    main()
