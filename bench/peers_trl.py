"""TRL's GRPOTrainer (or SFTTrainer), one step at a time, for `bench/peers.py` (run in TRL's
own venv).

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

The SmolLM2 mode of `bench/peers.py` (`bench/peers_smollm2.py`) adds to the spec: `chat` and
`system` (conversational prompts, rendered by the model's chat template, checked to be tirl's
ids), `lora` (peft adapters, TRL's `peft_config`), `tools` (TRL's own tool calling,
`tools=[python]`; a trainer that refuses to build is reported as one `failed` record) and `bf16`
(TRL's `bf16=True`). With `"mode": "sft"` it runs `SFTTrainer` instead (`sft_main`): the rows
are tirl's demonstrations as token ids with tirl's loss mask as `assistant_masks`, in the order
given, batch after batch, one optimizer step per `go`. Every step record carries the process's
peak resident memory (`peak_rss_gb`).
"""

from __future__ import annotations

import ctypes
import json
import resource
import subprocess
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


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def trim_heap() -> None:
    """Hand the heap memory freed since the step back to the OS (glibc's malloc_trim), so that
    a contender waiting for its next block holds what it keeps, not its peak: the SmolLM2 mode
    keeps two of them in memory at once. Called between steps, outside their clocks."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0] or type(exc).__name__


def python(code: str) -> str:
    """Run Python code and return what it prints.

    Args:
        code: The Python program to run.
    """
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=5
        )
    except subprocess.TimeoutExpired:
        return "timed out"
    return (done.stdout + done.stderr)[:128]


def versions(spec: dict) -> dict:
    names = ("trl", "transformers", "torch", "accelerate") + (("peft",) if spec.get("lora") else ())
    return {name: __import__(name).__version__ for name in names}


def lora_config(spec: dict):
    """TRL's `peft_config` for tirl's `model.lora` (None without LoRA)."""
    lora = spec.get("lora")
    if not lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
        target_modules="all-linear" if lora["targets"] == ["all-linear"] else lora["targets"],
        bias="none", task_type="CAUSAL_LM",
    )  # fmt: skip


def step_clock(counters: dict, every: int, built: dict, trim: bool):
    """A TrainerCallback that, every `every` optimizer steps, reports the step just done
    (seconds, `counters`, peak RSS) and waits for the parent's `go` before the next one starts
    (`counters` zeroed). `built["at"]`: when the trainer was built, set once it is."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.started = 0.0
            self.done = 0

        def resume(self) -> bool:
            if not wait_for_go():
                return False
            counters.update(dict.fromkeys(counters, 0))
            self.started = time.perf_counter()
            return True

        def on_train_begin(self, args, state, control, **kwargs):
            emit({"event": "ready", "build_s": time.perf_counter() - built["at"]})
            if not self.resume():
                control.should_training_stop = True

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % every:
                return
            step_s = time.perf_counter() - self.started
            emit({
                "event": "step", "step": self.done, "step_s": step_s, **counters,
                "peak_rss_gb": peak_rss_gb(),
            })  # fmt: skip
            if trim:
                trim_heap()
            self.done += 1
            if state.global_step < args.max_steps and not self.resume():
                control.should_training_stop = True

    return StepClock()


def main(spec: dict) -> None:
    if spec.get("mode") == "sft":
        return sft_main(spec)
    if spec.get("mode") == "tool_rows":
        return tool_rows_main(spec)
    return grpo_main(spec)


def tool_tokenizer(spec: dict):
    """The policy's tokenizer with TRL's own copy of a chat template that its tool calling
    knows (`spec["chat_template"]`, e.g. `qwen2_5`: ChatML, the same tokens as SmolLM2's),
    so that `GRPOTrainer(tools=...)` can render tool schemas and parse `<tool_call>` blocks."""
    from transformers import AutoTokenizer
    from trl import chat_template_utils

    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tokenizer.chat_template = getattr(chat_template_utils, f"{spec['chat_template']}_chat_template")
    return tokenizer


