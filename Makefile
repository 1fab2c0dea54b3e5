# otel-ebpf developer entry points. Every target that runs project code first runs
# scripts/bootstrap.sh, which is idempotent and takes well under a second when nothing is missing.
#
#   make lint                 ruff (lint + format check) and mypy; CI runs it before the tests
#   make test                 unit + BPF tests (with CI=true a skip fails: tests/skip_allowlist.txt)
#   make wheel-check          the built wheel, installed in a fresh venv, imports, passes doctor and traces
#   make run ARGS='--port 8000'
#   make demo | bench | bench-quick | doctor | clean | distclean

VENV   := .venv
PY     := $(VENV)/bin/python
AGENT  := $(VENV)/bin/otel-ebpf
ARGS   ?=

.PHONY: bootstrap lint test wheel-check run demo bench bench-quick doctor clean distclean

bootstrap:
	@bash scripts/bootstrap.sh

# Every check runs, then the target fails naming those that failed. Settings: pyproject.toml's
# [tool.ruff] and [tool.mypy]; mypy goes through scripts/typecheck.sh (protocols/ is otel_ebpf.protocols).
LINT_PATHS := otel_ebpf protocols tests bench examples scripts

lint: bootstrap
	@failed=""; \
	$(VENV)/bin/ruff check $(LINT_PATHS) || failed="$$failed ruff-check"; \
	$(VENV)/bin/ruff format --check $(LINT_PATHS) || failed="$$failed ruff-format"; \
	bash scripts/typecheck.sh || failed="$$failed mypy"; \
	if [ -n "$$failed" ]; then echo "[lint] FAILED:$$failed"; exit 1; fi

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

# Every benchmark writes its figures, command line, date and machine to bench/results/<name>.json
# (bench/results.py); the target ends by printing them all. A benchmark that fails does not stop the
# others, but fails the target. BENCH='nginx_load idle_cost' runs a subset.
#   make bench          the full runs (each ~1-3 min on 2 cores: the README's figures come from these)
#   make bench-quick    --quick runs (seconds each, for checking that they work) into bench/results/quick/
BENCH ?= nginx_load fastapi_load idle_cost http_load protocol_load profile_overhead trace_assembly \
         pipeline_replay file_export rtps_load genai_stream gpu_probe_cost tls_untraced pii_scrub roce_cost \
         kernel_cost kernel_profile untraced_syscalls large_transfer
BENCH_FLAGS ?=

bench: bootstrap
	@failed=""; for name in $(BENCH); do \
	    echo "== bench/$$name.py $(BENCH_FLAGS)"; \
	    $(PY) bench/$$name.py $(BENCH_FLAGS) || failed="$$failed $$name"; \
	done; \
	echo; $(PY) bench/results.py $(BENCH); \
	if [ -z "$(BENCH_RESULTS)" ]; then $(PY) bench/readme_tables.py; fi; \
	if [ -n "$$failed" ]; then echo "[bench] FAILED:$$failed"; exit 1; fi

bench-quick:
	@$(MAKE) --no-print-directory bench BENCH_FLAGS=--quick BENCH_RESULTS=$(CURDIR)/bench/results/quick

# No bootstrap here: doctor is what you run when bootstrap or the agent fails. Without a venv it
# still works from the source tree with the system interpreter (it needs only the stdlib and bcc).
doctor:
	@if [ -x $(AGENT) ]; then $(AGENT) doctor; \
	else echo "[doctor] no $(AGENT) yet (run 'make bootstrap'); using python3 from the source tree"; \
	     python3 -m otel_ebpf.doctor; fi

clean:
	rm -rf build dist otel-ebpf-data .pytest_cache .hypothesis .ruff_cache .mypy_cache *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

# clean, and also the virtual environment (the next target rebuilds it)
distclean: clean
	rm -rf $(VENV)
