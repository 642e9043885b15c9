"""tirl's agent loop driven by verl's real `AgentLoopWorker.generate_sequences`, over a real
tiny model served by tirl's HFEngine (`conftest.HFServer`) and a real local sandbox.

What it shows (issue 16, "must show" 2): masks exact on tool spans and rollout log-probs equal
to a forward pass, a `\\boxed{}` printed by the interpreter does not score, one request id per
trajectory, the budget follows the policy version, a sandbox timeout reaches the model as text;
also that nothing is sampled past verl's response length, how the finish reason is inferred,
and that a bad row or a bad `tirl.*` setting is a one-line error ("must show" 6).
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import (
    EVAL_BUDGET,
    HFServer,
    dataset_batch,
    generate,
    response_logprobs_of,
    rows_of,
)

from tirl.config import ConfigError
from tirl.integrations.verl.agent_loop import AGENT_LOOP_NAME


def _row_views(out, tokenizer):
    """Per row: (sequence ids without padding, response ids, response mask, rollout
    log-probs, decoded text of the interpreter spans)."""
    views = []
    responses = out.batch["responses"]
    width = responses.shape[1]
    for r in range(len(out)):
        attn = out.batch["attention_mask"][r].bool()
        seq = out.batch["input_ids"][r][attn].tolist()
        n = int(attn[-width:].sum())
        ids = responses[r, :n].tolist()
        mask = out.batch["response_mask"][r, :n].tolist()
        logprobs = out.batch["rollout_log_probs"][r, :n].tolist()
        tool = tokenizer.decode([i for i, m in zip(ids, mask) if m == 0])
        views.append((seq, ids, mask, logprobs, tool))
    return views


def _continues(seq: list[int], call: dict) -> bool:
    """`seq` is this call's prompt and output (then perhaps the tail of a tool output)."""
    sent = call["prompt_ids"] + call["ids"]
    return seq[: len(sent)] == sent


@pytest.fixture(scope="module")
def sampled(agent_worker_factory, policy, chat_tokenizer, scripted):
    """One training-style batch: every scripted task twice, sampled at temperature 1."""
    server = HFServer(policy, chat_tokenizer, version=0)
    worker, config, tmp = agent_worker_factory(server)
    batch = dataset_batch(rows_of(scripted.all()), config, worker.tokenizer, tmp, n=2)
    return generate(worker, batch), server, worker


@pytest.fixture(scope="module")
def greedy(agent_worker_factory, policy, chat_tokenizer, scripted):
    """The scripted tasks once each, greedy (verl's validation sampling), at version 0."""
    server = HFServer(policy, chat_tokenizer, version=0)
    worker, config, tmp = agent_worker_factory(server)
    tasks = [scripted.answer, scripted.printed_box, scripted.timeout, scripted.held_out]
    batch = dataset_batch(rows_of(tasks), config, worker.tokenizer, tmp)
    return generate(worker, batch, validate=True), tasks


def test_the_loop_is_registered_from_verls_agent_loop_config_file(sampled):
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    entry = _agent_loop_registry[AGENT_LOOP_NAME]
    assert entry["_target_"] == "tirl.integrations.verl.agent_loop.TirlAgentLoop"
    assert entry.get("name") == AGENT_LOOP_NAME  # the YAML's entry, not the decorator's


