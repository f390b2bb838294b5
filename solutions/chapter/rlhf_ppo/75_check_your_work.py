# %% [markdown] tags=["student-instructions"]
# ## Check your work
#
# Run this cell after the rest (Run All, or run everything above first). It runs the visible part of
# every graded cell again against your functions and prints one line per check. It reads this
# notebook's file and writes nothing. The hidden tests are not in your copy: they run when the
# notebook is graded, and written answers are graded by a person.

# %% tags=["student-instructions"]
from mlbook.selfcheck import check

_checked = check("rlhf_ppo.ipynb")
