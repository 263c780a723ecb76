# Every verb a person uses. `make install` is idempotent: it reinstalls only when requirements.txt changes.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
CONFIG ?= base.yaml
MODEL_DIR ?= runs/base

.PHONY: install train evaluate translate export test test-all bench ablate robustness lint format clean

# The C++ kernels of the training step (nmt/kernels/build.py): built once per source, TensorFlow and CPU
# kind, a no-op otherwise; without a compiler the model runs on TensorFlow's ops (same math, slower).
install: $(STAMP)
	@$(PY) -m nmt.kernels.build

# Silent recipes, a note on stderr: stdout stays the commands' own (make bench > bench.jsonl from a shell: JSON lines
# only; a make inside another make adds its "Entering directory" line unless given --no-print-directory).
# The installer is uv (pinned in requirements.txt, installed into the venv by pip): the same pinned packages as pip
# installs, faster (2026-12-06, AVX2 EPYC, docs/make-test-2026-12-06c-avx2/: 26-28 s from an empty cache, 10-12 s
# from uv's, against pip's 41-63 s). If uv cannot be installed or cannot install them (its index is PyPI; it does not
# read pip.conf), pip installs them, as before.
$(STAMP): requirements.txt
	@echo "make install: $(VENV) from requirements.txt" >&2
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip >&2
	@{ $(PY) -m pip install --quiet "$$(grep -m1 '^uv==' requirements.txt | cut -d' ' -f1)" >&2 \
	  && $(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -r requirements.txt >&2; } \
	  || { echo "make install: uv failed; installing with pip" >&2; grep -v '^uv==' requirements.txt > $(VENV)/pip-requirements.txt \
	       && $(PY) -m pip install --quiet -r $(VENV)/pip-requirements.txt >&2; }
	@touch $(STAMP)

# The commands are echoed on stderr: stdout is theirs alone (make translate < in > out: one line out per line in).
train: install
	@echo "$(PY) train.py --config $(CONFIG) --model-dir $(MODEL_DIR)" >&2
	@$(PY) train.py --config $(CONFIG) --model-dir $(MODEL_DIR)
	@$(PY) -m nmt.run_dir --finished $(MODEL_DIR) \
	  || { echo "make train: $(MODEL_DIR) stopped before its end: not evaluated; make train again resumes it" >&2; exit 1; }
	@echo "$(PY) evaluate.py --model-dir $(MODEL_DIR) --split validation" >&2
	@$(PY) evaluate.py --model-dir $(MODEL_DIR) --split validation
	@echo "$(PY) evaluate.py --model-dir $(MODEL_DIR) --split test --beam 4" >&2
	@$(PY) evaluate.py --model-dir $(MODEL_DIR) --split test --beam 4

evaluate: install
	@echo "$(PY) evaluate.py --model-dir $(MODEL_DIR) --split test --beam 4" >&2
	@$(PY) evaluate.py --model-dir $(MODEL_DIR) --split test --beam 4

translate: install
	@echo "$(PY) translate.py --model-dir $(MODEL_DIR)" >&2
	@$(PY) translate.py --model-dir $(MODEL_DIR)

export: install
	@echo "$(PY) export.py --model-dir $(MODEL_DIR) --output $(MODEL_DIR)/export" >&2
	@$(PY) export.py --model-dir $(MODEL_DIR) --output $(MODEL_DIR)/export

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# The CI path: lint, then every test not marked slow (end-to-end tests on tiny.yaml are included), on
# TEST_WORKERS pytest-xdist workers, each test file whole on one worker (tests/parallel.py); TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST_WORKERS := $(if $(filter 0,$(TEST_WORKERS)),,-p tests.parallel -n $(TEST_WORKERS) --dist loadfile)
test: lint
	$(PY) -m pytest -m "not slow" $(PYTEST_WORKERS)

# Everything, including the slow end-to-end tests.
test-all: lint
	$(PY) -m pytest $(PYTEST_WORKERS)

# Every benchmark, one JSON line per record on stdout (the last: each benchmark's wall seconds), logs on stderr;
# BENCH_ARGS="--only train" for a subset.
BENCH_ARGS ?=
bench: install
	@echo "$(PY) bench.py $(BENCH_ARGS)" >&2
	@$(PY) bench.py $(BENCH_ARGS)

# Once, not in CI: the tests on the tiny trained fixture under 5 seeds, oneDNN on/off, an ISA cap and 1/2 threads
# (tests/robustness.py: 17 pytest processes, slow). ROBUSTNESS_ARGS="--output docs/robustness-DATE.jsonl".
robustness: install
	$(PY) -m tests.robustness $(ROBUSTNESS_ARGS)

ablate: install
	$(PY) ablate.py $(ABLATE_ARGS)

clean:
	rm -rf .pytest_cache .ruff_cache