def _check_against_server(views, server) -> None:
    """Each row is exactly what the server sampled for one request id: every sampled id at
    its place with mask 1 and its log-prob, every id between two requests (tool output) with
    mask 0 and log-prob 0, the prompt as first sent."""
    by_request = {}
    for call in server.calls:
        by_request.setdefault(call["request_id"], []).append(call)
    for seq, ids, mask, logprobs, _ in views:
        # the request whose last call this row continues (the longest such: two samples of
        # one prompt may share a prefix)
        calls = max(
            (c for c in by_request.values() if _continues(seq, c[-1])),
            key=lambda c: len(c[-1]["prompt_ids"]) + len(c[-1]["ids"]),
        )
        prompt_len = len(seq) - len(ids)
        assert seq[:prompt_len] == calls[0]["prompt_ids"]
        expected_mask = [0] * len(seq)
        expected_lp = [0.0] * len(seq)
        for call in calls:
            start = len(call["prompt_ids"])
            assert seq[start : start + len(call["ids"])] == call["ids"]
            expected_mask[start : start + len(call["ids"])] = [1] * len(call["ids"])
            expected_lp[start : start + len(call["ids"])] = call["logprobs"]
        assert mask == expected_mask[prompt_len:]
        assert logprobs == pytest.approx(expected_lp[prompt_len:], abs=1e-6)


def test_masks_are_exact_on_tool_spans_and_ids_are_the_sampled_ids(sampled, chat_tokenizer):
    out, server, _ = sampled
    assert len(out) == 10
    views = _row_views(out, chat_tokenizer)
    _check_against_server(views, server)
    # the check had something to check: rows with tool spans between model spans
    between = [v for v in views if any(a == 0 and b == 1 for a, b in zip(v[2], v[2][1:]))]
    assert len(between) >= 3


def test_rollout_logprobs_equal_a_forward_pass_of_the_model(sampled, policy):
    out, _, _ = sampled
    forward = response_logprobs_of(policy, out)
    mask = out.batch["response_mask"].bool()
    rollout = out.batch["rollout_log_probs"]
    gap = (forward - rollout).abs()[mask]
    assert mask.sum() > 100 and gap.max().item() < 1e-4
    tool = (out.batch["attention_mask"][:, -mask.shape[1] :].bool()) & ~mask
    assert tool.any() and (rollout[tool] == 0).all()  # interpreter tokens: log-prob 0


def test_one_request_id_per_trajectory(sampled):
    out, server, _ = sampled
    ids = [c["request_id"] for c in server.calls]
    assert len(set(ids)) == len(out)  # one id per trajectory, none shared
    for request_id in set(ids):
        calls = [c for c in server.calls if c["request_id"] == request_id]
        for before, after in zip(calls, calls[1:]):  # one growing sequence per id
            grown = before["prompt_ids"] + before["ids"]
            assert after["prompt_ids"][: len(grown)] == grown
    assert max(ids.count(i) for i in set(ids)) >= 3  # multi-turn: several requests per id


def test_a_box_printed_by_the_interpreter_does_not_score(greedy, chat_tokenizer):
    out, tasks = greedy
    views = _row_views(out, chat_tokenizer)
    answer_row, box_row = 0, 1
    info = out.non_tensor_batch
    # the interpreter printed the right answer in a box...
    assert f"\\boxed{{{tasks[box_row].answer}}}" in views[box_row][4]
    scores = out.batch["rm_scores"].sum(-1).tolist()
    # ...and it does not count: reward -1 (CIR's binary), acc 0
    assert scores[box_row] == -1.0 and info["acc"][box_row] == 0.0
    # while the model's own box does (the scorer is not just always wrong)
    assert scores[answer_row] == 1.0 and info["acc"][answer_row] == 1.0
    assert f"\\boxed{{{tasks[answer_row].answer}}}" in chat_tokenizer.decode(
        [i for i, m in zip(views[answer_row][1], views[answer_row][2]) if m == 1]
    )


def test_a_sandbox_timeout_reaches_the_model_as_text(greedy, chat_tokenizer):
    out, _ = greedy
    _, ids, mask, _, tool = _row_views(out, chat_tokenizer)[2]
    assert "TimeoutError" in tool  # the interpreter's answer, as text, in the tool span
    last_tool = max(i for i, m in enumerate(mask) if m == 0)
    assert mask[last_tool + 1 :] and all(mask[last_tool + 1 :])  # and the model went on
    assert out.non_tensor_batch["tool_errors"][2] == 1.0
    assert out.non_tensor_batch["finish_reason"][2] == "stop"


