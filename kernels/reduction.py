"""Reductions into scalar fields: parallel sums (atomic adds) and a maximum (atomic max)."""
import qdc as qd

total = qd.field(qd.f64, shape=())
largest = qd.field(qd.f32, shape=())


@qd.kernel
def sum_of(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    total[None] = 0.0              # runs once, before the parallel loop
    for i in range(a.shape[0]):
        total[None] += qd.cast(a[i], qd.f64)


@qd.kernel
def dot(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    total[None] = 0.0
    for i in range(a.shape[0]):
        total[None] += qd.cast(a[i] * b[i], qd.f64)


@qd.kernel
def max_abs(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    largest[None] = 0.0
    for i in range(a.shape[0]):
        qd.atomic_max(largest[None], abs(a[i]))
