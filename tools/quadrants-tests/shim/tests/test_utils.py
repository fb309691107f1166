import pytest
import quadrants as qd

ARCHS = ["cpu"]
UNSUPPORTED_EXT = {"sparse", "quant", "quant_basic", "bls", "extfunc", "mesh"}


def expected_archs():
    return list(ARCHS)


def get_rel_eps():
    return 1e-6


def approx(expected, **kwargs):
    class boolean_integer:
        def __init__(self, value):
            self.value = value

        def __eq__(self, other):
            return bool(self.value) == bool(other)

    if isinstance(expected, bool):
        return boolean_integer(expected)
    kwargs["rel"] = max(kwargs.get("rel", 1e-6), get_rel_eps())
    return pytest.approx(expected, **kwargs)


def allclose(x, y, **kwargs):
    return x == approx(y, **kwargs)


def skip_if_f64_unsupported(dtype):
    return


def test(arch=None, exclude=None, require=None, **options):
    arch = [] if arch is None else (list(arch) if isinstance(arch, (list, tuple)) else [arch])
    require = [] if require is None else (list(require) if isinstance(require, (list, tuple)) else [require])
    exclude = [] if exclude is None else (list(exclude) if isinstance(exclude, (list, tuple)) else [exclude])
    names = [a if isinstance(a, str) else getattr(a, "name", str(a)) for a in arch]
    archs = [a for a in ARCHS if (not arch or a in names or ("x64" in names and a == "cpu")) and a not in exclude]
    marks = []
    if not archs:
        marks.append(pytest.mark.skip(reason="no supported archs"))
    elif any(r in UNSUPPORTED_EXT for r in require):
        marks.append(pytest.mark.skip(reason=f"extension {require}"))
    else:
        marks.append(pytest.mark.parametrize("req_arch,req_options", [(a, dict(options)) for a in archs],
                                             ids=[f"arch={a}" for a in archs]))

    def decorator(func):
        func.__qd_test__ = True
        for m in reversed(marks):
            func = m(func)
        return func
    return decorator


def mkdir_p(path):
    import os
    os.makedirs(path, exist_ok=True)


def make_temp_file(*args, **kwargs):
    import os, tempfile
    fd, name = tempfile.mkstemp(*args, **kwargs)
    os.close(fd)
    return name
