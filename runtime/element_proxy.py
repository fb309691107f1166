"""What `x[i]` returns from Python for a field or ndarray of vectors or matrices: a `qd.Matrix`
(runtime/contract/matrix_value.py) that writes itself back.

Quadrants code writes into an element in place (`m[None][i, j] = v`, `x[i][0] = v`,
`u[i].y = 3`, `m[None][i][j] = v`): a plain copy would drop such writes silently. The element
holds its own copy of the entries and stores them back into the array after each write."""
from __future__ import annotations

import numpy as np

from .contract.matrix_value import MatrixValue


def element(data: np.ndarray, owner, index: tuple) -> MatrixValue:
    """Element `index` of field/ndarray `owner`, holding `data` (its own copy): writes into it
    are stored back into `owner[index]`."""
    def store():
        owner[index] = data
    return MatrixValue.of(data, store)
