"""SmolLM2 with tools: tirl's interpreter against TRL's own tool calling, on one policy.

    python bench/peers.py --model smollm2-135m-instruct --part tools --threads 2

The `tools` part of `bench/peers.py`'s SmolLM2 mode (issue 47, goal 1: "with tools on
SmolLM2, where TRL's own tool calling works"). TRL's `GRPOTrainer(tools=...)` refuses
SmolLM2's own chat template (it has no tool role), and SmolLM2 as loaded rarely calls a tool
in either format. So:

- TRL gets a chat template its tool calling knows: TRL's own copy of Qwen2.5's
  (`trl.chat_template_utils.qwen2_5_chat_template`), which uses the same ChatML tokens as
  SmolLM2's (`<|im_start|>`, `<|im_end|>`); TRL renders the tool's schema into the system
  message and parses `<tool_call>{json}</tool_call>` blocks from the completions.
- The policy both contenders start from is SmolLM2 after one short LoRA SFT on the same tasks
  in both formats: tirl's demonstrations (a ```python block, its ```output, `\\boxed{}`) and
  the same code, output and answer as a TRL tool call (`python(code=...)`, the tool's reply,
  the answer), rendered by TRL's template in TRL's venv (`peers_trl.py`, mode `tool_rows`).
  Made once and kept in `~/.cache/tirl/peers-smollm2-tools-<hash>` (about 10 min on 2 cores).

Then one RL group, each block a process of its own as in the `rl` part: `tirl with tools`
(`RLTrainer` as `tirl train` builds it for the `real_model` preset, with the sandbox) and
`tirl with tools (every row)` (the same without `rl.skip_zero_advantage`: every row through
the update, the same work as TRL's update whatever the groups scored) against
`TRL GRPOTrainer with tools` (`tools=[python]`, a function that runs the code in a fresh
Python process, as TRL's documentation writes tools), with the same LoRA, tasks, rewards
(tirl's scorer on the assistant's own text), 4 prompts x 8 samples, 2 updates, at most 2
tool calls (tirl's tool budget, TRL's `max_tool_calling_iterations`) and `MAX_TOKENS`
completion tokens. What differs is each framework's own: TRL's prompt carries the tool's
JSON schema (the table gives both prompt lengths), its completion limit counts the tool's
reply too, and it samples a whole new turn after each tool reply.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import subprocess
import tempfile
from pathlib import Path

import peers
import peers_smollm2

TRL_TEMPLATE = "qwen2_5"  # a template TRL's tool calling knows, in ChatML like SmolLM2's
TRL_SYSTEM = (
    "Solve the problem. You can run Python: call the python tool; its output comes back."
    " Give the final answer as \\boxed{}."
)
# The short SFT into both formats: the real_model preset's (30 steps of 8 rows at lr 1e-3
# took the code variant from 0.00 to 0.46 greedy), with every demonstration calling the
# interpreter and twice the steps, for twice the rows.
POLICY_SFT = ["sft.steps=60", "sft.examples=240", "sft.code_share=1.0", "sft.warmup_steps=3"]
MAX_TOKENS = 128  # a tool call, its reply and the answer fit in either format
TOOL_BUDGET = 2  # the preset's first budget (rl.budget_schedule)
TOOLS_GROUP = "RL with tools"
TIRL, TRL = "tirl with tools", "TRL GRPOTrainer with tools"
# tirl's default leaves rows without an advantage (groups that scored alike) out of the
# update; this one trains every row, the same work as TRL's update
TIRL_EVERY_ROW, EVERY_ROW = f"{TIRL} (every row)", ["rl.skip_zero_advantage=false"]


# ---------------------------------------------------------------------- the policy
def policy_folder() -> Path:
    key = json.dumps([POLICY_SFT, TRL_TEMPLATE, TRL_SYSTEM, peers.TRL_VERSION]).encode()
    name = f"peers-smollm2-tools-{hashlib.sha256(key).hexdigest()[:10]}"
    return peers.TRL_VENV.parent / name


def examples_of(demos) -> list[dict]:
    """Problem, code, output and answer of each one-call demonstration (prompt, code block,
    its output, the answer), for TRL's format; others are left out."""
    from tirl.protocol.segments import SegmentKind as K

    out = []
    for d in demos:
        kinds = [s.kind for s in d.segments]
        if kinds != [K.PROMPT, K.MODEL, K.TOOL, K.MODEL]:
            continue
        code = re.fullmatch(r"```python\n(.*)\n```", d.segments[1].text.strip(), re.S)
        output = re.fullmatch(r"```output\n(.*)\n```", d.segments[2].text.strip(), re.S)
        if code and output:
            out.append({
                "problem": d.meta["question"], "code": code[1], "output": output[1],
                "answer": d.segments[3].text,
            })  # fmt: skip
    return out


