# The two commands of the README:
#   make chapter   - the main job: train the toy PPO (table + curves), build the notebooks, render the solved chapter
#   make test      - every check CI runs (ruff, pytest incl. nbval and nbgrader), on a fresh machine too
# Both create .venv from requirements/lock.txt on first use (about two minutes), then reuse it.

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
OUT     := build

.PHONY: env chapter train notebooks html test lint lock bench clean student-dist hub hub-proxy

env: $(STAMP)

# The three layers, editable: the student library (.), the reference solutions, the repo tooling.
$(STAMP): requirements/lock.txt pyproject.toml solutions/pyproject.toml tools/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements/lock.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
		-e . -e solutions -e tools
	touch $(STAMP)

train: env
	$(BIN)/python -m mlbook_solutions.run_toy --out $(OUT)

# Generate the student release, the nbgrader source and the solved notebooks from solutions/chapter.
notebooks: env
	$(BIN)/mlbook build

# Execute the solved notebooks (every cell, hidden tests included; TQDM_DISABLE: no progress-bar
# widget, which a static page would show empty), then render them, figures embedded, to build/*.html
# without the cells tagged hidden-tests (the reading form shows the chapter, not the grader's code)
# or student-instructions (how to fill in and check the stubs). nbconvert removes tagged cells before
# it executes, hence two steps. The mlbook template is JupyterLab's plus each figure's alternative
# text. The math is typeset by the MathJax the project ships (build/mathjax/), so the pages work offline.
MATHJAX_URL := mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe
html: notebooks
	TQDM_DISABLE=1 $(BIN)/jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=600 \
		--output-dir $(OUT)/executed solutions/notebooks/*.ipynb
	$(BIN)/python -m mlbook_tools.mathjax $(OUT)/mathjax
	$(BIN)/jupyter nbconvert --to html \
		--TagRemovePreprocessor.remove_cell_tags='{"hidden-tests","student-instructions"}' \
		--HTMLExporter.mathjax_url='$(MATHJAX_URL)' \
		--TemplateExporter.extra_template_basedirs=tools/mlbook_tools/templates --template mlbook \
		--output-dir $(OUT) $(OUT)/executed/*.ipynb

chapter: train html

lint: env
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Lint, the layer contracts, then fail if a generated notebook is stale, then every test: unit, the
# six named tests, the wrong/correct answer catalog, real nbgrader, DDP on gloo, the student
# distribution, the slow/stress evidence, and nbval: over every solved notebook (the stored output of
# each cell tagged nbval-check-output must be reproduced, after tests/nbval_sanitize.cfg) and over the
# student release (only cells tagged raises-exception, those that need the student's answers, may
# fail). Last, everything that compares a trained or sampled number with a stored one runs again on
# torch's portable (non-vectorised) kernels, so a result that holds only on this CPU's instruction
# set fails here, not on another machine.
PORTABLE := tests/test_exercises.py tests/test_posttrain_ppo.py tests/test_grading_catalog.py \
	tests/test_reward_model.py tests/test_critic_free.py
NBVAL := --nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg

test: lint
	$(BIN)/lint-imports
	$(BIN)/mlbook build --check
	$(BIN)/python -m pytest -q tests $(NBVAL) solutions/notebooks/ chapters/*.ipynb
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest -q $(PORTABLE) $(NBVAL) solutions/notebooks/

# What students of a graded course get: the library wheel and the released notebooks (build/student-dist).
student-dist: notebooks
	$(BIN)/mlbook student-dist

# The course on a JupyterHub on this machine (root; README "On a JupyterHub"): users, exchange, hub.
# configurable-http-proxy comes from npm, pinned by tools/hub-proxy/package-lock.json (`mlbook hub`
# installs it too when it is missing, so `make test` needs nothing more than npm).
HUB_DIR     ?= /srv/mlbook-hub
INSTRUCTOR  ?= teacher
STUDENTS    ?= alice,bob
PASSWORDS   ?=
HUB_IP      ?= 127.0.0.1
HUB_PORT    ?= 8000
HUB_PROXY   := tools/hub-proxy/node_modules/.bin/configurable-http-proxy

hub-proxy: $(HUB_PROXY)

$(HUB_PROXY): tools/hub-proxy/package-lock.json
	cd tools/hub-proxy && npm ci --no-audit --no-fund --loglevel=error
	touch $(HUB_PROXY)

hub: env hub-proxy
	$(BIN)/mlbook hub --dir $(HUB_DIR) --instructor $(INSTRUCTOR) --students $(STUDENTS) \
		$(if $(PASSWORDS),--passwords $(PASSWORDS)) --ip $(HUB_IP) --port $(HUB_PORT)

bench: env
	$(BIN)/python scripts/benchmark.py

# Re-pin every package from pyproject.toml (dependencies + the dev extra), the one list of them.
# torch is installed first so that the local CPU build 2.13.0 is the one that satisfies the pin.
lock:
	rm -rf /tmp/mlbook-lock && $(PY) -m venv /tmp/mlbook-lock
	/tmp/mlbook-lock/bin/pip install --quiet torch==2.13.0
	/tmp/mlbook-lock/bin/pip install --quiet ".[dev]"
	{ head -2 requirements/lock.txt; /tmp/mlbook-lock/bin/pip freeze | grep -v -E '^(torch==|-e |mlbook)'; \
		echo torch==2.13.0; } > requirements/lock.new
	mv requirements/lock.new requirements/lock.txt

clean:
	rm -rf $(OUT) $(VENV)
