"""Kernels using more arrays than a shader may bind, as Genesis's are (its kernels take dozens of
ndarrays through dataclass parameters; lavapipe binds 32 storage buffers per shader, and a kernel
binding more crashed it): the Vulkan target reaches such a task's fields and ndarrays through
buffer device addresses. Their modules pass spirv-val and declare PhysicalStorageBuffer64
addressing; on Vulkan their loads, stores, u1 and vector elements and atomics equal numpy's; a
device that binds fewer buffers than a task asks refuses it at load, naming its limit. Each
array's base pointer, and each launch word, is made once, in the entry block, not per access."""
import collections
import dataclasses
import re

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.spirv import tools
from qdc.compiler.targets.vulkan import target as vulkan_target
from qdc.compiler.targets.vulkan.target import MAX_BOUND_BUFFERS
from qdc.runtime.contract.artifact_schema import check_kernel_meta

INT_MEMBERS = ("parent_idx", "root_idx", "q_start", "dof_start", "joint_start", "q_end", "dof_end", "joint_end",
               "entity_idx", "geom_start", "geom_end", "vgeom_start", "vgeom_end")


@dataclasses.dataclass(frozen=True)
class LinksInfo:
    parent_idx: qd.types.ndarray()
    root_idx: qd.types.ndarray()
    q_start: qd.types.ndarray()
    dof_start: qd.types.ndarray()
    joint_start: qd.types.ndarray()
    q_end: qd.types.ndarray()
    dof_end: qd.types.ndarray()
    joint_end: qd.types.ndarray()
    entity_idx: qd.types.ndarray()
    geom_start: qd.types.ndarray()
    geom_end: qd.types.ndarray()
    vgeom_start: qd.types.ndarray()
    vgeom_end: qd.types.ndarray()
    is_fixed: qd.types.ndarray()
    n_dofs: qd.types.ndarray()
    pos: qd.types.ndarray()


@dataclasses.dataclass(frozen=True)
class LinksState:
    pos: qd.types.ndarray()
    quat: qd.types.ndarray()


@qd.kernel
def init_links(
    links_parent_idx: qd.types.ndarray(), links_root_idx: qd.types.ndarray(), links_q_start: qd.types.ndarray(),
    links_dof_start: qd.types.ndarray(), links_joint_start: qd.types.ndarray(), links_q_end: qd.types.ndarray(),
    links_dof_end: qd.types.ndarray(), links_joint_end: qd.types.ndarray(), links_entity_idx: qd.types.ndarray(),
    links_geom_start: qd.types.ndarray(), links_geom_end: qd.types.ndarray(), links_vgeom_start: qd.types.ndarray(),
    links_vgeom_end: qd.types.ndarray(), links_is_fixed: qd.types.ndarray(), links_pos: qd.types.ndarray(),
    links_quat: qd.types.ndarray(), info: LinksInfo, state: LinksState, fixed_count: qd.template(),
):
    for i_l in range(links_parent_idx.shape[0]):
        info.parent_idx[i_l] = links_parent_idx[i_l]
        info.root_idx[i_l] = links_root_idx[i_l]
        info.q_start[i_l] = links_q_start[i_l]
        info.dof_start[i_l] = links_dof_start[i_l]
        info.joint_start[i_l] = links_joint_start[i_l]
        info.q_end[i_l] = links_q_end[i_l]
        info.dof_end[i_l] = links_dof_end[i_l]
        info.joint_end[i_l] = links_joint_end[i_l]
        info.n_dofs[i_l] = links_dof_end[i_l] - links_dof_start[i_l]
        info.entity_idx[i_l] = links_entity_idx[i_l]
        info.geom_start[i_l] = links_geom_start[i_l]
        info.geom_end[i_l] = links_geom_end[i_l]
        info.vgeom_start[i_l] = links_vgeom_start[i_l]
        info.vgeom_end[i_l] = links_vgeom_end[i_l]
        info.is_fixed[i_l] = links_is_fixed[i_l]
        for j in qd.static(range(3)):
            info.pos[i_l][j] = links_pos[i_l, j]

    for i_l, i_b in qd.ndrange(links_parent_idx.shape[0], state.pos.shape[1]):
        if info.parent_idx[i_l] == -1 and info.is_fixed[i_l]:
            for j in qd.static(range(4)):
                state.quat[i_l, i_b][j] = links_quat[i_l, j]
            for j in qd.static(range(3)):
                state.pos[i_l, i_b][j] = links_pos[i_l, j] * (i_b + 1)
            fixed_count[None] += 1


NP_TO_QD = {np.int32: qd.i32, np.float32: qd.f32, np.bool_: qd.u1}


