"""`qd.graph.do_while` loops as device-side loops: a graph=True kernel with do_while loops is one
executable graph whose loops are conditional WHILE nodes (CUDA 12.4+ drivers), so a launch
never waits for the host between passes.

A loop becomes, in its graph: a node setting the loop's condition handle to 1 (a do-while
runs its body at least once, and a nested loop must start anew at every pass of the loop
around it), then the WHILE node; its body graph holds the body's task nodes in order and
ends with a node that sets the handle from the flag (nonzero: run the body again). Both
setters are one kernel, `qdc_set_condition(handle, flag)` (flag 0: set 1), a few lines of PTX
calling the device runtime's `cudaGraphSetConditional`, which lives in libcudadevrt.a: the
PTX is linked with it (cuLink) when the first such kernel is launched. The flags' device
addresses are written into the setter nodes, so a launch with another flag array builds
another graph (the kernel keeps the most recent, as for graph=True kernels).

Where the driver is older, the binding lacks a call, or libcudadevrt.a is not found (the
nvidia-cuda-runtime wheel, CUDA_HOME, /usr/local/cuda), `unavailable` says why and such
kernels keep the host loop (runtime/graph_loops.py): the same results, a 4-byte read a pass.
"""
from __future__ import annotations

import ctypes
import glob
import os

SETTER_ENTRY = "qdc_set_condition"
MIN_DRIVER = 12040  # conditional WHILE nodes and cudaGraphSetConditional: CUDA 12.4
_CALLS = ("cuDriverGetVersion", "cuGraphCreate", "cuGraphAddKernelNode", "cuGraphAddNode",
          "cuGraphConditionalHandleCreate", "cuLinkCreate", "cuLinkAddData", "cuLinkAddFile", "cuLinkComplete",
          "cuLinkDestroy", "CUgraphNodeParams", "CUDA_KERNEL_NODE_PARAMS")

SETTER_PTX = f"""
.version 7.0
.target sm_70
.address_size 64
.extern .func cudaGraphSetConditional(.param .b64 handle, .param .b32 value);
.visible .entry {SETTER_ENTRY}(.param .u64 handle, .param .u64 flag)
{{
  .reg .pred %p;
  .reg .b32 %r<3>;
  .reg .b64 %rd<3>;
  ld.param.u64 %rd1, [handle];
  ld.param.u64 %rd2, [flag];
  mov.u32 %r2, 1;
  setp.eq.u64 %p, %rd2, 0;
  @%p bra SET;
  cvta.to.global.u64 %rd2, %rd2;
  ld.global.u32 %r1, [%rd2];
  setp.ne.u32 %p, %r1, 0;
  selp.u32 %r2, 1, 0, %p;
SET:
  {{
  .param .b64 handle_arg;
  .param .b32 value_arg;
  st.param.b64 [handle_arg], %rd1;
  st.param.b32 [value_arg], %r2;
  call.uni cudaGraphSetConditional, (handle_arg, value_arg);
  }}
  ret;
}}
""".encode()


