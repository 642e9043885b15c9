from tirl.envs.arithmetic import ArithmeticEnv
from tirl.envs.seeding import item_rng, split_of
from tirl.tasks.sources.arithmetic import score_integer


def test_train_and_test_never_share_an_item(env):
    train = {t.question for t in env.items("train", 5000)}
    test = {t.question for t in env.items("test", 5000)}
    assert not train & test


def test_every_item_lands_in_its_own_split(env):
    for split in ("train", "test"):
        assert all(split_of("arithmetic", t.question) == split for t in env.items(split, 300))


def test_items_are_deterministic_and_seeds_differ(env):
    assert env.items("train", 50) == env.items("train", 50)
    other = ArithmeticEnv(seed=1).items("train", 50)
    assert sum(a.question == b.question for a, b in zip(env.items("train", 50), other)) == 0


def test_item_seeds_depend_on_every_part():
    base = item_rng("arithmetic", "k", "train", 0, 0).random()
    for args in [
        ("x", "k", "train", 0, 0),
        ("arithmetic", "j", "train", 0, 0),
        ("arithmetic", "k", "test", 0, 0),
        ("arithmetic", "k", "train", 1, 0),
        ("arithmetic", "k", "train", 0, 1),
    ]:
        assert item_rng(*args).random() != base


def test_gold_answers_are_right(env):
    for task in env.items("train", 200):
        a, b = (int(x) for x in task.expression.split(" % ")[0].split(" + ")[0].split(" * "))
        if task.kind == "product":
            assert int(task.answer) == a * b
        assert str(eval(task.expression)) == task.answer  # our own generated arithmetic


def test_the_arithmetic_scorer_accepts_only_the_gold_integer():
    def correct(text: str) -> bool:
        return score_integer(144, text).correct

    assert correct("\\boxed{144}") and correct("\\boxed{ 144 }") and correct("\\boxed{0144}")
    assert correct("\\boxed{1,44}") is False and correct("so \\boxed{1,440}") is False
    assert not correct("\\boxed{145}") and not correct("144") and not correct("\\boxed{144.5}")


def test_the_arithmetic_scorer_refuses_digit_groups_split_by_spaces():
    """A boxed "1 46" is two numbers, not 146 (issue 45); a space grouping thousands is fine."""
    assert score_integer(146, "\\boxed{1 46}").reward == 0.0
    assert score_integer(146, "\\boxed{14 6}").reward == 0.0
    assert score_integer(1046, "\\boxed{1 046}").correct
    assert score_integer(1046, "\\boxed{1,046}").correct
    assert score_integer(1046, "\\boxed{1046}").correct


def test_bad_config_is_rejected():
    import pytest

    with pytest.raises(ValueError, match="kinds"):
        ArithmeticEnv(kinds=("division",))
    with pytest.raises(ValueError, match="digits"):
        ArithmeticEnv(digits=0)
