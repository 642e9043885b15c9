"""Shared parts of the agent-loop tests: a real tiny chat model that writes known code, served
through verl's server-client call by tirl's HFEngine, and verl's own AgentLoopWorker.

Nothing here is a mock of tirl or verl code: the model is a real (tiny) transformer, SFT'd on a
handful of demonstrations until it writes one fixed program per prompt; `HFServer` serves it
with vLLM's request semantics (`max_tokens`, stop strings kept in the output, verl's folded
`stop_reason="completed"`, the policy version in `extra_fields`); the rows go through verl's
own `RLHFDataset` and `collate_fn` from a parquet file written by `tirl verl data`'s writer;
and `AgentLoopWorker.generate_sequences` is verl's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from tirl.backends.hf import HFEngine
from tirl.integrations.verl.data import PromptSettings, rl_schema, task_rows, write_parquet
from tirl.models.tiny import TinyModelSpec, build_model, save_policy, train_tokenizer
from tirl.protocol.fences import CIR_FENCES
from tirl.run.config import SFTConfig
from tirl.tasks import make_source
from tirl.tasks.base import Code, Think
from tirl.tasks.demos import demo_trajectory
from tirl.train.sft import train_sft

# One intra-op thread: on a machine whose cores are busy, two threads contending make the tiny
# model's steps ~10x slower, not faster.
torch.set_num_threads(1)

PROMPTS = PromptSettings(CIR_FENCES, chat=True, system="")  # no system turn: short prompts
SCHEDULE = [[0.0, 2], [0.34, 3], [0.67, 4]]  # CIR's 2 -> 3 -> 4
RL_STEPS = 10  # versions 0, 4, 7 -> budgets 2, 3, 4
EVAL_BUDGET = 4
RESPONSE_LENGTH = 320


@dataclass(frozen=True)
class Scripted:
    """The arithmetic tasks the tiny model is trained to answer in one fixed way each."""

    answer: object  # prints the expression, then writes \boxed{answer}: scores +1
    printed_box: object  # its code prints \boxed{answer}; the model writes no box: -1
    timeout: object  # `while True: pass`: the sandbox's timeout
    many_blocks: object  # five blocks in a row: more than any budget of the schedule
    held_out: object  # a test-split task (a validation row), answered like `answer`

    def parts(self, task) -> list:
        expr = task.meta["expression"]
        if task is self.printed_box:
            box = f"\\boxed{{{task.answer}}}"
            return [Code(f'print("\\\\boxed{{{task.answer}}}")', box), Think("done")]
        if task is self.timeout:
            return [Code("while True:\n    pass", "x"), Think("done")]
        if task is self.many_blocks:
            return [*(Code(f"print({k})", str(k)) for k in range(1, 6)), Think("done")]
        return [Code(f"print({expr})", task.answer), Think(f"So \\boxed{{{task.answer}}}.")]

    def all(self) -> list:
        return [self.answer, self.printed_box, self.timeout, self.many_blocks, self.held_out]


@pytest.fixture(scope="session")
def scripted() -> Scripted:
    source = make_source({"source": "arithmetic"})
    train = [source.item("train", i) for i in range(4)]
    return Scripted(*train, source.item("test", 0))


@pytest.fixture(scope="session")
def chat_tokenizer(scripted):
    texts = [t.problem for t in scripted.all()]
    texts += [CIR_FENCES.render_code(p.source) for t in scripted.all() for p in scripted.parts(t)
              if isinstance(p, Code)]  # fmt: skip
    texts += ["done So \\boxed{} TimeoutError Traceback while True: pass print 0123456789"] * 3
    return train_tokenizer(texts, vocab_size=384, chat_template=True)


@pytest.fixture(scope="session")
def policy(scripted, chat_tokenizer):
    """A real tiny model SFT'd until it writes each scripted task's program."""
    renderer = PROMPTS.renderer(chat_tokenizer)
    demos = [demo_trajectory(renderer, t.problem, scripted.parts(t)) for t in scripted.all()]
    model = build_model(
        chat_tokenizer, TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=512), 0
    )
    cfg = SFTConfig(steps=150, batch_size=8, lr=3e-3, warmup_steps=5)
    train_sft(model, demos, cfg, pad_id=chat_tokenizer.pad_token_id, seed=0)
    return model.eval()


@pytest.fixture(scope="session")
def model_dir(policy, chat_tokenizer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("verl") / "model"
    save_policy(policy, chat_tokenizer, path)
    return path


@pytest.fixture(scope="session")
def run_config_path(model_dir) -> Path:
    """The tirl run config the loop reads (`tirl.config` in verl's config)."""
    config = {
        "name": "verl-agent-loop-test",
        "variants": ["code"],
        "protocol": "cir_fences",
        "prompt": {"chat": True, "system": ""},
        "model": {"name_or_path": str(model_dir)},
        "sandbox": {"timeout_s": 1.0, "max_output_chars": 200},
        "rl": {
            "steps": RL_STEPS,
            "max_model_tokens": 160,
            "budget_schedule": SCHEDULE,
            "reward": "binary",
        },
        "eval": {"max_model_tokens": 100, "tool_budget": EVAL_BUDGET},
    }
    path = model_dir.parent / "run.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def verl_config(
    model_dir: Path, run_config_path: Path, tmp: Path, sandbox: dict | None = None, **more
):
    """verl 0.9.1's generated ppo_trainer config with what an agent-loop run sets (`more`:
    further dotted keys)."""
    import verl

    base = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    config = OmegaConf.load(base)
    agent_loops = tmp / "agent_loops.yaml"
    from tirl.integrations.verl.agent_loop import AGENT_LOOP_YAML

    agent_loops.write_text(AGENT_LOOP_YAML, encoding="utf-8")
    settings = {
        "actor_rollout_ref.model.path": str(model_dir),
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.agent.default_agent_loop": "tirl",
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(agent_loops),
        "data.max_prompt_length": 64,
        "data.max_response_length": RESPONSE_LENGTH,
        "data.filter_overlong_prompts": False,
        "data.cache_dir": str(tmp / "verl-cache"),
        "tirl": {"config": str(run_config_path), "overrides": []},
    }
    if sandbox:
        settings["tirl"]["sandbox"] = sandbox
    settings.update(more)
    for key, value in settings.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