def find_cudadevrt() -> str | None:
    """libcudadevrt.a of the nvidia-cuda-runtime wheel, else of a CUDA toolkit."""
    places = []
    try:
        import nvidia  # the namespace package of NVIDIA's wheels
        for root in getattr(nvidia, "__path__", []):
            places += sorted(glob.glob(os.path.join(root, "*", "lib", "libcudadevrt.a")))
    except ImportError:
        pass
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            places += [os.path.join(home, sub, "libcudadevrt.a")
                       for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib"))]
    return next((p for p in places if os.path.isfile(p)), None)


class ConditionalGraphs:
    """The conditional-node graphs of one CUDA device (`device`: its binding `cu`, `context`,
    `driver`, `calls`)."""

    def __init__(self, device):
        self.device, self.cu = device, device.cu
        self.setter = None
        self.unavailable = self._why_unavailable()

    def _why_unavailable(self) -> str | None:
        cu = self.cu
        missing = [name for name in _CALLS if getattr(cu, name, None) is None]
        if missing:
            return f"the CUDA binding lacks {', '.join(missing)}"
        err, version = cu.cuDriverGetVersion()
        if err != self.device.driver.ok or version < MIN_DRIVER:
            return f"the driver is CUDA {version // 1000}.{version % 1000 // 10}, conditional nodes need 12.4"
        library = find_cudadevrt()
        if library is None:
            return "libcudadevrt.a was not found (pip install nvidia-cuda-runtime, or set CUDA_HOME)"
        try:
            self.setter = self._link_setter(library)
        except RuntimeError as e:
            return f"linking the condition setter with {library} failed ({e})"
        return None

    def _link_setter(self, library: str):
        cu, d = self.cu, self.device.driver
        state = d.check(cu.cuLinkCreate(0, [], []), "cuLinkCreate")
        try:
            d.check(cu.cuLinkAddData(state, cu.CUjitInputType.CU_JIT_INPUT_PTX, SETTER_PTX, len(SETTER_PTX),
                                     b"qdc_set_condition.ptx", 0, [], []), "cuLinkAddData")
            d.check(cu.cuLinkAddFile(state, cu.CUjitInputType.CU_JIT_INPUT_LIBRARY, library.encode(), 0, [], []),
                    "cuLinkAddFile(libcudadevrt.a)")
            cubin, size = d.check(cu.cuLinkComplete(state), "cuLinkComplete")
            image = ctypes.string_at(int(cubin), int(size))
        finally:
            cu.cuLinkDestroy(state)
        module = d.check(cu.cuModuleLoadData(image), "loading the condition setter")
        return d.check(cu.cuModuleGetFunction(module, SETTER_ENTRY.encode()), "cuModuleGetFunction")

    # ---- building ---------------------------------------------------------------------------
    def build(self, loaded, copy, slices: list, steps: list, flags: dict):
        """An executable graph of `steps` (graph_loops.loop_steps), task i on `slices[i]`
        thread slices, loop flags at the device addresses `flags` (parameter -> address)."""
        d = self.device.driver
        graph = d.check(self.cu.cuGraphCreate(0), "cuGraphCreate")
        try:
            self._add_steps(graph, [], steps, loaded, copy, slices, flags)
            return d.check(self.device.calls.graph_instantiate(graph),
                           f"instantiating the graph of kernel '{loaded.meta.name}'")
        finally:
            self.cu.cuGraphDestroy(graph)  # the executable graph keeps what it needs

    def _add_steps(self, graph, deps: list, steps: list, loaded, copy, slices, flags) -> list:
        cu, d = self.cu, self.device.driver
        for step in steps:
            if isinstance(step, int):
                if slices[step] > 0:
                    t = loaded.tasks[step]
                    deps = [self._kernel_node(graph, deps, t.function, -(-slices[step] // t.block_dim), t.block_dim,
                                              copy.params_address)]
                continue
            flag, body = step
            handle = d.check(cu.cuGraphConditionalHandleCreate(graph, self.device.context, 1, 0),
                             "cuGraphConditionalHandleCreate")
            deps = [self._set_condition(graph, deps, handle, 0)]
            params = cu.CUgraphNodeParams()
            params.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
            params.conditional.handle = handle
            params.conditional.type = cu.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
            params.conditional.size = 1
            params.conditional.ctx = self.device.context
            node = self._add_node(graph, deps, params)
            body_graph = params.conditional.phGraph_out[0]
            inner = self._add_steps(body_graph, [], body, loaded, copy, slices, flags)
            self._set_condition(body_graph, inner, handle, flags[flag])
            deps = [node]
        return deps

    def _add_node(self, graph, deps: list, params):
        """cuGraphAddNode, whose signature gained edge data (CUDA 12.3's _v2, CUDA 13's plain)."""
        cu, d = self.cu, self.device.driver
        add = cu.cuGraphAddNode
        if "dependencyData" not in (add.__doc__ or "") and getattr(cu, "cuGraphAddNode_v2", None) is None:
            return d.check(add(graph, deps, len(deps), params), "cuGraphAddNode")
        if "dependencyData" not in (add.__doc__ or ""):
            add = cu.cuGraphAddNode_v2
        return d.check(add(graph, deps, None, len(deps), params), "cuGraphAddNode")

    def _kernel_node(self, graph, deps: list, function, blocks: int, block_dim: int, params_address: int):
        cu = self.cu
        p = cu.CUDA_KERNEL_NODE_PARAMS()
        p.func = function
        p.gridDimX, p.gridDimY, p.gridDimZ = blocks, 1, 1
        p.blockDimX, p.blockDimY, p.blockDimZ = block_dim, 1, 1
        p.sharedMemBytes = 0
        p.kernelParams = params_address  # copied by the driver when the node is made
        p.extra = 0
        return self.device.driver.check(cu.cuGraphAddKernelNode(graph, deps, len(deps), p), "cuGraphAddKernelNode")

    def _set_condition(self, graph, deps: list, handle, flag_address: int):
        """A node setting `handle` to (*flag != 0), or to 1 where `flag_address` is 0."""
        values = (ctypes.c_uint64 * 2)(int(handle), flag_address)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(values), ctypes.addressof(values) + 8)
        return self._kernel_node(graph, deps, self.setter, 1, 1, ctypes.addressof(params))
