"""tirl's agent loop under verl with its sandbox sessions on a `RaySandboxPool` (issue 16,
"must show" 3): verl's real `AgentLoopWorker.generate_sequences`, a local Ray cluster that
only talks over loopback (`tirl.sandbox.ray_pool.init_local_ray`), sandbox actors in their own
processes, and the same invariants as with the local sandbox."""

from __future__ import annotations

import asyncio
import os

from conftest import HFServer, dataset_batch, generate, rows_of


def test_the_loop_runs_its_code_on_a_ray_sandbox_pool(
    local_ray, agent_worker_factory, policy, chat_tokenizer, scripted
):
    from tirl.integrations.verl.agent_loop import close_worker_sandboxes, loop_setup, worker_sandbox
    from tirl.sandbox.ray_pool import RaySandboxPool

    server = HFServer(policy, chat_tokenizer, version=0)
    worker, config, tmp = agent_worker_factory(server, sandbox={"kind": "ray", "actors": 1})
    tasks = [scripted.answer, scripted.timeout]
    batch = dataset_batch(rows_of(tasks), config, worker.tokenizer, tmp)
    batch.meta_info["validate"] = True  # greedy: the scripted programs

    async def main():
        try:
            out = await worker.generate_sequences(batch)
            setup = loop_setup(config)
            pool = await worker_sandbox(setup.sandbox)  # the loop's own
            return out, pool, await pool.stats()
        finally:
            await close_worker_sandboxes()

    out, pool, stats = asyncio.run(main())
    assert isinstance(pool, RaySandboxPool)
    (actor,) = stats["actors"]
    assert actor["alive"] and actor["pid"] != os.getpid()  # cells ran in the actor's process
    assert stats["cells"].get("ok", 0) >= 1 and stats["cells"].get("timeout") == 1

    info = out.non_tensor_batch
    scores = out.batch["rm_scores"].sum(-1).tolist()
    assert scores[0] == 1.0 and info["acc"][0] == 1.0  # the model's own box scores
    width = out.batch["responses"].shape[1]
    n = int(out.batch["attention_mask"][1, -width:].sum())
    ids, mask = out.batch["responses"][1, :n].tolist(), out.batch["response_mask"][1, :n].tolist()
    tool_text = chat_tokenizer.decode([i for i, m in zip(ids, mask) if m == 0])
    assert "TimeoutError" in tool_text  # the actor's timeout, shown to the model as text
    assert mask[-1] == 1 and info["tool_errors"][1] >= 1.0


def test_the_stage_board_is_one_named_actor_for_every_worker(
    local_ray, agent_worker_factory, policy, chat_tokenizer, scripted
):
    """Inside Ray the loops' truncation counts go to the named actor `tirl-stages:<run name>`,
    which any worker of the job (here: the test itself) finds by name."""
    import ray

    stages = (
        "rl.stages=[{max_model_tokens: 24, tool_budget: 1}, {max_model_tokens: 64, tool_budget: 2}]"
    )
    overrides = [stages, "name=verl-stages-ray-test"]
    server = HFServer(policy, chat_tokenizer, version=3)
    worker, config, tmp = agent_worker_factory(server, **{"tirl.overrides": overrides})
    batch = dataset_batch(rows_of([scripted.many_blocks]), config, worker.tokenizer, tmp)
    generate(worker, batch)

    board = ray.get_actor("tirl-stages:verl-stages-ray-test")
    view = ray.get(board.view.remote())
    assert view.tallies == {3: (1, 1)}  # the five-block task was cut at 24 tokens
    assert view.stage(4) == 1 and view.stage(3) == 0
