# Two commands on a fresh machine: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test dev lint bench docs install bytecode check-java check-chromium check-rabbitmq check-nftables clean \
	record-histories group-seconds suite-cpu iceberg-spark check-iceberg-spark-packages

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The build backend (pyproject.toml's [build-system]) goes into the venv once and builds
# procbus there: pip's isolated build environment would install it afresh on every install
# (a fresh `make install`: 57 s with it, 52 s without; resolving alone: 37 s and 12 s).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip 'setuptools>=77'
	$(BIN)/pip install --quiet --no-build-isolation -e '.[all,test]'
	touch $(STAMP)

install: $(STAMP)

# procbus's own packages compiled ahead: an editable install leaves them uncompiled, and where
# PYTHONDONTWRITEBYTECODE is set every process (each CLI call, each worker) would compile them
# again (a worker's start: 2.4 -> 2.0 s). Only what changed is compiled again.
bytecode: install
	$(BIN)/python -m compileall -q procbus tests >/dev/null

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

# $(call apt_install,PACKAGE,WHO NEEDS IT,WHY): Debian's PACKAGE, installed when allowed (root
# with apt-get; the package lists are refreshed only if the first try fails), else a message
# saying how. No commas in the arguments: they separate them.
define apt_install
if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
  echo "installing $(1) (Debian package $(1)) for $(2) ..."; \
  { apt-get install -y -qq --no-install-recommends $(1) >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
         --no-install-recommends $(1) >/dev/null; }; } \
    || { echo "could not install $(1) with apt-get"; exit 1; }; \
else \
  echo "$(1) is missing: $(3)"; \
  echo "Install it, e.g. 'sudo apt-get install -y $(1)' (Debian/Ubuntu), then run this again."; \
  exit 1; \
fi
endef

# The AMQP tests start a RabbitMQ broker of their own from the OS package.
check-rabbitmq:
	@test -x /usr/lib/rabbitmq/bin/rabbitmq-server || { $(call apt_install,rabbitmq-server,the AMQP tests,the AMQP tests start a broker of their own.); }

# The cluster tests (tests/cluster/) cut links between hosts with nftables rules inside a
# host's network namespace.
check-nftables:
	@command -v nft >/dev/null 2>&1 || { $(call apt_install,nftables,the cluster tests,the cluster tests cut links between hosts with it (as root).); }

# Spark 3.5 with Iceberg's own runtime, in a venv of its own (procbus's has Spark 4, for which no
# Iceberg runtime is at hand): tests/integration/test_lake_readers.py reads Iceberg tables with
# it, an engine procbus did not write. Debian's PostgreSQL JDBC driver and jarjar (which rebuilds
# the shaded Jackson that Iceberg's runtime jar lacks) come from apt. The script keeps a stamp
# (its own hash) and returns at once when the venv is whole (0.01 s); a fresh build takes 10 s
# here with pip's cache warm, 25 s without (pyspark 3.5's download and wheel build).
# ICEBERG_SPARK_PYTHON: a Python 3.11 or 3.12 (the runtime's wheel wants < 3.13).
ICEBERG_SPARK_VENV := .venv-iceberg-spark
ICEBERG_SPARK_PYTHON ?= $(PYTHON)

