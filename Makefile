# otel-ebpf developer entry points. Every target that runs project code first runs
# scripts/bootstrap.sh, which is idempotent and takes well under a second when nothing is missing.
#
#   make test                 unit + BPF tests (CI=true turns a skipped BPF test into a failure)
#   make wheel-check          the built wheel, installed in a fresh venv, imports, passes doctor and traces
#   make run ARGS='--port 8000'
#   make demo | bench | doctor | clean | distclean

VENV   := .venv
PY     := $(VENV)/bin/python
AGENT  := $(VENV)/bin/otel-ebpf
ARGS   ?=

.PHONY: bootstrap test wheel-check run demo bench doctor clean distclean

bootstrap:
	@bash scripts/bootstrap.sh

# The environment (CI=true included) reaches pytest unchanged; the tests enforce the CI rules.
test: bootstrap
	$(PY) -m pytest -q tests

# Tests run on the editable install, which cannot notice what the wheel leaves out: this checks the
# package as users install it (scripts/wheel_check.sh). Root: it loads BPF.
wheel-check: bootstrap
	bash scripts/wheel_check.sh

run: bootstrap
	$(AGENT) run $(ARGS)

demo: bootstrap
	$(PY) examples/demo.py
	$(PY) examples/profile_demo.py
	$(PY) examples/gpu_demo.py

bench: bootstrap
	$(PY) bench/http_load.py
	$(PY) bench/trace_assembly.py
	$(PY) bench/protocol_load.py
	$(PY) bench/profile_overhead.py
	$(PY) bench/rtps_load.py
	$(PY) bench/genai_stream.py
	$(PY) bench/gpu_probe_cost.py

# No bootstrap here: doctor is what you run when bootstrap or the agent fails. Without a venv it
# still works from the source tree with the system interpreter (it needs only the stdlib and bcc).
doctor:
	@if [ -x $(AGENT) ]; then $(AGENT) doctor; \
	else echo "[doctor] no $(AGENT) yet (run 'make bootstrap'); using python3 from the source tree"; \
	     python3 -m otel_ebpf.doctor; fi

clean:
	rm -rf build dist otel-ebpf-data .pytest_cache .hypothesis .ruff_cache *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

# clean, and also the virtual environment (the next target rebuilds it)
distclean: clean
	rm -rf $(VENV)
