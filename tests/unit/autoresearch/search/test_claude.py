"""Claude and hybrid proposers through the real `anthropic` SDK against a loopback fake Messages endpoint.

Every scenario of issue 3 (good proposal, 429 then success, 500, malformed JSON, out-of-space values, duplicate)
plus the ledger, the prompt and the key hygiene. The invariant behind all of them: `propose()` never raises; it
returns a validated Proposal or None (TPE chooses that trial).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket

import anthropic
import httpx2
import optuna
import pytest
from anthropic.resources.messages import DEPRECATED_MODELS

from autoresearch.records import TrialRow
from autoresearch.search.proposers.base import Proposal, ProposalContext
from autoresearch.search.proposers.claude import DEFAULT_MODEL, ClaudeProposer, cost_usd, model_price, sdk_models
from autoresearch.search.proposers.hybrid import HybridProposer, is_claude_turn
from autoresearch.search.proposers.prompt import EXIT_CODES, TOOL_NAME, system_prompt, trial_table
from autoresearch.space import ChoiceParam, FloatParam, SearchSpace
from tests.fake_anthropic import FakeAnthropic

KEY = "sk-ant-test-9f3c1e7a5b2d4c6e8a0b"  # never a real key; unique enough to grep for


LR, MB, OPT = "optim.lr", "training.micro_batch_size", "optim"


def toy_space() -> SearchSpace:
    return SearchSpace(
        name="toy",
        description="learning rate and micro-batch of a tiny GPT",
        objective={"metric": "val_loss", "direction": "minimize"},
        world_size=2,
        fixed={"model": "tiny"},
        params={
            LR: FloatParam(low=1e-4, high=1e-1, log=True, nan="up"),
            MB: ChoiceParam(values=[1, 2, 4, 8], memory="up"),
            OPT: ChoiceParam(values=["adamw", "muon"]),
        },
        constraints=[f"{MB} * world_size <= 8"],
    )


TABLE = [
    TrialRow(
        number=0,
        state="COMPLETE",
        params={LR: 0.003, MB: 2, OPT: "adamw"},
        status="ok",
        exit_code=0,
        objective=3.2145,
        peak_memory_bytes=512 * 2**20,
        predicted_memory_bytes=480 * 2**20,
        reason="",
    ),
    TrialRow(
        number=1,
        state="COMPLETE",
        params={LR: 0.003, MB: 4, OPT: "adamw"},
        status="oom",
        exit_code=10,
        objective=None,
        peak_memory_bytes=2048 * 2**20,
        predicted_memory_bytes=1900 * 2**20,
        reason="rank 1 out of memory: limit 2 GiB",
    ),
    TrialRow(
        number=2,
        state="COMPLETE",
        params={LR: 0.09, MB: 1, OPT: "muon"},
        status="nan",
        exit_code=12,
        objective=None,
        peak_memory_bytes=300 * 2**20,
        predicted_memory_bytes=None,
        reason="loss became NaN at step 7",
    ),
]

GOOD = {LR: 0.001, MB: 2, OPT: "muon", "rationale": "muon at a safe lr"}


def check_against(table):
    """ctx.check as the agent provides it: duplicates of earlier trials are rejected with the trial's number."""

    def check(params):
        for row in table:
            if row.params == params:
                return f"duplicate of trial {row.number}"
        return None

    return check


@pytest.fixture
def ctx():
    return ProposalContext(space=toy_space(), table=[dataclasses.replace(r) for r in TABLE], check=check_against(TABLE))


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    # The key comes from the environment, as in production; nothing else may point the SDK elsewhere.
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))
    for name in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "ANTHROPIC_CUSTOM_HEADERS", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake():
    with FakeAnthropic() as f:
        yield f


def make(fake, **kw) -> ClaudeProposer:
    kw.setdefault("max_retries", 1)
    kw.setdefault("timeout", 10)
    return ClaudeProposer(base_url=fake.url, **kw)


def tool_results(request) -> list[dict]:
    """The tool_result blocks of the last user message of a recorded request."""
    last = request.json["messages"][-1]
    assert last["role"] == "user"
    return [b for b in last["content"] if b.get("type") == "tool_result"]


# -- the scenarios of issue 3 -----------------------------------------------------------------------------------


def test_good_proposal(fake, ctx):
    fake.tool_use(GOOD, input_tokens=1500, output_tokens=100)
    p = make(fake).propose(None, ctx)
    assert isinstance(p, Proposal)
    assert p.params == {LR: 0.001, MB: 2, OPT: "muon"}
    assert p.proposer == "claude"
    assert p.rationale == "muon at a safe lr"
    # claude-sonnet-5-5 at $2 / $10 per million tokens.
    assert p.usage == {"input_tokens": 1500, "output_tokens": 100, "cost_usd": pytest.approx(0.004), "calls": 1}
    assert len(fake.messages_requests) == 1 and fake.unscripted == 0


