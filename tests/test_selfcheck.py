"""The one count that "Check your work" and ``mlbook.handin`` both print (pure functions)."""

from mlbook.selfcheck import is_extra, summary


def test_the_summary_counts_every_check_and_says_core_and_extra_credit_apart():
    results = {"gae": None, "check of ppo_clip_loss": "AssertionError", "ex4_grad": "ValueError"}
    line = summary(results, ["check of ex5_decoupled"])
    assert line.startswith("1 of 4 visible checks pass, 1 not run here"), line
    assert "(core 1 of 2; extra credit 0 of 2)." in line, line


def test_a_notebook_whose_only_failures_are_extra_credit_reads_full_core():
    line = summary({"gae": None, "test_kl": None, "ex3_pairwise": "AssertionError"})
    assert line == "2 of 3 visible checks pass (core 2 of 2; extra credit 0 of 1).", line


def test_extra_credit_is_the_ex_grade_ids_and_their_check_cells():
    assert is_extra("ex4_grad") and is_extra("check of ex5_decoupled")
    assert not is_extra("gae") and not is_extra("check of gae")
