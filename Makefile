# The two commands of the README do all the set-up on a fresh machine:
#   make demo   - the main job
#   make test   - the whole test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.mimo-accel-installed
PINS   := -c requirements/constraints.txt

# Megatron releases this project targets (see docs/compatibility.md), and
# nvidia-modelopt, which megatron.bridge.training imports (its own deps pull in CUDA packages).
MODELOPT      := nvidia-modelopt==0.47.0
MEGATRON_PKGS := megatron-core==0.19.2 megatron-bridge==0.6.2 $(MODELOPT)

# make test-upstream: the same suite on megatron-bridge / megatron-core built from source trees,
# in a second venv (see upstream/upstream_venv.py).
UPSTREAM_VENV ?= .venv-upstream
# The upstreams docs/compatibility.md reports, by name: "Megatron-Bridge commit, Megatron-LM commit".
# make test-upstream UPSTREAM=main-lm BRIDGE_GIT=/path/to/Megatron-Bridge LM_GIT=/path/to/Megatron-LM
UPSTREAM_main    := 067f987df 2a75ac12c54b
UPSTREAM_main-lm := 067f987df d98e8a64dd
UPSTREAM_5525    := 958575fc3 24bad8e677
UPSTREAM_4986    := fdf31e415 adfb8ec79
ifdef UPSTREAM
UPSTREAM_PAIR := $(or $(UPSTREAM_$(UPSTREAM)),$(error UPSTREAM=$(UPSTREAM): not one of main main-lm 5525 4986))
UPSTREAM_VENV := .venv-upstream-$(UPSTREAM)
UPSTREAM_FROM_GIT := $(BRIDGE_GIT)@$(word 1,$(UPSTREAM_PAIR)) $(LM_GIT)@$(word 2,$(UPSTREAM_PAIR))
endif

.PHONY: demo demo-reference test setup doctor clean test-upstream-peer test-upstream

setup: $(STAMP)

# Idempotent: re-runs only when the venv is missing or a requirement file changed.
$(STAMP): pyproject.toml setup.py mimo_accel/_bootstrap/mimo_accel.pth requirements/constraints.txt requirements/megatron-runtime.txt requirements/dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned to the CPU build, so no resolver swaps in a CUDA build later.
	$(PIP) install -q $(PINS) torch
	$(PIP) install -q $(PINS) -r requirements/megatron-runtime.txt -r requirements/dev.txt
	# The Megatron packages declare Requires-Python >= 3.12; their runtime deps come from
	# requirements/megatron-runtime.txt, so install them without the resolver.
	$(PIP) install -q --no-deps --ignore-requires-python $(MEGATRON_PKGS)
	# mimo-accel declares Requires-Python >= 3.12 like Megatron; the CPU venv may be 3.11 (the rehearsal back-ports).
	$(PIP) install -q --no-deps --ignore-requires-python -e .
	# The development kit (mimo_accel_dev: rehearse, gpu-check) on the venv's path; the wheel leaves it out.
	$(PY) -m mimo_accel_dev.on_path
	$(PY) -c "import mimo_accel_dev.rehearse.cpu as c; c.check_megatron_importable()"
	@touch $(STAMP)

# The main job: the user's path rehearsed on CPU ranks -- examples/train_mimo.py (Bridge's own
# pretrain_megatron_mimo) with Bridge's Qwen3-VL vision model over receipt image files, upstream
# as shipped, the reorder buffer of Bridge PR #4608, not merged (--peer reorder-buffer; --peer 4608:
# #4608 at 984a8a53), and mimo_accel (its cost model learnt while training, from the defaults), with
# the straggler report.
demo: $(STAMP)
	$(VENV)/bin/mimo-accel rehearse --loop bridge --peer reorder-buffer --json rehearsal.json