check-iceberg-spark-packages:
	@test -f /usr/share/java/postgresql.jar || { $(call apt_install,libpostgresql-jdbc-java,the Iceberg engine test,Spark reads the Iceberg catalog in PostgreSQL through it.); }
	@test -f /usr/share/java/jarjar.jar || { $(call apt_install,libjarjar-java,the Iceberg engine test,it rebuilds the shaded Jackson that Iceberg's Spark runtime lacks.); }

iceberg-spark: check-java check-iceberg-spark-packages
	@tools/iceberg_spark_env.sh $(ICEBERG_SPARK_VENV) $(ICEBERG_SPARK_PYTHON)

demo: bytecode check-java
	$(BIN)/procbus demo

# The suite runs in 5 processes (pytest-xdist), each with its own PostgreSQL and Temporal
# server; a test file runs whole in one of them, and the tests of the in-process Spark session
# all in one (tests/conftest.py names the groups). It keeps 2 cores busy from start to end
# (1200 s with 5 processes, 1384 s with 4, on this host). `make test TEST_WORKERS=0`: one
# process.
TEST_WORKERS ?= 5

test: bytecode check-java check-chromium check-rabbitmq check-nftables iceberg-spark
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadgroup

# The whole suite, writing what each test group took into tests/group_seconds.json, which
# orders the groups (longest first) in every later run: after adding or much changing a slow test.
group-seconds: bytecode check-java check-chromium check-rabbitmq check-nftables iceberg-spark
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadgroup --write-group-seconds

# The whole suite, then its CPU seconds by test group, heaviest first (tests/cpu_probe.py): where
# to look first for a shorter run on two cores, which the suite keeps busy from start to end.
SUITE_CPU := .pytest_cache/suite-cpu.jsonl

suite-cpu: bytecode check-java check-chromium check-rabbitmq check-nftables iceberg-spark
	@mkdir -p .pytest_cache && rm -f $(SUITE_CPU)
	-$(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadgroup \
		-p tests.cpu_probe --cpu-probe $(SUITE_CPU)
	$(BIN)/python -m tests.cpu_probe $(SUITE_CPU)

# The tests whose workflows' histories tests/unit/test_histories.py replays against today's code:
# each built-in procedure, and the engine's paths (rollback, STUCK then retry or skip, children,
# continue-as-new, a lock wait, broadcasts, Spark job steps). Recorded anew into tests/histories/
# only when a change is meant to change what procedures do (docs/how-to/upgrading.md).
HISTORY_TESTS := \
	tests/integration/test_stack_check.py::test_stack_check_writes_to_postgresql_and_reads_back \
	tests/integration/test_table_procedures.py::test_create_table_does_every_step \
	tests/integration/test_table_procedures.py::test_create_table_fault_at_any_step_leaves_no_residue \
	tests/integration/test_table_procedures.py::test_delete_table_rolls_back_before_the_pivot_and_forward_after \
	tests/integration/test_table_procedures.py::test_delete_namespace_is_refused_while_it_holds_tables \
	tests/integration/test_procedure_engine.py::test_a_compensation_that_always_fails_is_stuck_until_an_operator_skips_it \
	tests/integration/test_procedure_engine.py::test_retry_runs_a_stuck_compensation_again \
	tests/integration/test_procedure_engine.py::test_a_step_past_the_pivot_that_keeps_failing_is_stuck_then_retried \
	tests/integration/test_procedure_engine.py::test_parallel_children_one_failing \
	tests/integration/test_procedure_engine.py::test_continue_as_new_carries_the_undo_stack \
	tests/integration/test_procedure_engine.py::test_the_deadline_rolls_back \
	tests/integration/test_procedure_engine.py::test_the_deadline_counts_from_the_start_even_when_no_worker_took_it_yet \
	tests/integration/test_procedure_locks.py::test_a_procedure_waits_behind_the_holder_and_says_whom_it_waits_for \
	tests/integration/test_procedure_locks.py::test_the_lock_timeout_rolls_the_procedure_back_before_any_step \
	tests/integration/test_procedure_locks.py::test_an_undo_whose_locks_were_lost_takes_them_again_and_rolls_back \
	tests/integration/test_procedure_locks.py::test_a_stuck_procedure_retried_after_its_locks_were_taken_takes_them_again \
	tests/integration/test_table_procedures.py::test_a_delete_that_lost_its_locks_past_the_pivot_takes_them_again_and_finishes \
	tests/integration/test_bus.py::test_grant_and_revoke_reach_every_member_and_a_late_starter_enforces_the_catalog \
	tests/integration/test_table_data.py::test_loads_and_a_compaction_keep_every_row_in_whole_snapshots

record-histories: bytecode check-java
	$(BIN)/python -m pytest -q -p tests.histories.recorder $(HISTORY_TESTS)

dev: install check-java
	$(BIN)/procbus dev

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy --strict docs/hooks.py  # not a package: checked on its own
	$(BIN)/mypy bench  # scripts, not a package: checked on their own
	$(BIN)/vulture  # dead code ([tool.vulture] in pyproject.toml)
	cd examples/user-project && MYPYPATH=../.. ../../$(BIN)/mypy --strict --explicit-package-bases \
	  --ignore-missing-imports workflows activities worker.py starter.py codec.py
	$(BIN)/lint-imports

# The docs site into site/; strict: a broken link, a page left out of the nav or a missing
# include fails the build. The reference pages are written from the code (docs/hooks.py).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The benchmarks, each run once: those of bench/benchmarks.txt (the suite smoke-runs the same
# list). The cluster ones (marked root) build hosts in network namespaces: only as root.
BENCHMARKS := $(shell awk '{sub(/\#.*/, "")} NF == 1 {print $$1}' bench/benchmarks.txt)
CLUSTER_BENCHMARKS := $(shell awk '{sub(/\#.*/, "")} NF == 2 && $$2 == "root" {print $$1}' \
	bench/benchmarks.txt)

bench: install check-java
	@failed=""; \
	for name in $(BENCHMARKS) $(CLUSTER_BENCHMARKS); do \
		case " $(CLUSTER_BENCHMARKS) " in *" $$name "*) \
			if [ "$$(id -u)" != 0 ]; then echo "== bench/$$name.py: skipped, needs root"; continue; fi;; \
		esac; \
		echo "== bench/$$name.py"; \
		$(BIN)/python bench/$$name.py || failed="$$failed $$name"; \
	done; \
	if [ -n "$$failed" ]; then echo "benchmarks that failed:$$failed"; exit 1; fi

clean:
	rm -rf $(VENV) $(ICEBERG_SPARK_VENV) .procbus .pytest_cache .mypy_cache .ruff_cache site
