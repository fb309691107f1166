"""The compiler's top floor, above compiler/jit: what drives it from outside a program. build.py
is `qdc build` (importing kernel modules, compiling every kernel variant for each arch into the
cache); build_manifest.py is `qdc build --manifest` (the variants a
recorded manifest lists); inspect.py gives the IR of a kernel after the passes, for tests and debugging."""
