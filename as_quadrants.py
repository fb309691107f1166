"""`python -m qdc.as_quadrants SCRIPT [ARGS...]`: run a Quadrants program on qdc (every
`import quadrants` in it resolves to qdc: quadrants_compat/)."""
import os
import runpy
import sys


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m qdc.as_quadrants SCRIPT [ARGS...]\n"
              "Runs SCRIPT with `import quadrants` resolving to qdc.", file=sys.stderr)
        raise SystemExit(0 if argv else 2)
    import qdc
    qdc.install_as_quadrants()
    sys.argv = list(argv)
    if argv[0] == "-m":  # python -m qdc.as_quadrants -m package.module ARGS
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:  # as `python SCRIPT` would: the script's folder first on the path
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
