# The two commands of the README: `make demo` (the main job) and `make test` (everything the
# CI checks). Both set up the virtual environment on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck pytest bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/activememory demo

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy -p activememory

# One worker process per core (at most 4), each test module on one worker (its fixtures,
# such as its PostgreSQL database, are made once); `.venv/bin/pytest tests/x.py` runs serially.
pytest: $(STAMP)
	$(BIN)/pytest -n auto --maxprocesses 4 --dist loadfile

bench: $(STAMP)
	$(BIN)/activememory bench indexing

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
