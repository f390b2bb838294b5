# The two commands of the README:
#   make chapter   - the main job: train the toy PPO (table + curves), build the notebooks, render the solved chapter
#   make test      - the tests CI runs first (ruff, contracts, drift, pytest incl. nbval, nbgrader, the sandbox,
#                    the shared graded class, the browser), on a fresh machine too; `make check` is its fast lane
# Both create .venv from requirements/lock.txt on first use (about two minutes), then reuse it.

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
OUT     := build

.PHONY: env chapter train notebooks html check test test-full test-cgroup2 fairness-reference lint lock student-lock bench clean student-dist hub hub-proxy

env: $(STAMP)

# The three layers, editable: the student library (.), the reference solutions, the repo tooling.
$(STAMP): requirements/lock.txt pyproject.toml solutions/pyproject.toml tools/pyproject.toml
	@echo "installing the pinned environment into $(VENV) (once, about two minutes; later runs reuse it)"
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

# Execute the solved notebooks (nbconvert's executor, every cell, hidden tests included, a line per
# section on a terminal; TQDM_DISABLE: no progress-bar widget, which a static page would show
# empty), then render them, figures embedded, to build/*.html
# without the cells tagged hidden-tests (the reading form shows the chapter, not the grader's code)
# or student-instructions (how to fill in and check the stubs). nbconvert removes tagged cells before
# it executes, hence two steps. The mlbook template is JupyterLab's plus each figure's alternative
# text. The math is typeset by the MathJax the project ships (build/mathjax/), so the pages work offline.
MATHJAX_URL := mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe
html: notebooks
	TQDM_DISABLE=1 $(BIN)/python -m mlbook_tools.execute --timeout 600 \
		--output-dir $(OUT)/executed solutions/notebooks/*.ipynb
	$(BIN)/python -m mlbook_tools.mathjax $(OUT)/mathjax
	$(BIN)/jupyter nbconvert --to html \
		--TagRemovePreprocessor.remove_cell_tags='{"hidden-tests","student-instructions"}' \
		--HTMLExporter.mathjax_url='$(MATHJAX_URL)' \
		--TemplateExporter.extra_template_basedirs=tools/mlbook_tools/templates --template mlbook \
		--output-dir $(OUT) $(OUT)/executed/*.ipynb

chapter: train html
	@echo "done: open $(OUT)/rlhf_ppo.html (the solved chapter; $(OUT)/appendix_ddp.html the DDP appendix)"

lint: env
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Three tiers, chosen by the kinds each test file states (its module `pytestmark`; pyproject.toml lists
# them; tests/test_tiers.py proves every test is in exactly one tier):
# check     - lint, the layer contracts, the drift check (a generated notebook is stale), the `unit`
#             tests (`pytest -m unit`): no sandbox, no nbgrader, no Jupyter, no browser, no long run
#             (a guard in tests/conftest.py fails a unit test that starts one), a stale fairness
#             reference (run `make fairness-reference`); the fast lane, a few minutes
# test      - check, then every test of a heavier kind (HEAVY) not marked `full`: the sandboxed engine
#             and its bounds, real nbgrader, the one shared graded class (course workflow, the
#             adversarial catalog but its costliest entries, four fairness styles), the browser (JupyterLab, formgrader's pages), DDP on gloo, the student
#             distribution, three torchrun exits, and nbval: over every solved notebook
#             (the stored output of each cell tagged nbval-check-output must be reproduced, after
#             tests/nbval_sanitize.cfg) and over the student release (only cells tagged raises-exception,
#             those that need the student's answers, may fail). Then the tests that compare a trained or
#             sampled number with a stored one run again on torch's portable (non-vectorised) kernels, so
#             a result that holds only on this CPU's instruction set fails here, not on another machine.
# test-full - what make test leaves out, CI runs it right after (tests marked `full`, about 12 minutes):
#             a second graded class (the catalog's costliest entries, the other fairness styles), grades
#             under load (every core busy), the JupyterHub course, formgrader's manual grading in a
#             browser, the dist installed in a fresh venv, three more build guards, the long-command
#             progress lines, the class backstop, the 20-seed sweep, 17 more torchrun exits; then the solved notebooks
#             again on the portable kernels. On pytest-xdist as make test's heavy lane (the full tier of the
#             graded class on one worker, the other files on the other), but for ALONE, run after the others,
#             on their own: tests/test_load.py compares grades on the machine as it is with grades with every
#             core busy (a busy worker beside it would load its first grading; its busy cores, the other
#             worker's tests), and the 17 torchrun exits, where a gloo rank once aborted at exit while
#             another worker loaded the machine (1 run in 17). The DDP program now meets at a gloo barrier,
#             which waits for every rank's work in flight, before it frees DDP and the group; not seen
#             again in 40 runs beside 2 to 7 busy loops (neither was it before the barrier: too rare to
#             prove gone), so they stay on their own.
NBVAL := --nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg
HEAVY := sandbox or nbgrader or classrun or browser or notebook or slow or stress
PYTEST := $(BIN)/python -m pytest -q --durations=15
# The heavy lane on pytest-xdist, a worker per core: a file's tests on one worker, the files that read
# the graded class on one (tests/conftest.py groups them), so while the class is graded (or nbgrader,
# a kernel, a browser works) the other worker runs the other files.
XDIST  := -n auto

check: lint
	$(BIN)/lint-imports
	$(BIN)/mlbook build --check
	$(PYTEST) -m unit tests

test: check
	$(PYTEST) -m "($(HEAVY)) and not full" $(XDIST) tests $(NBVAL) solutions/notebooks/ chapters/*.ipynb
	ATEN_CPU_CAPABILITY=default $(PYTEST) -m "portable and not full" tests

ALONE  := tests/test_load.py 'tests/test_slow.py::test_ddp_torchrun_exits_cleanly_every_time[17]'

test-full: env
	$(PYTEST) -m full $(XDIST) $(addprefix --deselect ,$(ALONE)) tests
	$(PYTEST) $(ALONE)
	ATEN_CPU_CAPABILITY=default $(PYTEST) $(NBVAL) solutions/notebooks/

# The tests that depend on cgroups (marked `cgroup`) on a real cgroup v2 kernel: Debian's kernel
# (linux-image-amd64) under qemu with virtme-ng (requirements/vm.txt, its own .venv-vm), over this
# machine's root file system read-only (tests/cgroup2/run.sh). The memory bound (a hog, /dev/shm,
# memfd), a fork bomb at pids.max, CPU charged with children at one CPU, close leaving nothing,
# delegation to a non-root user, and a class of four (the process-starting styles) with two workers.
# Needs qemu-system-x86, linux-image-amd64 and busybox-static (.ci/run installs them); a guest that
# cannot boot is a skip here and a failure in CI. Under software emulation (TCG): about 22 minutes
# (2026-12-08 in CI's clean clone: 1299 s, boot included; the class of four 19.5 min of it).
test-cgroup2: env
	bash tests/cgroup2/run.sh

# The plain-nbgrader reference scores of the fairness styles (tests/data/fairness_reference.json):
# recompute the entries whose fingerprint moved (a new style, an edited chapter code cell, nbgrader).
fairness-reference: env
	$(BIN)/python tests/fairness_reference.py

# What students of a graded course get: the library wheel, the released notebooks, the student lock
# and a short README (build/student-dist).
student-dist: notebooks
	$(BIN)/mlbook student-dist

# requirements/student.txt: what the notebook imports plus Jupyter, no developer tool, each pinned at
# its lock.txt version (the closure is read from .venv, which `env` installs from lock.txt).
student-lock: env
	$(BIN)/python -m mlbook_tools.dist student-lock > requirements/student.new
	mv requirements/student.new requirements/student.txt

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
	$(MAKE) student-lock

clean:
	rm -rf $(OUT) $(VENV)