@qd.kernel
def weighted_sum(a0: qd.types.ndarray(qd.f32, 1), a1: qd.types.ndarray(qd.f32, 1), a2: qd.types.ndarray(qd.f32, 1),
                 a3: qd.types.ndarray(qd.f32, 1), a4: qd.types.ndarray(qd.f32, 1), a5: qd.types.ndarray(qd.f32, 1),
                 a6: qd.types.ndarray(qd.f32, 1), a7: qd.types.ndarray(qd.f32, 1), a8: qd.types.ndarray(qd.f32, 1),
                 a9: qd.types.ndarray(qd.f32, 1), a10: qd.types.ndarray(qd.f32, 1), a11: qd.types.ndarray(qd.f32, 1),
                 a12: qd.types.ndarray(qd.f32, 1), a13: qd.types.ndarray(qd.f32, 1), a14: qd.types.ndarray(qd.f32, 1),
                 a15: qd.types.ndarray(qd.f32, 1), a16: qd.types.ndarray(qd.f32, 1), a17: qd.types.ndarray(qd.f32, 1),
                 a18: qd.types.ndarray(qd.f32, 1), a19: qd.types.ndarray(qd.f32, 1), a20: qd.types.ndarray(qd.f32, 1),
                 a21: qd.types.ndarray(qd.f32, 1), a22: qd.types.ndarray(qd.f32, 1), a23: qd.types.ndarray(qd.f32, 1),
                 a24: qd.types.ndarray(qd.f32, 1), a25: qd.types.ndarray(qd.f32, 1), a26: qd.types.ndarray(qd.f32, 1),
                 flags: qd.types.ndarray(qd.u1, 1), out: qd.types.ndarray(qd.f64, 1),
                 total: qd.types.ndarray(qd.f32, 1)):
    for i in range(out.shape[0]):
        s = (a0[i] + 2 * a1[i] + 3 * a2[i] + 4 * a3[i] + 5 * a4[i] + 6 * a5[i] + 7 * a6[i] + 8 * a7[i] + 9 * a8[i]
             + 10 * a9[i] + 11 * a10[i] + 12 * a11[i] + 13 * a12[i] + 14 * a13[i] + 15 * a14[i] + 16 * a15[i]
             + 17 * a16[i] + 18 * a17[i] + 19 * a18[i] + 20 * a19[i] + 21 * a20[i] + 22 * a21[i] + 23 * a22[i]
             + 24 * a23[i] + 25 * a24[i] + 26 * a25[i] + 27 * a26[i])
        if flags[i]:
            out[i] = qd.cast(s, qd.f64)
        qd.atomic_add(total[0], s)


def test_a_task_of_many_arrays_reaches_them_by_address_and_passes_spirv_val():
    k = weighted_sum._primal
    compiled = K.compile_kernel(k.fn, k.params, Options(), arch="vulkan")
    check_kernel_meta(compiled.meta.to_dict())
    task = compiled.meta.tasks[0]
    module = compiled.artifacts["spirv_t0"]
    assert tools.validate(module) is None, tools.validate(module)
    assert [b[2] for b in task.bindings] == ["args", "addresses"]
    assert sorted(task.launch["addressed"], key=lambda a: a[1]) == [["ndarray", i] for i in range(30)]
    assert "PhysicalStorageBuffer64" in tools.disassemble(module)


def entry_block_and_body(module: bytes) -> tuple[list, list]:
    """The lines of the entry function's first block (up to its first branch or merge) and all of its lines."""
    lines = tools.disassemble(module).splitlines()
    start = next(n for n, line in enumerate(lines) if " OpFunction " in line)
    body = lines[start:]
    end = next(n for n, line in enumerate(body) if re.search(r"\bOp(Branch|BranchConditional|SelectionMerge|"
                                                             r"LoopMerge|Return)\b", line))
    return body[:end], body


@qd.kernel
def signed_band_sums(a: qd.types.ndarray(qd.f32, 2), width: qd.i32, out: qd.types.ndarray(qd.f32, 1)):
    for i in range(out.shape[0]):
        s = 0.0
        for j in range(width):  # a dynamic loop, a branch, extents: what each access reads is hoisted
            if a[i, j] > 0:
                s += a[i, j]
            else:
                s -= a[i, (j + 1) % a.shape[1]]
        out[i] = s


@pytest.fixture
def every_array_by_address(monkeypatch):
    monkeypatch.setattr(vulkan_target, "MAX_BOUND_BUFFERS", 1)


@pytest.mark.parametrize("kernel", [weighted_sum, signed_band_sums], ids=["weighted_sum", "signed_band_sums"])
def test_each_array_base_and_launch_word_is_made_once_in_the_entry_block(kernel, every_array_by_address):
    k = kernel._primal
    compiled = K.compile_kernel(k.fn, k.params, Options(), arch="vulkan")
    for i, task in enumerate(compiled.meta.tasks):
        module = compiled.artifacts[f"spirv_t{i}"]
        assert tools.validate(module) is None, tools.validate(module)
        entry, body = entry_block_and_body(module)
        launch_words = [line.split()[-3:] for line in body if re.search(r"OpAccessChain \S+ %(args|addresses) ", line)]
        assert launch_words and max(collections.Counter(map(tuple, launch_words)).values()) == 1, launch_words
        assert all(line in entry for line in body if re.search(r"OpAccessChain \S+ %(args|addresses) ", line))
        bases = [line for line in body if "OpConvertUToPtr" in line]
        assert len(bases) == len(task.launch.get("addressed", ())) > 0
        assert all(line in entry for line in bases)
        assert "OpDecorate %args NonWritable" in tools.disassemble(module)