def trl_rows(policy: str, examples: list[dict]) -> list:
    """The examples as TRL's tool calls, rendered by TRL's template in TRL's venv: one
    Trajectory each (prompt, tool call, tool reply, answer), its loss mask TRL's."""
    from tirl.protocol.segments import Segment, SegmentKind, Trajectory

    spec = {"mode": "tool_rows", "model": policy, "chat_template": TRL_TEMPLATE,
            "system": TRL_SYSTEM, "examples": examples}  # fmt: skip
    python = peers.TRL_VENV / "bin" / "python"
    if not python.is_file():  # the policy learns TRL's format too: TRL renders it
        raise SystemExit(f"peers: {peers.TRL_HINT}")
    done = subprocess.run(
        [str(python), str(peers.TRL_SCRIPT), json.dumps(spec)], capture_output=True, text=True
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("PEERS ")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"peers: TRL's tool rows failed: {tail}")
    trajs = []
    for row in json.loads(lines[-1][len("PEERS ") :])["rows"]:
        ids, mask, p = row["ids"], row["mask"], row["prompt_len"]
        end = max(i for i, m in enumerate(mask) if m) + 1  # the template's "\n" after it
        segments = [Segment(SegmentKind.PROMPT, ids[:p])]
        for i in range(p, end):  # runs of the mask: the model's tokens, the tool's reply
            kind = SegmentKind.MODEL if mask[i] else SegmentKind.TOOL
            if segments[-1].kind is not kind:
                segments.append(Segment(kind, []))
            segments[-1].ids.append(ids[i])
        trajs.append(Trajectory(segments))
    return trajs


def tools_policy(threads: int) -> Path:
    """SmolLM2 after the short SFT on both formats (made once, then read from the cache)."""
    folder = policy_folder()
    if (folder / "config.json").is_file():
        return folder
    print(f"making the policy once (LoRA SFT on both tool formats, ~10 min) into {folder}",
          flush=True)  # fmt: skip
    from tirl.models.saved import save_policy
    from tirl.models.sources import model_folder
    from tirl.sandbox import Sandbox
    from tirl.train.pipeline import Pipeline
    from tirl.train.sft import train_sft

    cfg = peers_smollm2.run_config([*POLICY_SFT, f"threads={threads}"])
    with tempfile.TemporaryDirectory(prefix="tirl-peers-tools-") as tmp:
        pipeline = Pipeline(cfg, Path(tmp), evaluation=None)
        pipeline.prepare()

        async def demonstrations():
            async with Sandbox(cfg.sandbox.limits(), preload=tuple(cfg.sandbox.preload)) as sb:
                return await pipeline.demonstrations(True, sb)

        demos = asyncio.run(demonstrations())
        examples = examples_of(demos)
        theirs = trl_rows(model_folder(peers_smollm2.MODEL), examples)
        print(f"SFT rows: {len(demos)} in tirl's format, {len(theirs)} in TRL's", flush=True)
        model = pipeline.make_model()
        loss = train_sft(
            model, [*demos, *theirs], cfg.sft, pad_id=pipeline.tokenizer.pad_token_id,
            seed=cfg.seed,
        )  # fmt: skip
        print(f"SFT done: last loss {loss:.3f}", flush=True)
        save_policy(model, pipeline.tokenizer, folder)
        pipeline.logger.close()
    return folder


# ---------------------------------------------------------------------- the contenders
def rl_overrides(policy: Path) -> list[str]:
    return [
        f"model.name_or_path={policy}", f"rl.max_model_tokens={MAX_TOKENS}",
        f"rl.budget_schedule=[[0.0, {TOOL_BUDGET}]]",
    ]  # fmt: skip


def tools_makers(args, policy: Path, tmp: Path) -> dict:
    """tirl with tools (as it runs, and with every row trained) and TRL with tools: name -> a
    function that starts the contender for block k, its tasks the k-th block's."""
    from tirl.train.pipeline import Pipeline

    overrides = [*peers_smollm2.base_overrides(args.threads), *rl_overrides(policy)]
    cfg = peers_smollm2.run_config(overrides)
    per_block = cfg.rl.prompts_per_step * args.block
    pipeline = Pipeline(cfg, tmp / "prompts-tools", evaluation=None)
    pipeline.prepare()
    pipeline.logger.close()

    def first_task(k: int) -> int:
        return cfg.sft.examples + k * per_block

    def tirl(extra: list[str]):
        def make(k: int) -> peers.SideProcess:
            spec = {"part": peers_smollm2.RL, "tools": True,
                    "overrides": [*overrides, *extra, f"sft.examples={first_task(k)}"]}  # fmt: skip
            return peers_smollm2.tirl_worker(spec, tmp / f"rl-tirl-tools-{len(extra)}-{k}.log")

        return make

    def trl(k: int) -> peers.SideProcess | None:
        ids = pipeline.prompt_ids(pipeline.mixture.item("train", first_task(k)))
        spec = peers.trl_spec(cfg, policy, ids, args.block)
        spec.update(first_task=first_task(k), chat=True, system=TRL_SYSTEM, tools=True,
                    chat_template=TRL_TEMPLATE, tool_budget=TOOL_BUDGET,
                    lora=dict(vars(cfg.model.lora)))  # fmt: skip
        log = peers.TRL_VENV.parent / "peers-trl-tools.log"
        return peers_smollm2.start_trl(lambda: peers_smollm2.trl_worker(spec, log))

    makers = {TIRL: tirl([]), TIRL_EVERY_ROW: tirl(EVERY_ROW)}
    return makers if args.no_trl else {**makers, TRL: trl}


def tools_group(args) -> dict:
    """The RL group; each process starts once 20 GB are free (TRL's peaked at 18.7 GB)."""
    return {"name": TOOLS_GROUP, "part": peers_smollm2.RL, "warmup": 0,
            "blocks": args.rl_blocks, "memory_gb": 20, "baseline": TRL}  # fmt: skip
