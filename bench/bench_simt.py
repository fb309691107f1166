"""Block-level code against references, side by side in one process (docs/benchmarks.md):
- a block reduction: per block of 256 threads the sum of its elements (qd.simt.block.reduce_add),
  against torch's `x.view(-1, 256).sum(1)` where torch runs on the same GPU, and against a
  qdc kernel whose threads add their block's elements one by one from global memory;
- a radix sort of 2^log2n u32 keys (qd.algorithms.sort, 4 passes of 8 bits) against
  `torch.sort` where torch runs on the same GPU, and Quadrants' `qd.algorithms.sort` where
  `import quadrants` works on this arch.
Every time is the best of `--rounds` rounds, each a launch and a synchronisation (the first
launch, which compiles, untimed). Results are checked against numpy.
Run: python3 bench/bench_simt.py --arch cuda [--log2n 24]
     python3 bench/bench_simt.py --arch vulkan --log2n 16   # lavapipe: a smaller size"""
import argparse
import time

import numpy as np

import qdc as qd

B = 256
DEPTH = 4  # log256_max_n: counts up to 2^32


@qd.kernel
def block_sums(x: qd.types.ndarray(qd.f32, ndim=1), out: qd.types.ndarray(qd.f32, ndim=1)):
    qd.loop_config(block_dim=B)
    for i in range(x.shape[0]):
        total = qd.simt.block.reduce_add(x[i], B, qd.f32)
        if qd.simt.block.thread_idx() == 0:
            out[i // B] = total


@qd.kernel
def block_sums_serial(x: qd.types.ndarray(qd.f32, ndim=1), out: qd.types.ndarray(qd.f32, ndim=1)):
    for b in range(out.shape[0]):
        total = 0.0
        for k in range(B):
            total += x[b * B + k]
        out[b] = total


@qd.kernel(graph=True)
def radix_sort(keys: qd.types.ndarray(qd.u32, ndim=1), tmp: qd.types.ndarray(qd.u32, ndim=1),
               scratch: qd.types.ndarray(qd.u32, ndim=1), n: qd.types.ndarray(qd.i32, ndim=0)):
    qd.algorithms.sort(keys, tmp, keys, tmp, scratch, n, key_dtype=qd.u32, has_values=False, end_bit=32,
                       log256_max_n=DEPTH)


def best(run, rounds: int, sync=None) -> float:
    sync = sync or qd.sync
    run()
    sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


@qd.kernel
def copy_keys(src: qd.types.ndarray(qd.u32, ndim=1), dst: qd.types.ndarray(qd.u32, ndim=1)):
    for i in src:
        dst[i] = src[i]


def torch_device(arch: str):
    try:
        import torch
    except ImportError:
        return None, None
    if arch == "cuda" and torch.cuda.is_available():
        return torch, "cuda"
    return None, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cuda", choices=("cuda", "vulkan", "amdgpu", "metal"))
    parser.add_argument("--log2n", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    qd.init(arch=args.arch)
    n = 1 << args.log2n
    rng = np.random.default_rng(0)
    torch, device = torch_device(args.arch)

    x = rng.integers(-8, 8, n).astype(np.float32)
    xs, out = qd.ndarray(qd.f32, shape=(n,)), qd.ndarray(qd.f32, shape=(n // B,))
    xs.from_numpy(x)
    want = x.reshape(-1, B).sum(1)
    t_block = best(lambda: block_sums(xs, out), args.rounds)
    assert np.array_equal(out.to_numpy(), want)
    t_serial = best(lambda: block_sums_serial(xs, out), args.rounds)
    print(f"block reduction of 2^{args.log2n} f32 in blocks of {B}: qd.simt {t_block * 1e3:.3f} ms "
          f"({4 * n / t_block / 1e9:.0f} GB/s), a thread per block {t_serial * 1e3:.3f} ms")
    if torch is not None:
        tx = torch.from_numpy(x).to(device)
        t_torch = best(lambda: tx.view(-1, B).sum(1), args.rounds, torch.cuda.synchronize)
        print(f"  torch {t_torch * 1e3:.3f} ms: qdc / torch = {t_block / t_torch:.2f}")

    keys = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    ks, tmp = qd.ndarray(qd.u32, shape=(n,)), qd.ndarray(qd.u32, shape=(n,))
    scratch = qd.ndarray(qd.u32, shape=(qd.algorithms.sort_scratch_slots(n, DEPTH),))
    count = qd.ndarray(qd.i32, shape=())
    count.from_numpy(np.array(n, np.int32))

    original = qd.ndarray(qd.u32, shape=(n,))
    original.from_numpy(keys)

    def sort_once():
        copy_keys(original, ks)  # the unsorted keys again, on the device
        radix_sort(ks, tmp, scratch, count)
    t_copy = best(lambda: copy_keys(original, ks), args.rounds)
    t_sort = best(sort_once, args.rounds) - t_copy
    assert np.array_equal(ks.to_numpy(), np.sort(keys))
    print(f"radix sort of 2^{args.log2n} u32 keys: qdc {t_sort * 1e3:.2f} ms (a device copy of the keys, "
          f"{t_copy * 1e3:.3f} ms, subtracted)")
    if torch is not None:
        tk = torch.from_numpy(keys.astype(np.int64)).to(device)  # torch has no uint32 sort on CUDA
        t_torch = best(lambda: torch.sort(tk), args.rounds, torch.cuda.synchronize)
        print(f"  torch.sort {t_torch * 1e3:.2f} ms: qdc / torch = {t_sort / t_torch:.2f}")


if __name__ == "__main__":
    main()
