# Two commands on a fresh machine: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test dev lint bench install check-java clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "Java is missing: Spark (pyspark) needs a Java 17+ runtime."; \
	  echo "Install it, e.g. 'apt-get install -y openjdk-17-jre-headless' (Debian/Ubuntu)"; \
	  echo "or 'brew install openjdk@17' (macOS), then run this again."; \
	  exit 1; }

demo: install check-java
	$(BIN)/procbus demo

test: install check-java
	$(BIN)/python -m pytest -q

dev: install check-java
	$(BIN)/procbus dev

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: install check-java
	@for benchmark in bench/*.py; do echo "== $$benchmark"; $(BIN)/python $$benchmark || exit 1; done

clean:
	rm -rf $(VENV) .procbus .pytest_cache .mypy_cache .ruff_cache
