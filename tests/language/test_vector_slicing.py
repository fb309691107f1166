"""Slicing vectors and matrices as Quadrants does (`m[i, :]`, `m[:, j]`, `v[1:3]`, negative and
stepped slices, sub-matrices), read and assigned, with compile-time and run-time integer
indices on the other axis, on locals and on vector/matrix field elements; tuples sliced at
compile time. Checked against numpy slicing of the same values."""
import numpy as np

import qdc as qd


def test_slices_read(arch, rng):
    out = qd.field(qd.f32, shape=20)
    mv = rng.standard_normal((3, 4)).astype(np.float32)
    vv = rng.standard_normal(5).astype(np.float32)

    @qd.kernel
    def k(m: qd.types.matrix(3, 4, qd.f32), v: qd.types.vector(5, qd.f32), i: qd.i32, j: qd.i32):
        r = m[i, :]
        c = m[:, j]
        s = v[1:3]
        back = v[::-2]
        tail = v[-2:]
        sub = m[1:, ::2]
        for t in qd.static(range(4)):
            out[t] = r[t]
        for t in qd.static(range(3)):
            out[4 + t] = c[t] + back[t]
        out[7] = s[0] - s[1]
        out[8] = tail[0] * tail[1]
        for a in qd.static(range(2)):
            for b in qd.static(range(2)):
                out[9 + 2 * a + b] = sub[a, b]

    for i, j in ((0, 3), (2, 1)):
        k(mv, vv, i, j)
        got = out.to_numpy()
        np.testing.assert_array_equal(got[:4], mv[i, :])
        np.testing.assert_allclose(got[4:7], mv[:, j] + vv[::-2], rtol=1e-6)
        np.testing.assert_allclose(got[7], vv[1] - vv[2], rtol=1e-6)
        np.testing.assert_allclose(got[8], vv[-2] * vv[-1], rtol=1e-6)
        np.testing.assert_array_equal(got[9:13], mv[1:, ::2].ravel())


def test_slices_assigned_on_locals_and_field_elements(arch, rng):
    mf = qd.Matrix.field(3, 3, qd.f32, shape=2)
    vf = qd.Vector.field(4, qd.f32, shape=2)
    mv = rng.standard_normal((3, 3)).astype(np.float32)
    add = rng.standard_normal(3).astype(np.float32)

    @qd.kernel
    def k(m: qd.types.matrix(3, 3, qd.f32), a: qd.types.vector(3, qd.f32), i: qd.i32, j: qd.i32):
        m[i, :] = a
        m[:, j] += a * 2
        m[0, 1:] = qd.Vector([a[0], a[1]])
        mf[0] = m
        mf[1][i, :] = a
        mf[1][:, j] -= a
        vf[0][1:3] = qd.Vector([a[2], a[0]])
        vf[1][::-1] = qd.Vector([1.0, 2.0, 3.0, 4.0])

    i, j = 2, 0
    k(mv, add, i, j)
    want = mv.copy()
    want[i, :] = add
    want[:, j] += add * 2
    want[0, 1:] = add[:2]
    np.testing.assert_allclose(mf.to_numpy()[0], want, rtol=1e-6)
    want1 = np.zeros((3, 3), np.float32)
    want1[i, :] = add
    want1[:, j] -= add
    np.testing.assert_allclose(mf.to_numpy()[1], want1, rtol=1e-6)
    np.testing.assert_array_equal(vf.to_numpy()[0], [0, add[2], add[0], 0])
    np.testing.assert_array_equal(vf.to_numpy()[1], [4, 3, 2, 1])


def test_tuples_slice_at_compile_time(arch):
    out = qd.field(qd.i32, shape=4)
    caps = (3, 5, 7, 9)

    @qd.kernel
    def k():
        for t, c in qd.static(enumerate(caps[1:3])):
            out[t] = c
        out[2] = qd.static(sum(caps[::-2]))

    k()
    assert list(out.to_numpy()[:3]) == [5, 7, 9 + 5]