def test_request_forces_the_tool_and_carries_the_schema(fake, ctx):
    fake.tool_use(GOOD)
    make(fake, max_tokens=777).propose(None, ctx)
    body = fake.messages_requests[0].json
    assert body["tool_choice"] == {"type": "tool", "name": TOOL_NAME, "disable_parallel_tool_use": True}
    assert [t["name"] for t in body["tools"]] == [TOOL_NAME]
    assert body["tools"][0]["input_schema"] == toy_space().json_schema()
    assert body["model"] == DEFAULT_MODEL
    assert body["max_tokens"] == 777


def test_prompt_carries_table_and_exit_codes(fake, ctx):
    fake.tool_use(GOOD)
    make(fake).propose(None, ctx)
    body = fake.messages_requests[0].json
    system = body["system"] if isinstance(body["system"], str) else " ".join(b["text"] for b in body["system"])
    user = body["messages"][0]["content"][0]["text"]
    for code, (status, _) in EXIT_CODES.items():
        assert f"- {code} ({status}):" in system
    assert "dominated by an OOM" in system and "loss rose above 1.5x its first value" in system
    assert toy_space().describe() in user
    assert "minimize `val_loss` (lower is better). Best so far: trial 0 with val_loss = 3.2145." in user
    # One row per trial: params, status, exit code, objective, measured and predicted MiB, reason.
    assert (
        '| 0 | {"optim":"adamw","optim.lr":0.003,"training.micro_batch_size":2} | ok | 0 | 3.2145 | 512 | 480 '
        "| - |" in user
    )
    assert (
        '| 1 | {"optim":"adamw","optim.lr":0.003,"training.micro_batch_size":4} | oom | 10 | - | 2048 | 1900 | '
        "rank 1 out of memory: limit 2 GiB |" in user
    )
    assert "| 2 |" in user and "| nan | 12 |" in user and "loss became NaN at step 7" in user


def test_429_then_success_uses_the_sdk_retry(fake, ctx):
    fake.error(429, "rate limited")
    fake.tool_use(GOOD)
    p = make(fake, max_retries=2).propose(None, ctx)
    assert p is not None and p.params[OPT] == "muon"
    reqs = fake.messages_requests
    assert len(reqs) == 2
    # The retry is the SDK's own (it counts its retries in this header), not a loop of ours.
    assert [r.headers["x-stainless-retry-count"] for r in reqs] == ["0", "1"]
    assert p.usage["calls"] == 1


def test_persistent_500_falls_back_and_the_loop_goes_on(fake, ctx, caplog):
    fake.error(500, "internal", times=2)
    proposer = make(fake, max_retries=1)
    with caplog.at_level(logging.WARNING, logger="autoresearch"):
        assert proposer.propose(None, ctx) is None
    assert len(fake.messages_requests) == 2  # one call + max_retries=1 retry, by the SDK
    assert "InternalServerError (HTTP 500)" in caplog.text and "TPE chooses this trial" in caplog.text
    assert proposer.disabled is None  # transient: the next trial asks again
    fake.tool_use(GOOD)
    assert proposer.propose(None, ctx).params[LR] == 0.001


def test_malformed_json_body_falls_back(fake, ctx, caplog):
    fake.raw(200, b'{"id": "msg_1", "content": [')
    proposer = make(fake)
    with caplog.at_level(logging.WARNING, logger="autoresearch"):
        assert proposer.propose(None, ctx) is None
    assert "malformed response" in caplog.text
    fake.tool_use(GOOD)
    assert proposer.propose(None, ctx) is not None


def test_out_of_space_then_good_feeds_the_error_back(fake, ctx):
    fake.tool_use({**GOOD, LR: 5.0})
    fake.tool_use(GOOD)
    p = make(fake).propose(None, ctx)
    assert p.params == {LR: 0.001, MB: 2, OPT: "muon"}
    first, second = fake.messages_requests
    # The second request replays the rejected call and answers it with the exact reason.
    assistant = second.json["messages"][-2]
    assert assistant["role"] == "assistant" and assistant["content"][0]["input"][LR] == 5.0
    [result] = tool_results(second)
    assert result["is_error"] is True
    assert result["tool_use_id"] == assistant["content"][0]["id"]
    assert "violates the search space: optim.lr=5.0: above the maximum 0.1" in result["content"]
    assert p.usage["calls"] == 2 and p.usage["input_tokens"] == 2400


def test_constraint_violation_is_fed_back(fake, ctx):
    fake.tool_use({**GOOD, MB: 8})
    fake.tool_use(GOOD)
    assert make(fake).propose(None, ctx) is not None
    [result] = tool_results(fake.messages_requests[1])
    assert (
        "violates the search space: constraint violated: training.micro_batch_size * world_size <= 8"
        in result["content"]
    )


