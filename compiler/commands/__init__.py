"""The compiler's top floor, above compiler/jit: what drives it from outside a program. build.py
is `qdc build` (importing kernel modules, compiling every kernel variant for each arch into the
cache); inspect.py gives the IR of a kernel after the passes, for tests and debugging."""
