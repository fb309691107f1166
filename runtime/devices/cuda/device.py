"""CUDA device (runtime/device.py's asynchronous protocol) on the CUDA driver API, through
`cuda-bindings` only (driver.py): the stream device of runtime/devices/stream.py (memory,
fenced frees, ctx uploads, launches, adstack heap sizing) with CUDA's calls.

Context and stream. The primary context of GPU `QDC_CUDA_DEVICE` (default 0) and one stream:
every launch, copy and memset goes on it, so stream order alone orders them. A kernel's module
is its PTX (cuModuleLoadData JIT-compiles it for the GPU).
"""
from __future__ import annotations

import os

from ..stream import FILL64_ENTRY, StreamDevice, StreamKernel, StreamTask
from .conditional_graphs import ConditionalGraphs
from .driver import Driver

DEVICE_LOOPS_VARIABLE = "QDC_CUDA_DEVICE_LOOPS"

DEFAULT_BLOCK_DIM = 256
CudaKernel, CudaTask = StreamKernel, StreamTask

# Fills of 8-byte periods (f64, i64, u64 and vectors of equal 32-bit halves are memsets):
# ptr[i] = value for i < count, grid-stride, 64-bit index.
FILL64_PTX = f"""
.version 6.0
.target sm_50
.address_size 64
.visible .entry {FILL64_ENTRY}(.param .u64 ptr, .param .u64 count, .param .u64 value)
{{
  .reg .pred %p;
  .reg .b32 %r<5>;
  .reg .b64 %rd<9>;
  ld.param.u64 %rd1, [ptr];
  ld.param.u64 %rd2, [count];
  ld.param.u64 %rd3, [value];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mov.u32 %r4, %nctaid.x;
  mul.wide.u32 %rd4, %r1, %r2;
  cvt.u64.u32 %rd5, %r3;
  add.u64 %rd4, %rd4, %rd5;
  mul.wide.u32 %rd6, %r4, %r2;
LOOP:
  setp.ge.u64 %p, %rd4, %rd2;
  @%p bra DONE;
  shl.b64 %rd7, %rd4, 3;
  add.u64 %rd8, %rd1, %rd7;
  st.global.u64 [%rd8], %rd3;
  add.u64 %rd4, %rd4, %rd6;
  bra LOOP;
DONE:
  ret;
}}
""".encode() + b"\0"


class CudaDevice(StreamDevice):
    arch = "cuda"
    default_block_dim = DEFAULT_BLOCK_DIM
    _conditional = None  # ConditionalGraphs, made when a kernel with qd.graph.do_while loops first asks

    def __init__(self, device_index: int | None = None):
        d = Driver()
        cu = self.cu = d.cu
        index = int(os.environ.get("QDC_CUDA_DEVICE", "0")) if device_index is None else device_index
        self.device = d.check(cu.cuDeviceGet(index), f"cuDeviceGet({index})")
        self.context = d.check(cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        d.check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        stream = d.check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        name = d.check(cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
        self._set_up_stream(d, d.calls(), stream, d.attribute(self.device, "MULTIPROCESSOR_COUNT"),
                            d.attribute(self.device, "MAX_THREADS_PER_MULTIPROCESSOR"),
                            d.attribute(self.device, "MAX_GRID_DIM_X"))

    def __repr__(self) -> str:
        return f"CudaDevice({self.name!r})"

    def module_image(self, artifacts: dict, meta) -> bytes:
        ptx = artifacts.get("ptx")
        if ptx is None:
            raise ValueError(f"kernel '{meta.name}': no PTX among its artifacts ({', '.join(sorted(artifacts))})")
        return bytes(ptx) + b"\0"

    def fill64_image(self) -> bytes:
        return FILL64_PTX

    def device_loops(self) -> str | None:
        if not self.has_graphs:
            return "the CUDA binding has no graph calls"
        if os.environ.get(DEVICE_LOOPS_VARIABLE) != "1":
            # Experimental: the conditional-node graphs have been assembled and linked (ptxas,
            # nvlink) but not yet checked on a driver by the suite, so the host loop, whose
            # results are checked on GPUs, stays the default.
            return f"device-side loops are experimental ({DEVICE_LOOPS_VARIABLE}=1 turns them on)"
        if self._conditional is None:
            self._conditional = ConditionalGraphs(self)  # links the condition setter once
        return self._conditional.unavailable

    def launch_graph_loops(self, loaded, ctx_address: int, slices: list, steps: list, flags: dict) -> None:
        """Conditional WHILE nodes (conditional_graphs.py): one graph per flag addresses too."""
        self.replay(loaded, ctx_address, slices, tuple(sorted(flags.items())),
                    lambda copy: self._conditional.build(loaded, copy, slices, steps, flags))

    def close(self) -> None:
        """Wait for the stream and release this device's stream, staging ring and context; a
        lost device's primary context is reset, so that the next device gets a working one."""
        if self.close_stream():
            self.cu.cuStreamDestroy(self.stream)
            self.cu.cuDevicePrimaryCtxRelease(self.device)
            if self.lost is not None:
                self.cu.cuDevicePrimaryCtxReset(self.device)
