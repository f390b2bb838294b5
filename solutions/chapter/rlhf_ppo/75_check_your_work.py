# %% [markdown] tags=["student-instructions"]
# ## Check your work
#
# Run the cell below after the rest (Run All, or run everything above first). It runs the visible
# part of every graded cell again against your functions and prints one line per check. It reads
# this notebook's file and writes nothing. The hidden tests are not in your copy: they run when the
# notebook is graded, and written answers are graded by a person. Each line names the function or
# section it checks.

# %% tags=["student-instructions"]
from mlbook.selfcheck import check

_checked = check("rlhf_ppo.ipynb")

# %% [markdown] tags=["student-instructions", "self-paced"]
# **Hand in.** Save (Ctrl+S), then in a terminal in your work folder run
# `python -m mlbook.handin rlhf_ppo.ipynb` (with the checkout: `mlbook handin`), or in a new cell
# `from mlbook.handin import handin; handin()`. It checks that the saved file is what this kernel
# ran, is named `rlhf_ppo.ipynb` and is readable, runs these checks, and writes the one file to
# upload, `to-upload/rlhf_ppo.ipynb`. Nothing else is written.

# %% [markdown] tags=["student-instructions", "course"]
# **Hand in.** Save (Ctrl+S) and keep the name `rlhf_ppo.ipynb`. On your course's JupyterHub, open
# the Assignments tab (Nbgrader > Assignment List) and press Submit next to `rlhf_ppo`; you may
# submit again, and the course collects your latest submission. If your course collects files
# instead, run `python -m mlbook.handin rlhf_ppo.ipynb` in a terminal in this notebook's folder (or
# `from mlbook.handin import handin; handin()` in a new cell): it checks that the saved file is what
# this kernel ran, is named as the course expects and is readable, runs these checks, and writes the
# one file to upload, `to-upload/rlhf_ppo.ipynb`. Nothing else is written.
