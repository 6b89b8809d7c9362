"""docs/teaching.md runs as written: every exercise's ``sh {.teach}`` commands and ``python
teach`` cells run (small frame counts), and the results its "Expected" blocks state are the
ones they produce, within the stated tolerances (tests/demos/teach.py reads the page)."""

from __future__ import annotations

import pytest
import teach

EXERCISES = teach.exercises()


def test_the_guide_has_six_exercises_each_with_runs_and_stated_results():
    assert [e.number for e in EXERCISES] == [1, 2, 3, 4, 5, 6]
    for e in EXERCISES:
        assert e.blocks, f"exercise {e.number} has nothing to run"
        assert len(e.expects) >= 3, f"exercise {e.number} states too few results"
        for line in e.expects:
            teach.parse(line)  # every stated result is readable


def test_the_checker_fails_a_wrong_statement():
    ns = {"x": 1.0, "name": "admm"}
    assert teach.check("x = 1.04 ± 5%", ns) is None
    assert teach.check("x = 1.1 ± 5%", ns) is not None
    assert teach.check("x = 1.2 ± 0.1", ns) is not None
    assert teach.check("x < 0.5", ns) is not None and teach.check("x > 2", ns) is not None
    assert teach.check("name == 'admm'", ns) is None and teach.check("name == 'xpbd'", ns) is not None
    with pytest.raises(ValueError):
        teach.check("x = 1.0", ns)  # a number without its tolerance


@pytest.mark.slow
@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: f"exercise-{e.number}")
def test_exercise_runs_and_gives_the_stated_results(exercise, tmp_path):
    ns = teach.run(exercise, tmp_path)
    wrong = [msg for line in exercise.expects if (msg := teach.check(line, ns)) is not None]
    assert not wrong, f"exercise {exercise.number} ({exercise.title}):\n" + "\n".join(wrong)
