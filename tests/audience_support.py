"""What each audience's rendering must and must not say (tests/test_audiences*.py)."""

# What only a reader of the checkout can follow (the self-paced instructions)
SELF_PACED_ONLY = ("mlbook start", "chapters/", "git clone", "mlbook grade", "checkout")
# What a course student needs: save, check, hand in through the hub or the file to upload
COURSE_ONLY = ("Assignments tab", "Submit")


def prose(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def assert_course_text(nb, where):
    text = prose(nb)
    leaked = [w for w in SELF_PACED_ONLY if w in text]
    assert not leaked, f"{where} tells a course student {leaked}"
    for phrase in (*COURSE_ONLY, "Ctrl+S", "Check your work", "to-upload/rlhf_ppo.ipynb"):
        assert phrase in text, f"{where} lacks {phrase!r}"


def assert_self_paced_text(nb, where):
    text = prose(nb)
    for phrase in ("mlbook start", "chapters/", "Check your work", "to-upload/rlhf_ppo.ipynb"):
        assert phrase in text, f"{where} lacks {phrase!r}"
    assert not [w for w in COURSE_ONLY if w in text], f"{where} holds the course's hand-in text"