def test_validation_rows_use_the_eval_budget(greedy):
    out, tasks = greedy
    budgets = out.non_tensor_batch["tool_budget"].tolist()
    assert [t.split for t in tasks] == ["train", "train", "train", "test"]
    assert budgets == [2.0, 2.0, 2.0, float(EVAL_BUDGET)]  # version 0: the schedule's 2


@pytest.mark.parametrize("version,budget", [(0, 2), (4, 3), (7, 4)])
def test_the_tool_budget_follows_the_policy_version(
    version, budget, agent_worker_factory, policy, chat_tokenizer, scripted
):
    server = HFServer(policy, chat_tokenizer, version=version)
    worker, config, tmp = agent_worker_factory(server)
    batch = dataset_batch(rows_of([scripted.many_blocks]), config, worker.tokenizer, tmp)
    out = generate(worker, batch, validate=True)
    info = out.non_tensor_batch
    assert info["tool_calls"][0] == budget  # blocks run: exactly the budget of this version
    assert info["tool_skipped"][0] >= 1  # the model wrote more, refused with the notice
    assert info["tool_budget"][0] == budget and info["policy_version"][0] == version
    assert info["min_global_steps"][0] == info["max_global_steps"][0] == version


def test_a_trajectory_never_samples_past_verls_response_length(
    agent_worker_factory, policy, chat_tokenizer, scripted
):
    limit = 50  # far below what the five-block task writes
    server = HFServer(policy, chat_tokenizer, version=7)
    worker, config, tmp = agent_worker_factory(server, **{"data.max_response_length": limit})
    batch = dataset_batch(rows_of([scripted.many_blocks]), config, worker.tokenizer, tmp)
    out = generate(worker, batch, validate=True)
    assert out.batch["responses"].shape[1] == limit
    assert int(out.batch["attention_mask"][0, -limit:].sum()) == limit  # full, and cut there
    assert out.non_tensor_batch["finish_reason"][0] == "length"
    assert out.non_tensor_batch["truncated"][0] == 1.0
    prompt_len = len(server.calls[0]["prompt_ids"])
    for call in server.calls:  # no request asked for a token verl would have to drop
        assert len(call["prompt_ids"]) - prompt_len + call["params"]["max_tokens"] <= limit
    _check_against_server(_row_views(out, chat_tokenizer), server)


def test_stages_expand_when_a_versions_truncation_rate_exceeds_the_threshold(
    agent_worker_factory, policy, chat_tokenizer, scripted
):
    """AgentMath §3.3 under verl: stage 0 truncates the five-block task (1 of 1 > 10%), so the
    next version's trajectories run under stage 1; a refill under version 0 stays at stage 0
    (its first request asks for stage 1's limit, and the reply is cut to stage 0's)."""
    stages = (
        "rl.stages=[{max_model_tokens: 24, tool_budget: 1},"
        " {max_model_tokens: 160, tool_budget: 4}]"
    )
    server = HFServer(policy, chat_tokenizer, version=0)
    overrides = [stages, "rl.expansion_threshold=0.1", "name=verl-stages-test"]
    worker, config, tmp = agent_worker_factory(server, **{"tirl.overrides": overrides})
    rows = rows_of([scripted.many_blocks])

    def step(version: int):
        server.version = version
        first = len(server.calls)
        out = generate(worker, dataset_batch(rows, config, worker.tokenizer, tmp))
        return out.non_tensor_batch, server.calls[first:]

    info, _ = step(0)
    assert info["max_model_tokens"][0] == 24 and info["tool_budget"][0] == 1
    assert info["truncated"][0] == 1.0 and info["model_tokens"][0] == 24

    info, calls = step(0)  # dynamic sampling's refill, same step
    assert calls[0]["params"]["max_tokens"] == 160  # asked under the guess...
    assert info["max_model_tokens"][0] == 24 and info["model_tokens"][0] == 24  # ...cut to 24

    info, calls = step(1)  # the next step
    assert info["max_model_tokens"][0] == 160 and info["tool_budget"][0] == 4
    assert info["tool_calls"][0] == 4 and info["model_tokens"][0] > 24