def tool_rows_main(spec: dict) -> None:
    """SFT rows in TRL's tool-calling format, rendered by TRL's template: for each example
    (`problem`, `code`, `output`, `answer`) the conversation system, user, an assistant tool
    call `python(code=...)`, the tool's output, the assistant's answer; token ids and a loss
    mask that is 1 on the assistant's own tokens (through its `<|im_end|>`) and 0 on the
    prompt and on the tool's reply, as TRL's tool loop masks it. One `rows` record."""
    tokenizer = tool_tokenizer(spec)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    system = [{"role": "system", "content": spec["system"]}]

    def ids(messages: list[dict], generation_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(
            messages, tools=[python], add_generation_prompt=generation_prompt, tokenize=False
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    rows = []
    for ex in spec["examples"]:
        call = {
            "type": "function",
            "function": {"name": "python", "arguments": {"code": ex["code"]}},
        }
        conv = [
            *system, {"role": "user", "content": ex["problem"]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "python", "content": ex["output"]},
            {"role": "assistant", "content": ex["answer"]},
        ]  # fmt: skip
        # prefix renders: prompt | tool call | tool reply + generation prompt | answer
        cuts = [ids(conv[:2], True), ids(conv[:3], False), ids(conv[:4], True), ids(conv, False)]
        for shorter, longer in zip(cuts, cuts[1:]):
            if longer[: len(shorter)] != shorter:
                raise SystemExit("peers_trl: the template does not preserve prefixes")
        full, mask = cuts[-1], [0] * len(cuts[-1])
        for start, stop in ((len(cuts[0]), len(cuts[1])), (len(cuts[2]), len(cuts[3]))):
            stop = start + full[start:stop].index(end) + 1  # the model stops at <|im_end|>
            mask[start:stop] = [1] * (stop - start)
        rows.append({"ids": full, "mask": mask, "prompt_len": len(cuts[0])})
    emit({"event": "rows", "rows": rows})


def grpo_main(spec: dict) -> None:
    import torch

    torch.set_num_threads(spec["threads"])
    from transformers.utils import logging as hf_logging

    try:  # both come with `pip install trl`
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        emit({"event": "missing", "error": str(exc)})
        return

    from tirl.protocol.segments import Segment, SegmentKind, Trajectory
    from tirl.rewards.reward import configured_reward
    from tirl.run.config import RLConfig
    from tirl.tasks import Mixture
    from tirl.tasks.scoring import score_trajectory

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    mixture = Mixture.from_entries(spec["train_sources"], "data.train", spec["seed"])
    first = spec["first_task"]
    n_tasks = spec["prompts_per_step"] * spec["total_steps"]
    tasks = [mixture.item("train", first + i) for i in range(n_tasks)]
    if spec.get("chat"):  # conversational prompts: TRL renders them with the chat template
        system = [{"role": "system", "content": spec["system"]}] if spec.get("system") else []
        prompts = [[*system, {"role": "user", "content": t.problem}] for t in tasks]
    else:
        prompts = [spec["template"].format(problem=t.problem) for t in tasks]
    dataset = Dataset.from_dict({"prompt": prompts, "task_index": list(range(n_tasks))})
    reward_config = RLConfig(**spec["reward_config"])
    reward_of = configured_reward(reward_config.reward, reward_config.reward_kwargs())

    def tirl_reward(prompts, completions, completion_ids, task_index, **_) -> list[float]:
        """tirl's reward of each completion, scored by its own task as tirl scores it."""
        rewards = []
        for text, ids, i in zip(completions, completion_ids, task_index):
            if not isinstance(text, str):  # a conversation: the assistant's own messages
                counters["tool_calls"] += sum(m["role"] == "tool" for m in text)
                text = "".join(m.get("content") or "" for m in text if m["role"] == "assistant")
            traj = Trajectory([Segment(SegmentKind.MODEL, list(ids), text)])
            counters["correct"] += score_trajectory(traj, tasks[i]).correct
            rewards.append(float(reward_of(traj)))
        return rewards

    updates = spec["updates_per_step"]
    batch = spec["prompts_per_step"] * spec["group_size"]
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="tirl-peers-trl-"),
        use_cpu=True,
        bf16=bool(spec.get("bf16", False)),
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
        max_tool_calling_iterations=spec.get("tool_budget"),
    )

    counters = {
        "generate_s": 0.0, "generate_and_score_s": 0.0, "sampled_tokens": 0, "tool_calls": 0,
        "correct": 0, "real_tokens": 0, "computed_tokens": 0,
    }  # fmt: skip

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with clocks around sampling and around sampling + scoring."""

        def _generate_single_turn(self, *args, **kwargs):
            start = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
            counters["generate_s"] += time.perf_counter() - start
            counters["sampled_tokens"] += sum(len(ids) for ids in completion_ids)
            return completion_ids, logprobs

        def compute_loss(self, model, inputs, *rest, **kwargs):
            """Count the update's token positions: real (prompt and completion masks) and
            computed (the padded batch), as tirl's side counts its passes."""
            masks = inputs["prompt_mask"].sum() + inputs["completion_mask"].sum()
            counters["real_tokens"] += int(masks)
            counters["computed_tokens"] += (
                inputs["prompt_ids"].numel() + inputs["completion_ids"].numel()
            )
            return super().compute_loss(model, inputs, *rest, **kwargs)

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            counters["generate_and_score_s"] += time.perf_counter() - start
            return out

    start, built = time.perf_counter(), {}
    try:
        trainer = TimedGRPOTrainer(
            model=spec["model"],
            reward_funcs=tirl_reward,
            args=args,
            train_dataset=dataset,
            callbacks=[step_clock(counters, updates, built, trim=False)],
            peft_config=lora_config(spec),
            **({"tools": [python]} if spec.get("tools") else {}),
            **({"processing_class": tool_tokenizer(spec)} if spec.get("chat_template") else {}),
        )
    except Exception as exc:
        if not spec.get("tools"):
            raise
        emit({"event": "failed", "error": f"{type(exc).__name__}: {first_line(exc)}",
              "versions": versions(spec)})  # fmt: skip
        return
    built_at = built["at"] = time.perf_counter()
    tools = {"tools": [python]} if spec.get("tools") else {}
    if spec.get("chat"):
        out = trainer.processing_class.apply_chat_template(
            dataset[0]["prompt"], add_generation_prompt=True, tokenize=True, **tools
        )
        first_prompt = out["input_ids"] if hasattr(out, "keys") else out
    else:
        first_prompt = trainer.processing_class(text=[dataset[0]["prompt"]])["input_ids"][0]
    # with tools, TRL's prompt is its own (the template lists the tools): only its length
    if not tools and list(first_prompt) != spec["first_prompt_ids"]:
        raise SystemExit(
            "peers_trl: TRL tokenizes the prompt differently from tirl's renderer"
            f" ({list(first_prompt)[:8]}... vs {spec['first_prompt_ids'][:8]}...)"
        )
    a = trainer.args
    emit({
        "event": "built", "load_s": built_at - start, "threads": torch.get_num_threads(),
        "versions": versions(spec), "prompt_tokens": len(first_prompt),
        "dtype": str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
        "bf16": a.bf16, "peft": type(trainer.model).__name__,
        "args": {key: getattr(a, key) for key in (
            "generation_batch_size", "num_generations", "per_device_train_batch_size",
            "steps_per_generation", "gradient_accumulation_steps", "num_iterations",
            "max_completion_length", "temperature", "top_p", "top_k", "beta", "epsilon",
            "epsilon_high", "loss_type", "use_vllm", "gradient_checkpointing", "optim",
            "max_tool_calling_iterations",
        )},
    })  # fmt: skip
    trainer.train()
    emit({"event": "end"})


