# Loom: every target works on a fresh machine; it creates .venv and installs what it needs.
PY        ?= python3
VENV      := .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.installed
CACHE     := .cache
CARD      ?= examples/tiny-pd.yaml
PORT      ?= 8000

.PHONY: venv run test lint typecheck imports unit crds bench clean proto

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools
	$(BIN)/pip install -q -e '.[test]'
	# NIXL is installed next to torch without its dependency pins (it would pull a second torch).
	$(BIN)/pip install -q --no-deps nixl-cu12==1.5.1
	touch $(STAMP)

run: venv
	@echo "Loom: serving $(CARD) on http://127.0.0.1:$(PORT)/v1 (Ctrl-C drains and stops it)"
	@echo "  curl http://127.0.0.1:$(PORT)/v1/completions -H 'Content-Type: application/json' \\"
	@echo "       -d '{\"model\": \"tiny\", \"prompt\": \"Once upon a time\", \"max_tokens\": 16}'"
	$(BIN)/loom up $(CARD) --port $(PORT)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy runtime/loom_runtime operator/loom_operator

imports: venv
	$(BIN)/lint-imports

unit: venv
	$(BIN)/pytest -q

test: lint typecheck imports unit

crds: venv
	$(BIN)/loom crds --out crds --docs docs/cards.md

proto: venv
	$(BIN)/python -m grpc_tools.protoc -Iruntime --python_out=runtime --pyi_out=runtime \
		--grpc_python_out=runtime runtime/loom_runtime/control_api/control.proto

bench: venv
	$(BIN)/python bench/engine.py

clean:
	rm -rf $(VENV) $(CACHE) .pytest_cache .mypy_cache .ruff_cache
