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

.PHONY: setup run test test-unit lint bench demo-rules notebooks clean
setup: $(VENV)/.installed $(JARS)/spark/.resolved

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

$(JARS)/spark/.resolved: jvm/spark/pom.xml
	mvn -q -f jvm/spark/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	  -DoutputDirectory=$(abspath $(JARS)/spark)
	touch $@

run: setup
	$(BIN)/fraudrules run --data-dir $(DATA_DIR) $(ARGS)

test: setup
	$(BIN)/ruff check lib tests
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/python -m pytest -q tests/unit

lint: setup
	$(BIN)/ruff check lib tests

bench: setup
	$(BIN)/fraudrules bench --data-dir bench/work $(ARGS)

notebooks: setup
	$(BIN)/python -m fraudrules.notebooks_runner --out notebooks/_executed

demo-rules: setup
	$(BIN)/fraudrules demo-rules $(ARGS)

clean:
	rm -rf $(DATA_DIR) bench/work spark-warehouse