def test_duplicate_is_asked_again(fake, ctx):
    fake.tool_use({**TABLE[0].params, "rationale": "the best so far again"})
    fake.tool_use(GOOD)
    p = make(fake).propose(None, ctx)
    assert p.params[OPT] == "muon"
    [result] = tool_results(fake.messages_requests[1])
    assert "would be skipped without running: duplicate of trial 0" in result["content"]


def test_missing_tool_use_is_asked_again_with_text(fake, ctx):
    fake.text("I think a learning rate of 1e-3 is good.")
    fake.tool_use(GOOD)
    assert make(fake).propose(None, ctx) is not None
    last = fake.messages_requests[1].json["messages"][-1]
    assert last["role"] == "user" and last["content"][0]["type"] == "text"
    assert "no `propose_trial` tool call" in last["content"][0]["text"]


def test_malformed_tool_input_is_asked_again(fake, ctx):
    fake.tool_use("lr=0.001")  # not an object
    fake.tool_use({LR: "fast", MB: 2, OPT: "adamw", "rationale": "x"})
    fake.tool_use(GOOD)
    assert make(fake).propose(None, ctx) is not None
    reqs = fake.messages_requests
    assert "must be a JSON object, got str" in tool_results(reqs[1])[0]["content"]
    assert "not in the search space: optim.lr: 'fast' is not a number" in tool_results(reqs[2])[0]["content"]


def test_too_many_invalid_answers_fall_back(fake, ctx, caplog):
    fake.tool_use({**GOOD, LR: 5.0}, times=2)
    proposer = make(fake, max_invalid=2)
    with caplog.at_level(logging.WARNING, logger="autoresearch"):
        assert proposer.propose(None, ctx) is None
    assert len(fake.messages_requests) == 2 and fake.unscripted == 0
    assert "no valid proposal after 2 attempts" in caplog.text and "optim.lr=5.0: above the maximum 0.1" in caplog.text
    # The tokens of the failed attempts still count.
    assert proposer.last_usage["calls"] == 2 and proposer.total_input_tokens == 2400


def test_accepts_a_given_client(ctx):
    # The SDK also runs on an injected httpx2 client; here a MockTransport answers in-process.
    seen = []

    def handler(request):
        seen.append(json.loads(request.content))
        block = {"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": GOOD}
        return httpx2.Response(
            200,
            json={
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "m",
                "content": [block],
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": {"input_tokens": 7, "output_tokens": 3},
            },
        )

    client = anthropic.Anthropic(
        base_url="http://mock.invalid",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )
    p = ClaudeProposer(client=client).propose(None, ctx)
    assert p.params == {LR: 0.001, MB: 2, OPT: "muon"}
    assert p.usage["input_tokens"] == 7 and seen[0]["tool_choice"]["name"] == TOOL_NAME


# -- the ledger -------------------------------------------------------------------------------------------------


def test_cost_accumulates_over_proposals(fake, ctx):
    fake.tool_use(GOOD, input_tokens=1_000_000, output_tokens=0)
    fake.tool_use({**GOOD, LR: 0.002}, input_tokens=0, output_tokens=100_000)
    proposer = make(fake)
    assert proposer.propose(None, ctx).usage["cost_usd"] == pytest.approx(2.0)
    assert proposer.propose(None, ctx).usage["cost_usd"] == pytest.approx(1.0)
    assert proposer.total_cost_usd == pytest.approx(3.0)
    assert (proposer.calls, proposer.total_input_tokens, proposer.total_output_tokens) == (2, 1_000_000, 100_000)


def test_unknown_model_counts_tokens_without_cost(fake, ctx):
    fake.tool_use(GOOD, input_tokens=10, output_tokens=5)
    proposer = make(fake, model="claude-experimental-9")
    p = proposer.propose(None, ctx)
    assert p.usage == {"input_tokens": 10, "output_tokens": 5, "cost_usd": None, "calls": 1}
    assert proposer.total_cost_usd is None
    assert fake.messages_requests[0].json["model"] == "claude-experimental-9"


def test_prices():
    assert model_price("claude-haiku-4-5-20251001") == model_price("claude-haiku-4-5") == (1.0, 5.0)
    assert cost_usd("claude-opus-5-5", 1_000_000, 1_000_000) == pytest.approx(24.0)
    assert cost_usd("not-a-model", 1, 1) is None


def test_default_model_is_current_in_this_sdk():
    assert DEFAULT_MODEL in sdk_models()
    assert DEFAULT_MODEL not in DEPRECATED_MODELS
    assert model_price(DEFAULT_MODEL) is not None


# -- failures that stop asking, and key hygiene -----------------------------------------------------------------


