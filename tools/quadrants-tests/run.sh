#!/bin/bash
# Runs Quadrants' own test files (tests/python of a Quadrants checkout) unchanged on qdc's CPU
# backend, through the import shim in shim/ (`import quadrants as qd` is qdc), one file at a time,
# and prints pass/fail counts per file and in all. Usage:
#   tools/quadrants-tests/run.sh QUADRANTS_CHECKOUT [OUT_DIR] [FILE_GLOB]
# OUT_DIR (default /tmp/quadrants-tests) gets each file's pytest output; FILE_GLOB (default
# 'test_*.py') selects files. Runs against the qdc that `import qdc` finds.
set -u
src="${1:?usage: run.sh QUADRANTS_CHECKOUT [OUT_DIR] [FILE_GLOB]}"
out="${2:-/tmp/quadrants-tests}"
glob="${3:-test_*.py}"
here="$(dirname "$(readlink -f "$0")")"
work="$(mktemp -d)"
mkdir -p "$out" "$work/tests"
cp -r "$src/tests/python" "$work/tests/python"
cp -r "$here/shim/quadrants" "$work/quadrants"
cp "$here/shim/tests/__init__.py" "$here/shim/tests/test_utils.py" "$work/tests/"
cp "$here/shim/conftest.py" "$work/tests/python/conftest.py"
cd "$work"
for f in tests/python/$glob; do
  b=$(basename "$f" .py)
  PYTHONPATH="$work${PYTHONPATH:+:$PYTHONPATH}" HOME="$work/home" timeout 300 \
    python3 -m pytest -q -p no:cacheprovider -rfE --tb=line "$f" > "$out/$b.txt" 2>&1
done
python3 - "$out" <<'PY'
import pathlib, re, sys
totals = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.txt")):
    text = path.read_text(errors="replace").strip().splitlines()
    last = text[-1] if text else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|error|skipped)", last)}
    for k in totals:
        totals[k] += counts.get(k, 0)
    print(f"{path.stem}: {last}")
print("total:", ", ".join(f"{v} {k}" for k, v in totals.items()))
print("internal compiler errors:", sum("internal compiler error" in p.read_text(errors="replace")
                                        for p in pathlib.Path(sys.argv[1]).glob("*.txt")), "files")
PY
rm -rf "$work"
