"""Reward rising through the gateway: RL on an unmodified agent program, in one script.

The program is `examples/gateway/agent.py` (the `openai` SDK, its base URL the only thing set
from outside). The policy is a tiny chat model made from scratch (nothing downloaded), the
task a toy with a dense reward so that a few CPU minutes show learning: the share of digits in
the model's replies. Each step runs the program once per task and group member against a
gateway session (`tirl.apps.gateway.run_agents`), scores the sessions' trajectories, and makes
one GRPO update with tirl's learner (`tirl.train.learner.Learner`: the same collate,
advantages and loss as `tirl train`) on the live model the gateway samples with.

    python examples/gateway/train_digits.py [steps]

Prints one line per step: the mean reward, model tokens, refused sessions. Not `tirl train`
itself: that wiring (a task source's tasks, the run folder, checkpoints) is the trainer's.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import torch

from tirl.apps.gateway import Gateway, run_agents
from tirl.envs.arithmetic import ArithmeticEnv
from tirl.models.tiny import TinyModelSpec, build_model, train_tokenizer
from tirl.rollout.engines import EngineSpec, make_engine
from tirl.run.phases import RLConfig
from tirl.synth.arithmetic import demonstration_texts
from tirl.train.learner import Learner
from tirl.train.optim import PolicyOptimizer

AGENT = [sys.executable, str(Path(__file__).with_name("agent.py"))]
TASKS = [f"What is {a} + {b}?" for a, b in [(3, 4), (12, 30), (7, 8), (25, 17)]]
GROUP = 4


def digit_share(traj, task) -> float:
    """The task's reward: the share of the model's characters that are digits."""
    text = traj.model_text
    return sum(c.isdigit() for c in text) / max(1, len(text))


def tiny_chat_policy():
    texts = [
        "".join(t for _, t in demonstration_texts(item, item.answer))
        for item in ArithmeticEnv().items("train", 200, start=10**6)
    ]
    texts += ["system user assistant Solve the problem. Python ```python boxed"] * 20
    tokenizer = train_tokenizer(texts, vocab_size=384, chat_template=True)
    spec = TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=512)
    return build_model(tokenizer, spec, seed=0).eval(), tokenizer


async def main(steps: int) -> list[float]:
    torch.manual_seed(0)
    model, tokenizer = tiny_chat_policy()
    engine = make_engine("hf", EngineSpec(model=model, eos_id=tokenizer.eos_token_id))
    cfg = RLConfig(lr=1e-2, warmup_steps=1, updates_per_step=1, group_size=GROUP)
    learner = Learner(
        model, cfg, PolicyOptimizer(model, cfg), None,
        pad_id=tokenizer.pad_token_id, old_from_sampler=True,
    )  # fmt: skip
    gateway = Gateway(engine, tokenizer, "tiny", temperature=1.0)
    means = []
    try:
        async with gateway.serving():
            for step in range(steps):
                trajs = await run_agents(
                    gateway, AGENT, TASKS, group_size=GROUP, score=digit_share,
                    env={"AGENT_TURNS": "2", "AGENT_MAX_TOKENS": "12"},
                )  # fmt: skip
                ok = [t for t in trajs if t.finish_reason != "error"]
                rewards = torch.tensor([t.meta["reward"] for t in ok])
                means.append(float(rewards.mean()))
                learner.update(ok, rewards, torch.randperm(len(ok)), 24, step)
                tokens = sum(t.num_model_tokens for t in ok)
                print(
                    f"step {step}: reward {means[-1]:.3f}, {tokens} model tokens,"
                    f" {len(trajs) - len(ok)} refused or failed",
                    flush=True,
                )
    finally:
        engine.close()
    return means


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 25))
