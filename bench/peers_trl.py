"""TRL's GRPOTrainer, one RL step at a time, for `bench/peers.py` (run in TRL's own venv).

    ~/.cache/tirl/trl-venv/bin/python bench/peers_trl.py SPEC_JSON

`bench/peers.py` starts this script in the venv that holds TRL (`bench/peers.py
--make-trl-venv`: layered on the main environment, so it shares tirl, torch and transformers) and steers it over
stdin/stdout: after building the trainer it prints a `PEERS {...}` line, then waits for a
`go` line before each RL step and prints one `PEERS {...}` record after it. The parent
alternates these steps with tirl's own, so both see the same machine load.

What one RL step is here: one generation batch (`prompts_per_step` prompts x `group_size`
completions, one batched `model.generate`), its rewards and old log-probs, then
`updates_per_step` optimizer steps over slices of it (TRL's `steps_per_generation`;
`per_device_train_batch_size` = batch / updates, no gradient accumulation): exactly the
shape of tirl's step. The time of a step runs from the `go` to the end of its last optimizer
step, so the waits for the parent are never counted.

Rewards are tirl's: each completion is scored by its own arithmetic task and paid as tirl's
`rl.reward` pays (binary +1 / -1), so advantages see the same numbers. Not a place for
general TRL use: it exists to time TRL fairly.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time


def emit(record: dict) -> None:
    """One record for the parent, on a line of its own (TRL may print other lines)."""
    sys.stdout.write("PEERS " + json.dumps(record) + "\n")
    sys.stdout.flush()


def wait_for_go() -> bool:
    """Block until the parent says `go` (True) or `stop` / closes the pipe (False)."""
    line = sys.stdin.readline()
    return line.strip() == "go"


def main(spec: dict) -> None:
    import torch

    torch.set_num_threads(spec["threads"])
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging

    try:  # both come with `pip install trl`
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        emit({"event": "missing", "error": str(exc)})
        return

    from tirl.protocol.segments import Segment, SegmentKind, Trajectory
    from tirl.rewards.reward import configured_reward
    from tirl.tasks import Mixture
    from tirl.tasks.scoring import score_trajectory
    from tirl.train.config import RLConfig

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    mixture = Mixture.from_entries(spec["train_sources"], "data.train", spec["seed"])
    first = spec["first_task"]
    n_tasks = spec["prompts_per_step"] * spec["total_steps"]
    tasks = [mixture.item("train", first + i) for i in range(n_tasks)]
    dataset = Dataset.from_dict(
        {"prompt": [spec["template"].format(problem=t.problem) for t in tasks],
         "task_index": list(range(n_tasks))}
    )  # fmt: skip
    reward_config = RLConfig(**spec["reward_config"])
    reward_of = configured_reward(reward_config.reward, reward_config.reward_kwargs())

    def tirl_reward(prompts, completions, completion_ids, task_index, **_) -> list[float]:
        """tirl's reward of each completion, scored by its own task as tirl scores it."""
        rewards = []
        for text, ids, i in zip(completions, completion_ids, task_index):
            traj = Trajectory([Segment(SegmentKind.MODEL, list(ids), text)])
            score_trajectory(traj, tasks[i])
            rewards.append(float(reward_of(traj)))
        return rewards

    updates = spec["updates_per_step"]
    batch = spec["prompts_per_step"] * spec["group_size"]
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="tirl-peers-trl-"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        model_init_kwargs={"dtype": "float32"},
        gradient_checkpointing=False,
        per_device_train_batch_size=batch // updates,
        gradient_accumulation_steps=1,
        steps_per_generation=updates,
        num_iterations=1,
        num_generations=spec["group_size"],
        max_completion_length=spec["max_model_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        max_grad_norm=spec["max_grad_norm"],
        beta=0.0,  # no KL, no reference model (tirl's kl_coef 0)
        epsilon=spec["clip_low"],
        epsilon_high=spec["clip_high"],
        loss_type="dapo",  # token-mean over the minibatch, as tirl's loss_agg token-mean
        scale_rewards="group",
        mask_truncated_completions=False,
        shuffle_dataset=False,  # the same prompts, in the same order, as tirl's step
        max_steps=updates * spec["total_steps"],
        report_to="none",
        save_strategy="no",
        logging_steps=10,
        dataloader_num_workers=0,
        seed=spec["seed"],
        use_vllm=False,
    )

    class StepClock(TrainerCallback):
        """At each RL-step boundary (every `updates` optimizer steps): report the step just
        done, then wait for the parent's `go` before the next one starts."""

        def __init__(self) -> None:
            self.started = 0.0
            self.done = 0

        def resume(self) -> bool:
            if not wait_for_go():
                return False
            counters.update(generate_s=0.0, generate_and_score_s=0.0, sampled_tokens=0)
            self.started = time.perf_counter()
            return True

        def on_train_begin(self, args, state, control, **kwargs):
            emit({"event": "ready", "build_s": time.perf_counter() - built_at})
            if not self.resume():
                control.should_training_stop = True

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % updates:
                return
            step_s = time.perf_counter() - self.started
            emit({"event": "step", "step": self.done, "step_s": step_s, **counters})
            self.done += 1
            if state.global_step < args.max_steps and not self.resume():
                control.should_training_stop = True

    counters = {"generate_s": 0.0, "generate_and_score_s": 0.0, "sampled_tokens": 0}

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with clocks around sampling and around sampling + scoring."""

        def _generate_single_turn(self, *args, **kwargs):
            start = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
            counters["generate_s"] += time.perf_counter() - start
            counters["sampled_tokens"] += sum(len(ids) for ids in completion_ids)
            return completion_ids, logprobs

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            counters["generate_and_score_s"] += time.perf_counter() - start
            return out

    start = time.perf_counter()
    trainer = TimedGRPOTrainer(
        model=spec["model"],
        reward_funcs=tirl_reward,
        args=args,
        train_dataset=dataset,
        callbacks=[StepClock()],
    )
    built_at = time.perf_counter()
    first_prompt = trainer.processing_class(text=[dataset[0]["prompt"]])["input_ids"][0]
    if list(first_prompt) != spec["first_prompt_ids"]:
        raise SystemExit(
            "peers_trl: TRL tokenizes the prompt differently from tirl's renderer"
            f" ({list(first_prompt)[:8]}... vs {spec['first_prompt_ids'][:8]}...)"
        )
    a = trainer.args
    emit({
        "event": "built", "load_s": built_at - start, "threads": torch.get_num_threads(),
        "versions": {name: __import__(name).__version__
                     for name in ("trl", "transformers", "torch", "accelerate")},
        "dtype": str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
        "args": {key: getattr(a, key) for key in (
            "generation_batch_size", "num_generations", "per_device_train_batch_size",
            "steps_per_generation", "gradient_accumulation_steps", "num_iterations",
            "max_completion_length", "temperature", "top_p", "top_k", "beta", "epsilon",
            "epsilon_high", "loss_type", "use_vllm", "gradient_checkpointing", "optim",
        )},
    })  # fmt: skip
    trainer.train()
    emit({"event": "end"})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: peers_trl.py SPEC_JSON (bench/peers.py writes it)")
    main(json.loads(sys.argv[1]))
