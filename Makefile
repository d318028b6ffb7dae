# Set-up happens on first use of any target: a .venv with the pinned Python deps and the JVM jars
# (Delta, Kafka connector) resolved from Maven Central into .jars/. Both are cached.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
JARS := .jars
DATA_DIR ?= data
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)
export FRAUDRULES_JARS := $(abspath $(JARS)/spark)

.PHONY: setup run test test-unit lint bench demo-rules notebooks dq clean
AIRFLOW_VENV := .venv-airflow
setup: $(VENV)/.installed $(JARS)/spark/.resolved $(AIRFLOW_VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-quality.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt -r requirements-quality.txt
	$(BIN)/pip install -q --no-deps -e .
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

run: setup
	$(BIN)/fraudrules run --data-dir $(DATA_DIR) $(ARGS)

test: setup
	$(BIN)/ruff check lib tests dags
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/python -m pytest -q tests/unit

lint: setup
	$(BIN)/ruff check lib tests dags

bench: setup
	$(BIN)/fraudrules bench --data-dir bench/work $(ARGS)

# Runs the data-quality DAG locally (airflow dags test) on the tables under DATA_DIR; leaves Data Docs HTML.
dq: setup
	mkdir -p $(DATA_DIR)/airflow
	export AIRFLOW_HOME=$(abspath $(DATA_DIR)/airflow) AIRFLOW__CORE__LOAD_EXAMPLES=False AIRFLOW__CORE__DAGS_FOLDER=$(abspath dags); \
	$(AIRFLOW_VENV)/bin/airflow db migrate > /dev/null && \
	$(AIRFLOW_VENV)/bin/airflow dags test fraud_data_quality -c '{"data_dir": "$(abspath $(DATA_DIR))"}'; rc=$$?; \
	echo "Data Docs: $(abspath $(DATA_DIR))/dq/docs/index.html"; exit $$rc

notebooks: setup
	$(BIN)/python -m fraudrules.notebooks_runner --out notebooks/_executed

demo-rules: setup
	$(BIN)/fraudrules demo-rules $(ARGS)

clean:
	rm -rf $(DATA_DIR) bench/work spark-warehouse

# Kafka: a local single-node KRaft broker from Maven Central jars (resolved into .jars/kafka once, by
# fraudrules.kafka_local.resolve_jars), the job on Kafka, and the crash-and-restart exactly-once demo.
.PHONY: kafka kafka-jars crash-demo
export FRAUDRULES_KAFKA_JARS := $(abspath $(JARS)/kafka)

kafka-jars: setup
	$(BIN)/python -c "from pathlib import Path; from fraudrules.kafka_local import DEFAULT_POM, resolve_jars; \
	  print('Kafka jars in', resolve_jars(Path('$(FRAUDRULES_KAFKA_JARS)'), DEFAULT_POM))"

kafka: kafka-jars
	$(BIN)/python -m fraudrules.kafka_local start --work-dir $(DATA_DIR)/kafka $(ARGS)

# `make run SOURCE=kafka`: transactions, logins and rule changes from topics, alerts also to a topic; a local
# broker is started in $(DATA_DIR)/kafka unless ARGS has --kafka-bootstrap HOST:PORT.
run: override ARGS += $(if $(SOURCE),--source $(SOURCE))

crash-demo: setup
	$(BIN)/fraudrules crash-demo --data-dir $(DATA_DIR)/crash-demo $(ARGS)
