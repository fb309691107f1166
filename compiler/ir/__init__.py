from .stmts import *  # noqa: F401,F403  (the IR's statement classes are its public surface)
from .printer import print_kernel, print_block  # noqa: F401
from .verifier import verify, check_types, IRVerifyError  # noqa: F401
from .adstack import *  # noqa: F401,F403  (reverse-mode autodiff statements)
from .local_arrays import *  # noqa: F401,F403  (vector locals indexed at run time, regrouped late)
from .simt import *  # noqa: F401,F403  (block-level GPU programming: qd.simt)
