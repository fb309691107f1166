"""Python identifiers may hold non-ASCII letters; so may kernels, parameters, qd.funcs and struct members.
Native symbols (ELF, PTX, SPIR-V entry points) spell them in ASCII (`KernelIR.symbol`)."""
import dataclasses

import numpy as np

import qdc as qd

F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)


@dataclasses.dataclass
class Maße:
    breite: F32_1D
    höhe: F32_1D


def test_non_ascii_kernel_parameter_and_member_names(arch, rng):
    n = 37
    werte = rng.standard_normal(n).astype(np.float32)
    höhe = rng.standard_normal(n).astype(np.float32)

    @qd.func
    def quadrat(x):
        return x * x

    @qd.kernel
    def größe(maße: Maße, faktor: qd.f32, ergebnis: F32_1D):
        for i in range(ergebnis.shape[0]):
            ergebnis[i] = faktor * quadrat(maße.breite[i]) + maße.höhe[i]

    out = np.zeros(n, np.float32)
    größe(Maße(werte, höhe), 1.5, out)
    np.testing.assert_allclose(out, 1.5 * werte.astype(np.float64) ** 2 + höhe, rtol=1e-6, atol=1e-6)


def test_non_ascii_kernel_gradient(arch, rng):
    n = 23
    x = qd.field(qd.f32, shape=n, needs_grad=True)
    σ = qd.field(qd.f32, shape=(), needs_grad=True)
    x0 = rng.standard_normal(n).astype(np.float32)
    x.from_numpy(x0)

    @qd.kernel
    def summe_der_sinus():
        for i in x:
            σ[None] += qd.sin(x[i])

    summe_der_sinus()
    σ.grad[None] = 1.0
    summe_der_sinus.grad()
    np.testing.assert_allclose(σ[None], np.sin(x0.astype(np.float64)).sum(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), np.cos(x0.astype(np.float64)), rtol=1e-5, atol=1e-6)