def sft_main(spec: dict) -> None:
    """TRL's SFTTrainer on tirl's rows (`spec["rows"]`: input ids and tirl's loss mask, in
    the order they are to be trained, `batch_size` a step): one optimizer step per `go`, each
    reported with its seconds, its trained (label) tokens and its padded cells."""
    import torch

    torch.set_num_threads(spec["threads"])
    from transformers.utils import logging as hf_logging

    try:
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer
    except ImportError as exc:
        emit({"event": "missing", "error": str(exc)})
        return
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    rows = spec["rows"]
    dataset = Dataset.from_dict({
        "input_ids": [r["input_ids"] for r in rows],
        "assistant_masks": [r["loss_mask"] for r in rows],  # tirl's: the model's tokens only
    })  # fmt: skip
    batch = spec["batch_size"]
    steps = len(rows) // batch
    bf16 = spec.get("bf16")  # None (float32), "autocast" (bf16=True) or "weights"
    args = SFTConfig(
        output_dir=tempfile.mkdtemp(prefix="tirl-peers-trl-sft-"),
        use_cpu=True,
        bf16=bf16 == "autocast",
        fp16=False,
        model_init_kwargs={"dtype": "bfloat16" if bf16 == "weights" else "float32"},
        gradient_checkpointing=False,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        weight_decay=spec["weight_decay"],
        max_grad_norm=1.0,
        max_length=spec["max_length"],
        packing=False,
        padding_free=False,
        shuffle_dataset=False,
        train_sampling_strategy="sequential",  # the rows in tirl's order, batch after batch
        max_steps=steps,
        report_to="none",
        save_strategy="no",
        logging_steps=10**6,
        dataloader_num_workers=0,
        seed=spec["seed"],
    )
    counters = {"trained_tokens": 0, "cells": 0}

    class TimedSFTTrainer(SFTTrainer):
        """SFTTrainer counting the label tokens and padded cells of each step's batch."""

        def compute_loss(self, model, inputs, *rest, **kwargs):
            counters["trained_tokens"] += int((inputs["labels"][:, 1:] != -100).sum())
            counters["cells"] += inputs["input_ids"].numel()
            return super().compute_loss(model, inputs, *rest, **kwargs)

    start, built = time.perf_counter(), {}
    trainer = TimedSFTTrainer(
        model=spec["model"], args=args, train_dataset=dataset,
        callbacks=[step_clock(counters, 1, built, trim=True)], peft_config=lora_config(spec),
    )  # fmt: skip
    built_at = built["at"] = time.perf_counter()
    first = trainer.train_dataset[0]
    if list(first["input_ids"]) != rows[0]["input_ids"]:
        raise SystemExit("peers_trl: SFTTrainer changed the token ids of the first row")
    a = trainer.args
    emit({
        "event": "built", "load_s": built_at - start, "threads": torch.get_num_threads(),
        "versions": versions(spec),
        "dtype": str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
        "peft": type(trainer.model).__name__,
        "trainable": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "args": {key: getattr(a, key) for key in (
            "bf16", "per_device_train_batch_size", "gradient_accumulation_steps", "max_length",
            "learning_rate", "lr_scheduler_type", "max_grad_norm", "weight_decay", "optim",
            "gradient_checkpointing", "packing", "padding_free", "train_sampling_strategy",
        )},
    })  # fmt: skip
    trainer.train()
    emit({"event": "end"})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: peers_trl.py SPEC_JSON (bench/peers.py writes it)")
    main(json.loads(sys.argv[1]))
