"""Random differentiable programs: qdc's reverse-mode gradient against float64 central differences
of the same program run as plain Python (math module), fresh programs and inputs every run.

Each program carries a float through a dynamic inner loop (trip count from a field, so the
carried values live on adstacks), with math functions, integer conditions that do not depend on
the differentiated inputs (so the program is smooth in them), and a kernel-scope `+=` into the
loss. On the CPU in f64 against tight tolerances; on other arches in f32 (SPIR-V adstacks hold
f32 only) against f32-sized ones. A failure prints the program.

Random maps can be chaotic (a loop whose slope exceeds 1 amplifies an ulp of difference in a
math function beyond any fixed tolerance), so each tolerance also allows what the reference
itself moves by when its math functions are perturbed by a few ulps (consistently between the
two sides of a central difference), and the central differences' own truncation error.
"""
from __future__ import annotations

import math
import uuid

import numpy as np
import pytest

import qdc as qd

MATH_FUNCTIONS = ("sin", "cos", "tanh", "exp", "log", "sqrt", "pow")


class _PerturbedMath:
    """The math module's functions, each result scaled by (1 + its call's entry of `noise`) plus
    `absolute` times it: the n-th call of an evaluation gets the n-th entry, so two evaluations
    that make the same calls (the two sides of a central difference) see the same perturbed
    functions. No noise: the math module itself."""

    def __init__(self, noise=None, absolute: float = 0.0):
        self.noise, self.absolute, self.calls = noise, absolute, 0
        for name in MATH_FUNCTIONS:
            setattr(self, name, self._wrap(getattr(math, name)))

    def _wrap(self, fn):
        if self.noise is None:
            return fn

        def perturbed(*args):
            e = self.noise[self.calls % len(self.noise)]
            self.calls += 1
            return fn(*args) * (1 + e) + self.absolute * e
        return perturbed


class _SmoothExpr:
    """Random bounded, smooth expressions over the given variable names."""

    def __init__(self, rng):
        self.rng = rng

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    def leaf(self, names):
        if self.rng.random() < 0.25:
            return f"{self.rng.uniform(-2, 2):.3f}"
        return self.pick(names)

    def expr(self, names, depth: int) -> str:
        if depth == 0 or self.rng.random() < 0.2:
            return self.leaf(names)
        a, b = self.expr(names, depth - 1), self.expr(names, depth - 1)
        return self.pick([
            f"({a} + {b})", f"({a} - {b})", f"({a} * {b})", f"({a} / (2.0 + qd.sin({b})))",
            f"qd.sin({a})", f"qd.cos({a})", f"qd.tanh({a})", f"qd.exp(qd.tanh({a}))",
            f"qd.log(2.0 + qd.sin({a}))", f"qd.sqrt(1.0 + {a} * {a})", f"qd.pow(1.5 + qd.sin({a}), 2.5)",
        ])


def _program_body(rng) -> list[str]:
    """Statements computing `v` from p, q (differentiated) and ci (an int), with `N` iterations."""
    gen = _SmoothExpr(rng)
    lines = [f"v = {gen.expr(['p', 'q'], 2)}",
             "for k in range(N):",
             f"    v = qd.tanh({gen.expr(['v', 'p', 'q'], 3)}) * 1.5"]
    if rng.random() < 0.7:
        lines += [f"    if (ci + k) % {int(rng.integers(2, 4))} == 0:",
                  f"        v = v + {gen.expr(['v', 'p'], 2)} * 0.5"]
    lines.append(f"v = {gen.expr(['v', 'p', 'q'], 2)}")
    return lines


def _kernel_source(body: list[str], dtype: str) -> str:
    lines = ["import qdc as qd", "", f"x = qd.field(qd.{dtype}, shape=8, needs_grad=True)",
             f"w = qd.field(qd.{dtype}, shape=8, needs_grad=True)", "c = qd.field(qd.i32, shape=8)",
             "n = qd.field(qd.i32, shape=())", f"loss = qd.field(qd.{dtype}, shape=(), needs_grad=True)", "",
             "@qd.kernel", "def program():", "    for i in x:", "        p, q, ci = x[i], w[i], c[i]"]
    lines += ["        " + line.replace("range(N)", "range(n[None])") for line in body]
    lines += ["        loss[None] += v", ""]
    return "\n".join(lines)