def _without_task(row):
    row["extra_info"]["tirl_task"] = None
    return "no extra_info.tirl_task"


def _other_system_prompt(row):
    row["extra_info"]["prompt_system"] = "Be brief."
    return "was exported with"


@pytest.mark.parametrize("spoil", [_without_task, _other_system_prompt])
def test_a_bad_row_is_a_one_line_error(
    spoil, agent_worker_factory, policy, chat_tokenizer, scripted
):
    server = HFServer(policy, chat_tokenizer)
    worker, config, tmp = agent_worker_factory(server)
    (row,) = rows_of([scripted.answer])
    message = spoil(row)
    batch = dataset_batch([row], config, worker.tokenizer, tmp)
    with pytest.raises(ConfigError) as err:
        generate(worker, batch)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not server.calls  # nothing was sampled for it


@pytest.mark.parametrize(
    "section,message",
    [
        ({}, "no tirl.config"),
        ({"sandbx": {}}, "unknown key tirl.sandbx"),
        ({"sandbox": {"kind": "docker"}}, "tirl.sandbox.kind"),
        ({"sandbox": {"kind": "http"}}, "urls"),
        ({"overrides": ["variants=[code,text]"]}, "exactly one of code / text"),
        ({"start_stage": 1}, "tirl.start_stage must be a stage index of rl.stages (0 to 0)"),
        ({"start_stage": "1"}, "tirl.start_stage"),
    ],
)
def test_bad_loop_settings_are_one_line_errors(run_config_path, section, message):
    from omegaconf import OmegaConf

    from tirl.integrations.verl.agent_loop import loop_setup

    if set(section) & {"sandbox", "overrides", "sandbx", "start_stage"}:
        section = {"config": str(run_config_path), **section}
    with pytest.raises(ConfigError) as err:
        loop_setup(OmegaConf.create({"tirl": section}))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_reward_extra_info_is_numeric_and_complete(sampled):
    out, _, _ = sampled
    keys = out.meta_info["reward_extra_keys"]
    assert {"acc", "tool_calls", "tool_skipped", "truncated", "tool_budget"} <= set(keys)
    for key in keys:  # verl averages these per data source: numbers only, every row
        values = out.non_tensor_batch[key].tolist()
        assert len(values) == len(out) and all(isinstance(v, float) for v in values)
    json.dumps(out.non_tensor_batch["finish_reason"].tolist())
    assert torch.equal(out.batch["rm_scores"].sum(-1).abs(), torch.ones(len(out)))


def test_the_finish_reason_is_inferred_from_what_came_back(chat_tokenizer):
    """verl's vLLM server says "completed" for end-of-sequence, a stop string and max_tokens
    alike; the engine tells them apart from the ids."""
    from tirl.integrations.verl.engine import VerlServerEngine

    eos = chat_tokenizer.eos_token_id
    engine = VerlServerEngine(None, chat_tokenizer, eos_ids=[eos])
    ids = chat_tokenizer("print(1)\n```", add_special_tokens=False)["input_ids"]
    stops = ("```",)
    assert engine.finish_of(ids + [eos], stops, "completed") == ("stop", None)
    assert engine.finish_of(ids, stops, "completed") == ("stop", "```")  # ends in last token
    assert engine.finish_of(ids + ids[:1], stops, "completed") == ("length", None)  # earlier
    assert engine.finish_of(ids, (), "completed") == ("length", None)  # no stop was asked
    assert engine.finish_of(ids, stops, "length") == ("length", None)  # SGLang says so
    assert engine.finish_of([], stops, "completed") == ("length", None)
