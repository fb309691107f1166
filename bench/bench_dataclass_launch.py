"""Launch cost of a kernel taking a dataclass against the same kernel taking its members:
`python3 bench/bench_dataclass_launch.py [--rounds 9] [--calls 20000]`.

Kernels reading the same two arrays and a scalar, launched back to back on the CPU (a kernel
of one element: the launch is all there is to time), min and median of rounds, in one process:
the members as parameters (`k(a, b, n)`, the reference), a frozen dataclass holding them
(`k(state)`: the kernel's dispatch, compiler/jit/variant_dispatch.py), the same with a config
object that compares by value as a template argument (as Genesis passes its static configs)
and an untyped ndarray parameter (`qd.types.ndarray()`: its dtype and rank key the variant), and
a mutable dataclass (keyed at every call: the slow path). Prints a table with the ratios to the
reference.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import timeit

import numpy as np

import qdc as qd


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: qd.types.ndarray(dtype=qd.f32, ndim=1)
    b: qd.types.ndarray(dtype=qd.f32, ndim=1)
    n: qd.i32


@dataclasses.dataclass
class Mutable:
    a: qd.types.ndarray(dtype=qd.f32, ndim=1)
    b: qd.types.ndarray(dtype=qd.f32, ndim=1)
    n: qd.i32


@qd.kernel
def members(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1), n: qd.i32):
    for i in range(n):
        b[i] = a[i] * 2.0


@qd.kernel
def frozen(s: Frozen):
    for i in range(s.n):
        s.b[i] = s.a[i] * 2.0


class Config:
    """A static config that compares by value, as Genesis's do (its own __eq__ and __hash__)."""

    def __init__(self, factor):
        self.factor = factor

    def __eq__(self, other):
        return type(other) is Config and vars(other) == vars(self)

    def __hash__(self):
        return hash((Config, self.factor))


@qd.kernel
def configured(s: Frozen, cfg: qd.template(), out: qd.types.ndarray()):
    for i in range(s.n):
        out[i] = s.a[i] * qd.static(cfg.factor)


@qd.kernel
def mutable(s: Mutable):
    for i in range(s.n):
        s.b[i] = s.a[i] * 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    qd.init(arch=qd.cpu)
    a, b = np.ones(1, np.float32), np.zeros(1, np.float32)
    cases = [("members as parameters", lambda: members(a, b, 1)),
             ("frozen dataclass", (lambda s: lambda: frozen(s))(Frozen(a, b, 1))),
             ("frozen dataclass, config template, untyped ndarray",
              (lambda s, c: lambda: configured(s, c, b))(Frozen(a, b, 1), Config(2.0))),
             ("mutable dataclass", (lambda s: lambda: mutable(s))(Mutable(a, b, 1)))]
    results = []
    for name, call in cases:
        call()  # compiled, and its dispatch made
        times = [t / args.calls * 1e9 for t in timeit.repeat(call, number=args.calls, repeat=args.rounds)]
        results.append((name, min(times), statistics.median(times)))
    load = os.getloadavg()[0]
    print(f"| launch (load {load:.1f}) | min ns | median ns | median / members |")
    print("| --- | --- | --- | --- |")
    for name, low, mid in results:
        print(f"| {name} | {low:.0f} | {mid:.0f} | {mid / results[0][2]:.2f} |")


if __name__ == "__main__":
    main()
