"""RL run alone or as one rank of a gloo group with FSDP2 (test_trainer.py).

    python tests/dist_update_worker.py update IN_DIR OUT_FILE [micro_batch_size [bf16-too]]
    python tests/dist_update_worker.py rl OUT_FILE

`update`: one `RLTrainer.update` on a fixed batch: `IN_DIR/model.pt` (a state dict),
`IN_DIR/trajs.jsonl` and `IN_DIR/config.json`. With `bf16-too` (ranks only), the same ranks
then make the same update again from the same weights under FSDP's bfloat16 policy
(`tirl.train.distributed.fsdp_policy`), and record the dtypes they see (`probe`).
`rl`: two whole RL steps (rollouts with the sandbox on each rank, gathered, then the update
and the weight sync into each rank's sampling copy) of a tiny model on arithmetic tasks.
Rank 0 writes the full parameters after training, and the metrics, to OUT_FILE.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path

import torch
from rl_trainer import rl_trainer
from transformers import Qwen2Config, Qwen2ForCausalLM

from tirl.protocol.segments import Trajectory
from tirl.run.config import RLConfig
from tirl.tasks.sources.arithmetic import ArithmeticSource
from tirl.train.distributed import (
    DistContext,
    fsdp_policy,
    init_from_env,
    leave_process_group,
    shard_model,
)
from tirl.train.update import computes_in_bf16

ARITHMETIC = ArithmeticSource()  # the arithmetic items as tirl.tasks.Task


def small_model(vocab_size: int = 64) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def full_params(model, ctx: DistContext | None) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2 parameters and gradients), else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def update(ctx: DistContext | None, in_dir: Path, micro: int, bf16: bool = False):
    """One `RLTrainer.update`; returns the full parameters after it, its metrics, and `probe`:
    the first optimizer step's full gradients and what the dtypes were (weights in forward,
    sharded parameters, gradients, optimizer state)."""
    torch.manual_seed(0)  # the minibatch order
    model = small_model()
    model.load_state_dict(torch.load(in_dir / "model.pt"))
    cfg = RLConfig(
        **json.loads((in_dir / "config.json").read_text()), micro_batch_size=micro, bf16=bf16
    )
    if ctx is not None:
        shard_model(model, fsdp_policy(cfg))
    probe: dict = {"forward_weight": set(), "grads": None, "bf16_policy": computes_in_bf16(model)}

    def see_weight(block, args) -> None:  # inside the block's FSDP unit, after its all-gather
        probe["forward_weight"].add(block.up_proj.weight.dtype)

    model.model.layers[0].mlp.register_forward_pre_hook(see_weight)
    lines = (in_dir / "trajs.jsonl").read_text().splitlines()
    trajs = [Trajectory.from_dict(json.loads(line)) for line in lines]
    trainer = rl_trainer(model, cfg, pad_id=0, dist=ctx)

    def see_grads(optimizer, args, kwargs) -> None:  # the clipped gradients the step uses
        if probe["grads"] is None:
            named = [(k, p.grad) for k, p in model.named_parameters()]
            probe["grad_dtypes"] = {_local(g).dtype for _, g in named}
            probe["grads"] = {k: _full(g).detach().clone() for k, g in named}

    trainer.optimizer.register_step_pre_hook(see_grads)
    metrics = trainer.update(trajs, cfg.max_model_tokens)
    probe["param_dtypes"] = {_local(p).dtype for p in model.parameters()}
    probe["sharded"] = all(hasattr(p, "to_local") for p in model.parameters())
    states = trainer.optimizer.state.values()
    probe["optimizer_dtypes"] = {_local(v).dtype for s in states for v in s.values()}
    return full_params(model, ctx), metrics, probe


def rl(ctx: DistContext | None) -> tuple[dict, list[dict]]:
    from tirl.backends.hf import HFEngine
    from tirl.envs.arithmetic import ArithmeticEnv
    from tirl.models.tiny import train_tokenizer
    from tirl.rollout.runner import Rollout
    from tirl.sandbox import Sandbox
    from tirl.synth.arithmetic import demonstration_texts

    env = ArithmeticEnv()
    texts = [
        "".join(t for _, t in demonstration_texts(x, x.answer)) for x in env.items("train", 50)
    ]
    tokenizer = train_tokenizer(texts, vocab_size=200)
    torch.manual_seed(0)
    model = small_model(len(tokenizer))
    sampler = copy.deepcopy(model).eval()  # each rank samples with a full copy
    if ctx is not None:
        shard_model(model)
    cfg = RLConfig(
        steps=2, prompts_per_step=4, group_size=2, max_model_tokens=12, lr=1e-3, warmup_steps=1
    )

    async def main() -> list[dict]:
        async with Sandbox() as sandbox:
            engine = HFEngine(sampler, tokenizer.eos_token_id, seed=0)
            trainer = rl_trainer(
                model,
                cfg,
                Rollout(engine, tokenizer, sandbox),
                lambda i: ARITHMETIC.item("train", i),
                pad_id=tokenizer.pad_token_id,
                dist=ctx,
                reward_fn=lambda t: float(sum(t.ids) % 2),
            )
            metrics = [await trainer.step() for _ in range(cfg.steps)]
            engine.close()
            return metrics

    torch.manual_seed(0)
    metrics = asyncio.run(main())
    params = full_params(model, ctx)
    for key, value in sampler.state_dict().items():  # the weight sync reached the sampler
        assert torch.equal(value, params[key]), key
    return params, metrics


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    ctx = init_from_env("cpu")
    result: dict = {}
    if argv[0] == "update":
        out_file, micro = Path(argv[2]), int(argv[3]) if len(argv) > 3 else 0
        params, metrics, result["probe"] = update(ctx, Path(argv[1]), micro)
        if argv[4:] == ["bf16-too"]:
            assert ctx is not None, "bf16-too needs FSDP ranks"
            bf16_params, bf16_metrics, bf16_probe = update(ctx, Path(argv[1]), micro, bf16=True)
            result["bf16"] = {"params": bf16_params, "metrics": bf16_metrics, "probe": bf16_probe}
    else:
        out_file = Path(argv[1])
        params, metrics = rl(ctx)
    if ctx is None or ctx.is_main:
        torch.save({"params": params, "metrics": metrics, **result}, out_file)
    if ctx is not None:
        leave_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
