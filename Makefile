# Two commands on a fresh machine: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test dev lint bench docs install bytecode check-java check-chromium check-rabbitmq clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# procbus's own packages compiled ahead: an editable install leaves them uncompiled, and where
# PYTHONDONTWRITEBYTECODE is set every process (each CLI call, each worker) would compile them
# again (a worker's start: 2.4 -> 2.0 s). Only what changed is compiled again.
bytecode: install
	$(BIN)/python -m compileall -q procbus workflows activities worker starter tests >/dev/null

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "Java is missing: Spark (pyspark) needs a Java 17+ runtime."; \
	  echo "Install it, e.g. 'apt-get install -y openjdk-17-jre-headless' (Debian/Ubuntu)"; \
	  echo "or 'brew install openjdk@17' (macOS), then run this again."; \
	  exit 1; }

# The Temporal UI test drives the system Chromium headless; Debian's package, installed here
# when missing and allowed (root with apt-get), else a message saying how.
check-chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Chromium (Debian package chromium) for the Temporal UI test ..."; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	      || { echo "could not install Chromium with apt-get"; exit 1; }; \
	  else \
	    echo "Chromium is missing: the Temporal UI test drives it headless."; \
	    echo "Install it, e.g. 'sudo apt-get install -y chromium' (Debian/Ubuntu), then run this again."; \
	    exit 1; \
	  fi; }

# The AMQP tests start a RabbitMQ broker of their own from the OS package.
check-rabbitmq:
	@test -x /usr/lib/rabbitmq/bin/rabbitmq-server || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing RabbitMQ (Debian package rabbitmq-server) for the AMQP tests ..."; \
	    { apt-get install -y -qq --no-install-recommends rabbitmq-server >/dev/null 2>&1 \
	      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	           --no-install-recommends rabbitmq-server >/dev/null; }; } \
	      || { echo "could not install RabbitMQ with apt-get"; exit 1; }; \
	  else \
	    echo "RabbitMQ is missing: the AMQP tests start a broker of their own."; \
	    echo "Install it, e.g. 'sudo apt-get install -y rabbitmq-server' (Debian/Ubuntu), then run this again."; \
	    exit 1; \
	  fi; }

demo: bytecode check-java
	$(BIN)/procbus demo

# The suite runs in 3 processes (pytest-xdist), each with its own PostgreSQL and Temporal
# server; a test file runs whole in one of them, and the tests of the in-process Spark session
# all in one (tests/conftest.py names the groups). `make test TEST_WORKERS=0`: one process.
TEST_WORKERS ?= 3

test: bytecode check-java check-chromium check-rabbitmq
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadgroup

dev: install check-java
	$(BIN)/procbus dev

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy --strict docs/hooks.py  # not a package: checked on its own
	$(BIN)/lint-imports

# The docs site into site/; strict: a broken link, a page left out of the nav or a missing
# include fails the build. The reference pages are written from the code (docs/hooks.py).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: install check-java
	@for benchmark in bench/*.py; do echo "== $$benchmark"; $(BIN)/python $$benchmark || exit 1; done

clean:
	rm -rf $(VENV) .procbus .pytest_cache .mypy_cache .ruff_cache site
