# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is pinned to the CPU build that ships on this machine's disk (a plain
# `torch` can pull a multi-GB CUDA build).
TORCH := torch==2.13.0

export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1

.PHONY: demo test test-fast lint bench clean browser

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile $(TORCH) -e ".[all]"
	@# the bytecode pip would write one file at a time, on every core (a few files that only a newer
	@# Python parses, such as torch's py312 test helpers, do not compile: pip skips them too)
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/labfbo demo

# the report and dashboard tests drive Debian's chromium through its chromedriver
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver; }

# three processes (pytest-xdist) on two cores, each test module whole in one process (its module fixtures
# once); tests/schedule.py hands out the Flower modules first, as one unit on one process (they mostly wait
# on SuperNodes), beside the CPU-bound modules on the other two
XDIST := -n 3 --dist loadfile

# the linter first (ruff: pyflakes, pycodestyle, isort, bugbear; configured in pyproject.toml)
lint: $(STAMP)
	$(BIN)/ruff check labfbo benchmarks adapters tests examples

test: $(STAMP) browser lint
	$(BIN)/python -m pytest -v -p no:cacheprovider --durations=25 $(XDIST)

# the unit tier: no subprocess, server, MPI, schemathesis, multi-site campaign or long property search
# (those are marked `integration`)
# two processes: nothing in this tier waits on other processes, so a third would only add its
# collection (every test module imported once more) on two cores
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow and not integration" -n 2 --dist loadfile

bench: $(STAMP)
	$(BIN)/labfbo bench latency

clean:
	rm -rf $(VENV) runs .pytest_cache
