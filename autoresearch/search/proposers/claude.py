"""Claude as a proposer: one forced tool call per attempt, validated as data, TPE as the fallback.

The model sees the space, the objective and the table of trials so far (`prompt.py`) and must answer with a
`propose_trial` tool call whose `input_schema` is the space's own JSON schema. The call's `input` is data: it is
coerced into the space, checked against the constraints and against the feasibility memory (`ctx.check`), and only
then becomes a `Proposal`. An invalid answer is sent back with the reason (a `tool_result` with `is_error`) and asked
again, up to `max_invalid` attempts.

Failures never stop the study: any API error (after the SDK's own retries, `max_retries`, which handle 429/5xx with
backoff and `retry-after`), a malformed response or a persistently invalid answer makes `propose` return None, and
the agent lets TPE choose that trial. The API key is read by the SDK from `ANTHROPIC_API_KEY`; this module never
stores it, and scrubs it from anything it logs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import typing
from typing import Any

import anthropic
from anthropic.resources.messages import DEPRECATED_MODELS
from anthropic.types import Model

from autoresearch.search.prior import StepPrior
from autoresearch.search.proposers.base import Proposal, ProposalContext, Proposer
from autoresearch.search.proposers.prompt import (
    TOOL_NAME,
    invalid_feedback,
    plan_section,
    system_prompt,
    user_prompt,
)

log = logging.getLogger(__name__)

# The newest Sonnet in anthropic 2.14's `types.Model` literal and not in its DEPRECATED_MODELS (claude-sonnet-4-5
# reaches end of life on 2026-11-30). Sonnet rather than Opus: a proposal is a short structured answer to a table,
# and at Sonnet's price a long study costs cents. Override with `--model`.
DEFAULT_MODEL = "claude-sonnet-5-5"

# USD per million (input, output) tokens, standard tier, no prompt caching or batching. Gathered on 2026-11-29 from
# published price tables (Anthropic's pricing page as quoted by third parties, verified there 2026-10). A model not
# listed here gets cost None: its tokens are still counted, but --max-cost cannot be enforced for it.
PRICES_USD_PER_MTOK: dict[str, tuple[float, float]] = {
    "claude-fable-5-1": (10.0, 50.0),
    "claude-mythos-5-1": (10.0, 50.0),
    "claude-fable-5": (10.0, 50.0),
    "claude-mythos-5": (10.0, 50.0),
    "claude-opus-5-5": (4.0, 20.0),
    "claude-opus-5": (5.0, 25.0),
    "claude-opus-4-8": (5.0, 25.0),
    "claude-opus-4-7": (5.0, 25.0),
    "claude-opus-4-6": (5.0, 25.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-sonnet-5-5": (2.0, 10.0),
    "claude-sonnet-5": (2.0, 10.0),
    "claude-sonnet-4-6": (3.0, 15.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-haiku-5-5": (0.10, 0.50),  # the rate for prompts up to 100k tokens; ours are far smaller
    "claude-haiku-4-5": (1.0, 5.0),
}

# Errors that will not go away by asking again: stop calling the API for the rest of the study.
_PERMANENT = (anthropic.AuthenticationError, anthropic.PermissionDeniedError, anthropic.NotFoundError)

_RATIONALE_CHARS = 2000


def sdk_models() -> list[str]:
    """The model names this version of the SDK knows (its `types.Model` literal)."""
    names: list[str] = []
    for arg in typing.get_args(Model):
        names.extend(a for a in typing.get_args(arg) if isinstance(a, str))
    return names


def model_price(model: str) -> tuple[float, float] | None:
    # Dated snapshots ("claude-haiku-4-5-20251001") cost the same as their alias.
    return PRICES_USD_PER_MTOK.get(re.sub(r"-\d{8}$", "", model))


def cost_usd(model: str, input_tokens: int, output_tokens: int) -> float | None:
    price = model_price(model)
    if price is None:
        return None
    return (input_tokens * price[0] + output_tokens * price[1]) / 1e6


class ClaudeProposer(Proposer):
    name = "claude"

    def __init__(
        self,
        *,
        model: str | None = None,
        client: anthropic.Anthropic | None = None,
        max_invalid: int = 3,
        max_tokens: int = 1024,
        base_url: str | None = None,
        max_retries: int = 2,
        timeout: float = 60,
        prior: StepPrior | None = None,
    ):
        """``prior`` (``--plan``): the step-time model whose best predictions each request shows."""
        if max_invalid < 1:
            raise ValueError(f"max_invalid must be at least 1, got {max_invalid}")
        self.model = model or DEFAULT_MODEL
        self.max_invalid = max_invalid
        self.max_tokens = max_tokens
        self.prior = prior
        self._client = client
        self._client_args = {"base_url": base_url, "max_retries": max_retries, "timeout": timeout}
        self._lock = threading.Lock()  # the agent may propose from several worker threads
        # Ledger over the whole study; the agent reads total_cost_usd for --max-cost.
        self.calls = 0
        self.total_input_tokens = 0
        self.total_output_tokens = 0
        self.total_cost_usd: float | None = 0.0 if model_price(self.model) else None
        self.last_usage: dict | None = None  # usage of the latest propose(), also when it fell back to TPE
        self.disabled: str | None = None  # set after a permanent error: why Claude is no longer asked
        if self.model in DEPRECATED_MODELS:
            log.warning(
                "claude: model %r is deprecated and reaches end of life on %s; pick a newer one with --model",
                self.model,
                DEPRECATED_MODELS[self.model],
            )
        elif self.model not in sdk_models():
            log.warning(
                "claude: model %r is not in anthropic %s's model list; using it as given",
                self.model,
                anthropic.__version__,
            )
        if self.total_cost_usd is None:
            log.warning("claude: no price on file for %r: tokens are counted, cost is not", self.model)

    # -- client -------------------------------------------------------------------------------------------------

    def _ensure_client(self) -> bool:
        """Create the SDK client on first use; False, with `disabled` saying why, when there are no credentials."""
        if self._client is not None:
            return True
        # The SDK reads ANTHROPIC_API_KEY itself; we never pass, keep or print the key.
        try:
            client = anthropic.Anthropic(**self._client_args)
        except anthropic.CredentialsError:
            # With no key in the environment the SDK looks for a profile on disk, and raises when there is none.
            self.disabled = "no ANTHROPIC_API_KEY in the environment and no usable Anthropic profile"
            return False
        if client.api_key is None and client.auth_token is None and client.credentials is None:
            self.disabled = "no ANTHROPIC_API_KEY in the environment"
            return False
        self._client = client
        return True

    def _secrets(self) -> list[str]:
        found = [os.environ.get("ANTHROPIC_API_KEY"), os.environ.get("ANTHROPIC_AUTH_TOKEN")]
        if self._client is not None:
            found += [getattr(self._client, "api_key", None), getattr(self._client, "auth_token", None)]
        return [s for s in found if isinstance(s, str) and len(s) >= 8]

    def _redact(self, text: str) -> str:
        # Error messages come from the server or the SDK; scrub the key in case one ever echoes it.
        for secret in self._secrets():
            text = text.replace(secret, "***")
        return text

    # -- proposing ----------------------------------------------------------------------------------------------

    def propose(self, study: Any, ctx: ProposalContext) -> Proposal | None:
        """A validated proposal, or None to let TPE choose this trial. Never raises."""
        if self.disabled:  # no call, so last_usage stays that of the last call made
            log.info("claude: not asked (%s); TPE chooses this trial", self.disabled)
            return None
        usage = {
            "input_tokens": 0,
            "output_tokens": 0,
            "cost_usd": 0.0 if self.total_cost_usd is not None else None,
            "calls": 0,
        }
        self.last_usage = usage
        try:
            if not self._ensure_client():
                log.warning("claude: %s; Claude is disabled for this study, TPE chooses the trials", self.disabled)
                return None
            return self._propose(ctx, usage)
        except _PERMANENT as e:
            self.disabled = f"{type(e).__name__} (HTTP {e.status_code})"
            log.error(
                "claude: %s: %s; Claude is disabled for this study, TPE chooses the trials",
                self.disabled,
                self._redact(_short(e)),
            )
        except anthropic.APIStatusError as e:
            log.warning(
                "claude: API error %s (HTTP %s) after %s SDK retries: %s; TPE chooses this trial",
                type(e).__name__,
                e.status_code,
                self._client_args["max_retries"],
                self._redact(_short(e)),
            )
        except anthropic.APIError as e:  # connection, timeout, response validation
            log.warning("claude: %s: %s; TPE chooses this trial", type(e).__name__, self._redact(_short(e)))
        except json.JSONDecodeError as e:  # what the SDK raises for a 200 whose body is not JSON
            log.warning(
                "claude: malformed response (%s: %s); TPE chooses this trial", type(e).__name__, self._redact(_short(e))
            )
        except Exception as e:  # the study must go on whatever happened here
            log.warning("claude: unexpected %s: %s; TPE chooses this trial", type(e).__name__, self._redact(_short(e)))
            log.debug("claude: traceback", exc_info=True)
        return None

    def _propose(self, ctx: ProposalContext, usage: dict) -> Proposal | None:
        tool = {
            "name": TOOL_NAME,
            "description": "Propose the configuration of the next trial, with a one-paragraph rationale.",
            "input_schema": ctx.space.json_schema(),
        }
        plan = plan_section(self.prior, ctx.space, ctx.table) if self.prior is not None else ""
        request = {"type": "text", "text": user_prompt(ctx.space, ctx.table, plan)}
        messages: list[dict] = [{"role": "user", "content": [request]}]
        error = ""
        for attempt in range(1, self.max_invalid + 1):
            response = self._client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                system=system_prompt(),
                messages=messages,
                tools=[tool],
                # Forced: the answer is always this tool call, and exactly one of it.
                tool_choice={"type": "tool", "name": TOOL_NAME, "disable_parallel_tool_use": True},
            )
            self._record(usage, response)
            uses = [b for b in response.content if getattr(b, "type", None) == "tool_use"]
            mine = [b for b in uses if b.name == TOOL_NAME]
            if not mine:
                error = f"the answer has no `{TOOL_NAME}` tool call (stop_reason={response.stop_reason})"
            else:
                params, rationale, error = self._validate(mine[0].input, ctx)
                if params is not None:
                    if attempt > 1:
                        log.info("claude: proposal accepted on attempt %d/%d", attempt, self.max_invalid)
                    return Proposal(params=params, proposer=self.name, rationale=rationale, usage=dict(usage))
                if response.stop_reason == "max_tokens":
                    error += f" (the answer was cut at max_tokens={self.max_tokens}; keep the rationale short)"
            log.info("claude: proposal rejected (attempt %d/%d): %s", attempt, self.max_invalid, error)
            _append_feedback(messages, response.content, uses, invalid_feedback(error, attempt, self.max_invalid))
        log.warning(
            "claude: no valid proposal after %d attempts (last: %s); TPE chooses this trial", self.max_invalid, error
        )
        return None

    def _validate(self, raw: Any, ctx: ProposalContext) -> tuple[dict | None, str, str]:
        """(params, rationale, "") when the tool input is a usable proposal, else (None, "", why not)."""
        if not isinstance(raw, dict):
            return None, "", f"the tool input must be a JSON object, got {type(raw).__name__}"
        params = dict(raw)
        rationale = params.pop("rationale", "")
        rationale = (rationale if isinstance(rationale, str) else str(rationale))[:_RATIONALE_CHARS]
        try:
            params = ctx.space.coerce(params)
        except (ValueError, TypeError, KeyError) as e:
            return None, "", f"not in the search space: {e}"
        reasons = ctx.space.check(params)
        if reasons:
            return None, "", "violates the search space: " + "; ".join(str(r) for r in reasons)
        why = ctx.check(params)
        if why:
            return None, "", f"would be skipped without running: {why}"
        return params, rationale, ""

    def _record(self, usage: dict, response: Any) -> None:
        u = getattr(response, "usage", None)
        tokens_in = int(getattr(u, "input_tokens", 0) or 0)
        tokens_out = int(getattr(u, "output_tokens", 0) or 0)
        cost = cost_usd(self.model, tokens_in, tokens_out)
        usage["calls"] += 1
        usage["input_tokens"] += tokens_in
        usage["output_tokens"] += tokens_out
        if cost is not None and usage["cost_usd"] is not None:
            usage["cost_usd"] += cost
        with self._lock:
            self.calls += 1
            self.total_input_tokens += tokens_in
            self.total_output_tokens += tokens_out
            if cost is not None and self.total_cost_usd is not None:
                self.total_cost_usd += cost

    def __repr__(self) -> str:
        return f"ClaudeProposer(model={self.model!r}, max_invalid={self.max_invalid})"


def _short(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _echo(content: list) -> list[dict]:
    """The assistant's answer as request blocks, so that the follow-up refers to what it said."""
    blocks: list[dict] = []
    for b in content:
        kind = getattr(b, "type", None)
        if kind == "text" and b.text:
            blocks.append({"type": "text", "text": b.text})
        elif kind == "tool_use":
            # The API only accepts an object here; a malformed input is reported in the tool_result instead.
            blocks.append(
                {"type": "tool_use", "id": b.id, "name": b.name, "input": b.input if isinstance(b.input, dict) else {}}
            )
    return blocks


def _append_feedback(messages: list[dict], content: list, uses: list, feedback: str) -> None:
    """Continue the conversation with the rejection: a tool_result (is_error) for each tool call, else plain text."""
    echo = _echo(content)
    if not echo:
        # Nothing to answer to (an empty reply): add the feedback to our last message instead of inventing a turn.
        messages[-1]["content"].append({"type": "text", "text": feedback})
        return
    messages.append({"role": "assistant", "content": echo})
    if uses:
        reply = [{"type": "tool_result", "tool_use_id": b.id, "is_error": True, "content": feedback} for b in uses]
    else:
        reply = [{"type": "text", "text": feedback}]
    messages.append({"role": "user", "content": reply})
