"""The one config identity the agent uses everywhere (``records.config_key``), and the shared outcome records."""

from autoresearch import records
from autoresearch.records import Status, config_key, diverged


def test_numbers_compare_as_numbers_and_survive_a_storage_round_trip():
    assert config_key({"mbs": 4}) == config_key({"mbs": 4.0})
    assert config_key({"lr": 0.003}) == config_key({"lr": 0.0030000000000000005})
    assert config_key({"lr": 0.003}) != config_key({"lr": 0.0031})
    assert config_key({"a": 1, "b": "x"}) == config_key({"b": "x", "a": 1})  # order of keys does not matter


def test_booleans_are_not_counts_and_none_is_not_a_string():
    assert config_key({"flag": True}) != config_key({"flag": 1})
    assert config_key({"flag": False}) != config_key({"flag": 0})
    assert config_key({"x": None}) != config_key({"x": "None"})
    assert config_key({"x": "4"}) != config_key({"x": 4})
    assert len({config_key({"v": v}) for v in (True, 1, 1.0, "1", None)}) == 4  # 1 and 1.0 are one value


def test_exit_codes_name_the_core_statuses():
    assert {code: Status.of_exit(code) for code in (0, 1, 2, 10, 11, 12, 13)} == {
        0: "ok",
        1: "error",
        2: "invalid",
        10: "oom",
        11: "compile_error",
        12: "nan",
        13: "timeout",
    }
    assert Status.of_exit(99) == Status.of_exit(None) == Status.ERROR  # an unknown end is an error
    assert set(records.FAILURE_KINDS) < set(records.RAN) and "space" in records.CONSTRAINT_KEYS
    assert not set(records.SKIPPED) & set(records.RAN) and not set(records.ABANDONED) & set(records.RAN)


def test_statuses_are_their_strings_in_sets_dicts_and_json():
    import json

    assert "oom" in {Status.OOM} and {"nan": 1}[Status.NAN] == 1 and f"{Status.PRUNED}" == "pruned"
    assert json.loads(json.dumps({"s": Status.TIMEOUT})) == {"s": "timeout"}


def test_diverged_needs_two_measured_losses():
    assert diverged({"first_loss": 2.0, "final_loss": 3.1})
    assert not diverged({"first_loss": 2.0, "final_loss": 2.9})
    assert not diverged({"first_loss": None, "final_loss": 30.0})
    assert not diverged({"first_loss": float("nan"), "final_loss": 30.0}) and not diverged(None)


def test_foreknowledge_says_the_gates_peak_and_the_proposers_failure_odds():
    Attr, foreknowledge = records.Attr, records.foreknowledge
    rationale = "expected improvement 0.12 x P(no failure) 0.93: the best runnable of 512 candidates"
    attrs = {Attr.PREDICTED_MEMORY: 812 * 2**20, Attr.RATIONALE: rationale}
    assert foreknowledge(attrs) == "predicted peak 812 MiB, failure probability 0.07"
    assert foreknowledge({Attr.RATIONALE: "random"}) == "" == foreknowledge({Attr.PREDICTED_MEMORY: None})