class HFServer:
    """verl's server-client call, `generate(request_id, *, prompt_ids, sampling_params, **kw)
    -> TokenOutput`, served by tirl's HFEngine over a real model with vLLM's semantics: stop
    strings checked on the output text and kept in it, the end-of-sequence id kept, log-probs
    when asked, and verl's `stop_reason="completed"` for all three endings. `version` is the
    policy version the server reports (verl's `global_steps`). Every call is recorded."""

    def __init__(self, model, tokenizer, version: int | None = 0) -> None:
        self.engine = HFEngine(model, tokenizer.eos_token_id, max_batch=16, seed=0)
        self.tokenizer = tokenizer
        self.version = version
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        params = dict(sampling_params)
        stops = list(params.get("stop") or [])
        if stops and not params.get("include_stop_str_in_output"):
            raise AssertionError("stop strings must stay in the output (token-in, token-out)")
        if params.get("top_p", 1.0) != 1.0 or params.get("top_k", -1) not in (-1, 0):
            raise AssertionError(f"HFEngine samples the full distribution, got {params}")

        def stopped(ids: list[int]) -> bool:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            return any(s in text for s in stops)

        key = object()  # every request carries its whole history, as verl's do
        try:
            out = await self.engine.generate(
                key,
                list(prompt_ids),
                max_new_tokens=params["max_tokens"],
                temperature=params["temperature"],
                stop=stopped if stops else None,
                seed=params.get("seed"),
            )
        finally:
            self.engine.release(key)
        self.calls.append(
            {"request_id": request_id, "prompt_ids": list(prompt_ids), "ids": out.ids,
             "logprobs": out.logprobs, "params": params, "kwargs": kwargs}
        )  # fmt: skip
        steps = self.version
        return TokenOutput(
            token_ids=out.ids,
            log_probs=out.logprobs if params.get("logprobs") else None,
            stop_reason="completed",
            extra_fields={"global_steps": steps, "min_global_steps": steps,
                          "max_global_steps": steps},
        )  # fmt: skip


def dataset_batch(rows: list[dict], config, tokenizer, tmp: Path, n: int = 1):
    """`rows` as the trainer's generation batch: a parquet file read by verl's RLHFDataset,
    collated by its collate_fn, each row repeated `n` times (verl's rollout.n)."""
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    path = tmp / f"rows-{len(list(tmp.glob('rows-*.parquet')))}.parquet"
    write_parquet(rows, path, rl_schema())
    dataset = RLHFDataset([str(path)], tokenizer, config.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    return batch.repeat(n, interleave=True) if n > 1 else batch


def rows_of(tasks) -> list[dict]:
    return task_rows(tasks, PROMPTS)


def generate(worker, batch, validate: bool = False):
    """verl's AgentLoopWorker.generate_sequences on `batch`; then this event loop's sandboxes
    are closed (each asyncio.run is a new event loop)."""
    from tirl.integrations.verl.agent_loop import close_worker_sandboxes

    batch.meta_info["validate"] = validate

    async def main():
        try:
            return await worker.generate_sequences(batch)
        finally:
            await close_worker_sandboxes()

    return asyncio.run(main())


@pytest.fixture(scope="session")
def agent_worker_factory(model_dir, run_config_path, tmp_path_factory):
    """Makes verl's AgentLoopWorker over a given server (the llm_client). tirl's loop is
    registered from the agent_loop_config_path YAML, as a launch without the module imported
    would find it."""
    from verl.experimental.agent_loop import agent_loop as verl_loop

    def make(server, sandbox: dict | None = None, **more):
        tmp = tmp_path_factory.mktemp("worker")
        config = verl_config(model_dir, run_config_path, tmp, sandbox, **more)
        verl_loop._agent_loop_registry.pop("tirl", None)  # only the YAML can bring it back
        worker = verl_loop.AgentLoopWorker(config, llm_client=server)
        return worker, config, tmp

    return make


def response_logprobs_of(model, batch) -> torch.Tensor:
    """The model's own log-probs of every response token: one forward pass over verl's
    padded (input_ids, attention_mask, position_ids). [B, R]"""
    input_ids = batch.batch["input_ids"]
    with torch.no_grad():
        logits = model(
            input_ids=input_ids,
            attention_mask=batch.batch["attention_mask"],
            position_ids=batch.batch["position_ids"],
        ).logits.float()
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
    picked = logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, P+R-1]
    response_len = batch.batch["responses"].shape[1]
    return picked[:, -response_len:]


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray cluster for every test that needs one (starting one takes ~10 s), talking
    over loopback only (`tirl.sandbox.ray_pool.init_local_ray`)."""
    import ray

    from tirl.sandbox.ray_pool import init_local_ray

    started = not ray.is_initialized()
    if started:
        init_local_ray(num_cpus=1)
    assert ray.util.get_node_ip_address().startswith("127.")  # loopback only
    yield
    if started:
        ray.shutdown()