def test_hoisted_bases_and_extents_in_loops_and_branches_on_vulkan_equal_numpy(vulkan_runtime, rng,
                                                                             every_array_by_address):
    rows, cols, width = 29, 7, 5
    values = rng.standard_normal((rows, cols)).astype(np.float32)
    a, out = qd.ndarray(qd.f32, shape=(rows, cols)), qd.ndarray(qd.f32, shape=(rows,))
    a.from_numpy(values)
    signed_band_sums(a, width, out)
    expected = np.zeros(rows)
    for j in range(width):
        expected += np.where(values[:, j] > 0, values[:, j], -values[:, (j + 1) % cols])
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-5, atol=1e-5)


def test_many_arrays_on_vulkan_equal_numpy(vulkan_runtime, rng):
    n = 37
    values = [rng.standard_normal(n).astype(np.float32) for _ in range(27)]
    flags = rng.random(n) < 0.5
    arrays = []
    for v in values:
        arrays.append(qd.ndarray(qd.f32, shape=(n,)))
        arrays[-1].from_numpy(v)
    f, out, total = qd.ndarray(qd.u1, shape=(n,)), qd.ndarray(qd.f64, shape=(n,)), qd.ndarray(qd.f32, shape=(1,))
    f.from_numpy(flags)
    # the same arrays again (the launch plan's addresses), then in another order (new addresses)
    for order in (arrays, arrays, arrays[::-1]):
        total.from_numpy(np.zeros(1, np.float32))
        weighted_sum(*order, f, out, total)
        ordered = values if order[0] is arrays[0] else values[::-1]
        s = sum((w + 1) * v.astype(np.float64) for w, v in enumerate(ordered))
        np.testing.assert_allclose(out.to_numpy(), np.where(flags, s, 0), rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(total.to_numpy()[0], s.sum(), rtol=1e-4, atol=1e-3)


def test_genesis_style_dataclass_kernel_on_vulkan_equals_numpy(vulkan_runtime, rng):
    n_links, n_envs = 9, 3
    ints = {name: rng.integers(-1, 40, n_links).astype(np.int32) for name in INT_MEMBERS}
    ints["parent_idx"][rng.random(n_links) < 0.5] = -1
    given = dict(ints, is_fixed=rng.random(n_links) < 0.5, pos=rng.standard_normal((n_links, 3)).astype(np.float32),
                 quat=rng.standard_normal((n_links, 4)).astype(np.float32))
    device = {}
    for name, value in given.items():
        device[name] = qd.ndarray(NP_TO_QD[value.dtype.type], shape=value.shape)
        device[name].from_numpy(value)
    info = LinksInfo(**{name: qd.ndarray(qd.i32, shape=(n_links,)) for name in INT_MEMBERS + ("n_dofs",)},
                     is_fixed=qd.ndarray(qd.u1, shape=(n_links,)), pos=qd.Vector.ndarray(3, qd.f32, shape=(n_links,)))
    state = LinksState(pos=qd.Vector.ndarray(3, qd.f32, shape=(n_links, n_envs)),
                       quat=qd.Vector.ndarray(4, qd.f32, shape=(n_links, n_envs)))
    fixed_count = qd.field(qd.i32, shape=())
    init_links(*(device[name] for name in INT_MEMBERS), device["is_fixed"], device["pos"], device["quat"],
               info, state, fixed_count)
    for name in INT_MEMBERS:
        np.testing.assert_array_equal(getattr(info, name).to_numpy(), ints[name], err_msg=name)
    np.testing.assert_array_equal(info.n_dofs.to_numpy(), ints["dof_end"] - ints["dof_start"])
    np.testing.assert_array_equal(info.is_fixed.to_numpy(), given["is_fixed"])
    np.testing.assert_array_equal(info.pos.to_numpy(), given["pos"])
    root = (ints["parent_idx"] == -1) & given["is_fixed"]
    scale = np.arange(1, n_envs + 1, dtype=np.float32)[None, :, None]
    np.testing.assert_allclose(state.pos.to_numpy(), np.where(root[:, None, None], given["pos"][:, None] * scale, 0))
    np.testing.assert_array_equal(state.quat.to_numpy(),
                                  np.where(root[:, None, None], given["quat"][:, None].repeat(n_envs, 1), 0))
    assert fixed_count[None] == root.sum() * n_envs


def test_a_device_binding_fewer_buffers_refuses_the_task_at_load(vulkan_runtime, monkeypatch):
    caps = dataclasses.replace(vulkan_runtime.capabilities, max_bound_storage_buffers=2)
    monkeypatch.setattr(vulkan_runtime, "capabilities", caps)
    a, b = qd.ndarray(qd.f32, shape=(4,)), qd.ndarray(qd.f32, shape=(4,))

    @qd.kernel
    def copy(src: qd.types.ndarray(qd.f32, 1), dst: qd.types.ndarray(qd.f32, 1)):
        for i in range(src.shape[0]):
            dst[i] = src[i]

    with pytest.raises(ValueError, match=r"binds 3 storage buffers, more than the Vulkan device .* \(2\)"):
        copy(a, b)
