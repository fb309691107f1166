"""Automatic differentiation of kernels.

Reverse mode: grad_kernel.py builds a kernel's gradient kernel and runs it through its pass
list; checks.py refuses kernels whose gradient would be wrong; activity.py says which values
carry a gradient; task_adjoint.py writes each task's adjoint (rules.py: each operation's);
register_adjoints.py, cleanup.py, sizing.py and sizeexpr_builder.py handle adstacks.
Forward mode: forward_mode.py, a pass of the forward pipeline in the `forward_ad` variant.
"""
