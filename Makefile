# The README's two commands are `make demo` and `make test`; both set up a fresh machine.
PY ?= python3
PIP = $(PY) -m pip install -q --disable-pip-version-check

.PHONY: setup demo test bench clean

setup:
	$(PIP) -e '.[test]'

demo: setup
	$(PY) -m qdc.cli.main build kernels/ --cache cache
	$(PY) kernels/run_example.py cache

test: setup
	@command -v qemu-x86_64 >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && { apt-get update -qq && apt-get install -y -qq qemu-user >/dev/null; } || echo "qdc: qemu-x86_64 is missing and could not be installed with apt-get (package qemu-user): the test of portable CPU code on a CPU without AVX-512 will be skipped"; }
	$(PY) -m pytest -q tests

bench: setup
	$(PIP) quadrants || echo "quadrants is not installable here: the table will leave its column out"
	$(PY) bench/run.py

clean:
	rm -rf cache/* build *.egg-info .pytest_cache
