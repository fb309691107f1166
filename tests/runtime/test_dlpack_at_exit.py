"""An exported array that a consumer still holds when the interpreter exits
(runtime/dlpack_capsule.py): the consumer frees it after Python has finalised, so its deleter
must not call back into Python then."""
import os
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import os, sys, types
    holder = types.ModuleType("holder")  # a module made before qdc's: torn down after them
    sys.modules["holder"] = holder
    holder.kept = []
    import numpy as np
    {consumer_import}
    import qdc as qd
    from qdc.runtime import dlpack_capsule


    class Exports(dict):  # Python code on the deleter's path: it must not run once exiting
        def pop(self, key, default=None):
            os.write(1, b"deleter ran in Python\\n")
            return super().pop(key, default)


    dlpack_capsule._exports = Exports()
    qd.init(arch=qd.cpu)
    for n in range(1, 40):
        a = qd.ndarray(qd.f32, shape=(n, 3))
        a.fill(float(n))
        holder.kept.append({consume}(a))
    assert float(holder.kept[-1].sum()) == 39 * 39 * 3
    os.write(1, b"done\\n")
""")
CONSUMERS = {"numpy": ("", "np.from_dlpack"), "torch": ("import torch", "torch.from_dlpack")}


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
def test_an_export_held_at_exit_is_freed_without_python(consumer):
    if consumer == "torch":
        pytest.importorskip("torch")
    consumer_import, consume = CONSUMERS[consumer]
    program = PROGRAM.format(consumer_import=consumer_import, consume=consume)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    assert done.stdout == "done\n", done.stdout