def _python_reference(body: list[str], math_functions: _PerturbedMath):
    """reference(p, q, ci, N): the program's v for one element, float64, through `math_functions`."""
    source = "def program(p, q, ci, N):\n" + "".join(f"    {line}\n" for line in body) + "    return v\n"
    namespace = {"qd": math_functions}
    exec(compile(source, "<random program>", "exec"), namespace)  # noqa: S102 (our own generated text)

    def reference(*args):
        math_functions.calls = 0
        return namespace["program"](*args)
    return reference


def _loss_and_central_differences(reference, p, q, ci, trips, step: float = 1e-6):
    """(the loss, d loss / dp and / dq per element), float64."""
    grads = np.zeros((2, len(p)))
    for i in range(len(p)):
        for which, value in enumerate((p[i], q[i])):
            h = step * max(1.0, abs(value))
            args = [p[i], q[i]]
            args[which] = value + h
            up = reference(*args, int(ci[i]), trips)
            args[which] = value - h
            down = reference(*args, int(ci[i]), trips)
            grads[which, i] = (up - down) / (2 * h)
    return sum(reference(p[i], q[i], int(ci[i]), trips) for i in range(len(p))), grads


def _reference_and_its_uncertainty(body, rng, p, q, ci, trips, ulps: float, absolute: float):
    """The reference loss and gradients, and per value how far they may honestly be off: what a
    few-ulp perturbation of the math functions moves them by (x8) plus the central
    differences' truncation error (their change from step h to 2h)."""
    loss, grads = _loss_and_central_differences(_python_reference(body, _PerturbedMath()), p, q, ci, trips)
    _, coarse = _loss_and_central_differences(_python_reference(body, _PerturbedMath()), p, q, ci, trips, 2e-6)
    loss_spread, grad_spread = 0.0, np.abs(coarse - grads)
    for _ in range(3):
        noisy = _PerturbedMath(rng.uniform(-ulps, ulps, 997), absolute)
        other_loss, other_grads = _loss_and_central_differences(_python_reference(body, noisy), p, q, ci, trips)
        loss_spread = max(loss_spread, 8 * abs(other_loss - loss))
        grad_spread = np.maximum(grad_spread, 8 * np.abs(other_grads - grads))
    return loss, grads, loss_spread, grad_spread


@pytest.mark.parametrize("case", range(6))
def test_random_program_gradients_match_central_differences(arch, rng, tmp_path, monkeypatch, case):
    dtype = "f64" if arch == "cpu" else "f32"
    rtol, atol_scale = (1e-6, 1e-7) if dtype == "f64" else (2e-3, 2e-3)
    body = _program_body(rng)
    path = tmp_path / f"random_grad_{arch}_{uuid.uuid4().hex[:8]}.py"  # a module name of its own per case
    path.write_text(_kernel_source(body, dtype), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(path.stem)

    p, q = rng.uniform(-1.5, 1.5, 8), rng.uniform(-1.5, 1.5, 8)
    ci, trips = rng.integers(0, 5, 8), int(rng.integers(3, 12))
    np_float = np.float64 if dtype == "f64" else np.float32
    p, q = p.astype(np_float).astype(np.float64), q.astype(np_float).astype(np.float64)  # what the kernel sees
    module.x.from_numpy(p.astype(np_float))
    module.w.from_numpy(q.astype(np_float))
    module.c.from_numpy(ci.astype(np.int32))
    module.n[None] = trips
    with qd.ad.Tape(loss=module.loss):
        module.program()

    program = path.read_text(encoding="utf-8")
    ulp = 2.0 ** -52 if dtype == "f64" else 2.0 ** -23
    # f32 on a GPU: the driver's functions (Vulkan: sin/cos to an absolute error) and f32 rounding
    want_loss, want, loss_spread, grad_spread = _reference_and_its_uncertainty(
        body, rng, p, q, ci, trips, ulps=4 * ulp, absolute=0.0 if dtype == "f64" else 2.0 ** -20)
    allowed = rtol * abs(want_loss) + atol_scale + loss_spread
    assert abs(module.loss[None] - want_loss) <= allowed, (module.loss[None], want_loss, allowed, program)
    scale = atol_scale * (1 + np.abs(want).max())
    for got, expect, spread, name in ((module.x.grad.to_numpy(), want[0], grad_spread[0], "x"),
                                      (module.w.grad.to_numpy(), want[1], grad_spread[1], "w")):
        error = np.abs(got.astype(np.float64) - expect)
        bad = np.flatnonzero(error > rtol * np.abs(expect) + scale + spread)
        assert bad.size == 0, (f"d loss / d {name} at {bad}: got {got[bad]}, want {expect[bad]} "
                               f"(allowed {spread[bad]} for the program's conditioning) of\n{program}")