def test_auth_error_disables_claude(fake, ctx):
    fake.error(401, "invalid x-api-key")
    proposer = make(fake)
    assert proposer.propose(None, ctx) is None
    assert proposer.disabled == "AuthenticationError (HTTP 401)"
    assert proposer.propose(None, ctx) is None
    assert len(fake.messages_requests) == 1  # not asked again


def test_no_api_key_never_calls(fake, ctx, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    proposer = make(fake)
    assert proposer.propose(None, ctx) is None
    assert "ANTHROPIC_API_KEY" in proposer.disabled
    assert fake.requests == []


def test_connection_refused_falls_back(ctx):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proposer = ClaudeProposer(base_url=f"http://127.0.0.1:{port}", max_retries=0, timeout=5)
    assert proposer.propose(None, ctx) is None


def test_api_key_never_logged_or_returned(fake, ctx, caplog):
    fake.error(429)
    fake.tool_use({**GOOD, LR: 5.0})
    fake.tool_use(GOOD)
    fake.error(500, f"upstream rejected credentials {KEY}", times=2)  # a server that echoes the key back
    fake.error(401, f"invalid key {KEY}")
    proposer = make(fake, max_retries=1)
    with caplog.at_level(logging.DEBUG):  # every logger, the SDK's and httpx2's included
        p = proposer.propose(None, ctx)
        assert proposer.propose(None, ctx) is None
        assert proposer.propose(None, ctx) is None
    assert p is not None
    # The key did travel, in the request header only, so the test would notice if it were not the one in use.
    assert KEY in fake.messages_requests[0].headers.get("authorization", "") + fake.messages_requests[0].headers.get(
        "x-api-key", ""
    )
    logged = caplog.text + " ".join(str(r.args) for r in caplog.records)
    assert "upstream rejected credentials ***" in caplog.text
    assert KEY not in logged
    assert KEY not in repr(p) and KEY not in json.dumps(p.usage) and KEY not in p.rationale
    assert KEY not in repr(proposer) and KEY not in json.dumps(proposer.last_usage)


# -- prompt -----------------------------------------------------------------------------------------------------


def test_trial_table_empty_and_bounded():
    assert "first one" in trial_table([])
    rows = [
        TrialRow(number=i, state="COMPLETE", params={"x": i}, status="ok", exit_code=0, objective=10.0 - (i == 3) * 5)
        for i in range(10)
    ]
    text = trial_table(rows, "minimize", max_rows=4)
    numbers = [line.split("|")[1].strip() for line in text.splitlines()[2:] if line.startswith("| ")]
    assert numbers == ["3", "6", "7", "8", "9"]  # the best (trial 3) is kept beside the most recent four
    assert "(5 older trials omitted" in text


def test_system_prompt_names_the_tool():
    assert f"`{TOOL_NAME}`" in system_prompt()


# -- hybrid -----------------------------------------------------------------------------------------------------


def test_hybrid_schedule():
    assert [k for k in range(20) if is_claude_turn(k, 0.3)] == [3, 6, 9, 13, 16, 19]
    assert sum(is_claude_turn(k, 0.29) for k in range(100)) == 29
    assert not any(is_claude_turn(k, 0.0) for k in range(50))
    assert all(is_claude_turn(k, 1.0) for k in range(50))
    h = HybridProposer(ClaudeProposer(), every=3)
    assert [k for k in range(9) if h.is_claude_turn(k)] == [2, 5, 8]
    with pytest.raises(ValueError):
        HybridProposer(ClaudeProposer(), fraction=1.5)


class StudyOf:
    """A study with k trials, as far as the hybrid proposer looks."""

    def __init__(self, k):
        self.k = k

    def get_trials(self, deepcopy=True):
        return [None] * self.k


def test_hybrid_asks_claude_only_on_its_turns(fake, ctx):
    hybrid = HybridProposer(make(fake), fraction=0.3)
    assert hybrid.name == "hybrid"
    assert [hybrid.propose(StudyOf(k), ctx) for k in range(3)] == [None, None, None]
    assert fake.requests == []  # TPE's turns cost nothing
    fake.tool_use(GOOD)
    p = hybrid.propose(StudyOf(3), ctx)
    assert p.proposer == "claude" and p.params[LR] == 0.001
    assert hybrid.total_cost_usd == pytest.approx(cost_usd(DEFAULT_MODEL, 1200, 80))
    fake.error(500, times=2)
    assert hybrid.propose(StudyOf(6), ctx) is None  # Claude failed: TPE takes the turn


def test_hybrid_counts_trials_of_a_real_study(fake, ctx):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for _ in range(3):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        study.tell(trial, trial.params["x"])
    fake.tool_use(GOOD)
    assert HybridProposer(make(fake), fraction=0.3).propose(study, ctx) is not None  # trial 3 is Claude's
    assert len(study.trials) == 3  # proposing does not add a trial; the agent enqueues it