# Upstream's validated layout (images dp1 -> language pp2 dp2, TP 2 for its 4, 2-sample micro-batches,
# 32 a step, reorder_window=step) on 9 CPU ranks, over receipt-like and fixed-size images; then the
# layout `mimo-accel layout` recommends from the receipt-like run (at most 11 ranks) and a third
# layout, rehearsed and replayed, their per-step losses held against the reference's (about 15 minutes
# on 2 cores).
demo-reference: $(STAMP)
	$(VENV)/bin/mimo-accel rehearse --loop bridge --layout reference --json rehearsal-reference.json

# Without Megatron the suite would run its pure tests only and skip the rest: make test refuses instead.
test: $(STAMP)
	@$(PY) -c "from importlib.metadata import version; version('megatron-core'); version('megatron-bridge')" 2>/dev/null || \
		{ echo "make test: megatron-core / megatron-bridge are not installed in $(VENV): rm $(STAMP) && make setup"; exit 2; }
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q

# Upstream's own MegatronMIMO unit tests as a peer suite: the same outcomes without mimo_accel,
# with enable() and with every feature on. UPSTREAM_BRIDGE: a Megatron-Bridge checkout or extract
# (tests/unit_tests/{conftest.py,data/megatron_mimo,training/megatron_mimo}); see upstream/upstream_peer/run.py.
test-upstream-peer: $(STAMP)
	@test -n "$(UPSTREAM_BRIDGE)" || { echo "usage: make test-upstream-peer UPSTREAM_BRIDGE=/path/to/Megatron-Bridge"; exit 2; }
	$(PY) upstream/upstream_peer/run.py --upstream "$(UPSTREAM_BRIDGE)" $(PEER_ARGS)

# The project's suite on megatron-bridge / megatron-core built from source trees (e.g. upstream
# main): UPSTREAM_BRIDGE a Megatron-Bridge checkout or extract (src/ layout), UPSTREAM_CORE a
# Megatron-LM one. Builds $(UPSTREAM_VENV) like .venv (same torch pin and requirements), then
# installs the two trees with --no-deps; idempotent (a stamp records the requirement files and
# the trees' commits/contents). Or check both out of git repositories (clones or mirrors) into a
# temp dir: UPSTREAM_FROM_GIT="BRIDGE_GIT@COMMIT CORE_GIT@COMMIT". PYTEST_ARGS: extra pytest args.
# UPSTREAM_VENV=.venv-upstream-NAME keeps one venv per upstream (e.g. main and PR #5525); UPSTREAM=NAME
# picks one of the named pairs above (its venv .venv-upstream-NAME), checked out of BRIDGE_GIT / LM_GIT.
test-upstream:
	@test -z "$(UPSTREAM)" -o \( -n "$(BRIDGE_GIT)" -a -n "$(LM_GIT)" \) || { \
		echo "make test-upstream UPSTREAM=$(UPSTREAM): give BRIDGE_GIT and LM_GIT (Megatron-Bridge and Megatron-LM clones or mirrors)"; exit 2; }
	@test -n "$(UPSTREAM_FROM_GIT)" -o \( -n "$(UPSTREAM_BRIDGE)" -a -n "$(UPSTREAM_CORE)" \) || { \
		echo "usage: make test-upstream UPSTREAM_BRIDGE=/path/to/Megatron-Bridge UPSTREAM_CORE=/path/to/Megatron-LM"; \
		echo "   or: make test-upstream UPSTREAM_FROM_GIT='BRIDGE_GIT@COMMIT CORE_GIT@COMMIT'"; exit 2; }
	$(PYTHON) upstream/upstream_venv.py --venv $(UPSTREAM_VENV) --python $(PYTHON) --modelopt $(MODELOPT) \
		$(if $(UPSTREAM_FROM_GIT),--from-git $(UPSTREAM_FROM_GIT),--bridge "$(UPSTREAM_BRIDGE)" --core "$(UPSTREAM_CORE)")
	$(UPSTREAM_VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

doctor: $(STAMP)
	$(VENV)/bin/mimo-accel doctor

clean:
	rm -rf $(VENV) $(UPSTREAM_VENV) .venv-upstream-* .pytest_cache .hypothesis
