"""One policy update on a scored batch: the loss over model tokens, split into micro-batches
and, under `torch.distributed`, into per-rank shards, with the same result as one pass.

Why the weights: every aggregation mode is a sum over tokens (or sequences) divided by a
count. A micro-batch's loss, aggregated on its own, is rescaled by (its count / the count of
the whole minibatch), so the accumulated gradient is the minibatch's gradient exactly, not a
mean of per-micro-batch means (which would weigh a short micro-batch's tokens more). Across
ranks the count is the global one, and the loss is multiplied by the world size because FSDP
averages gradients over ranks.

A tool token has loss mask 0: it is in no count and changes no loss (architecture.md invariant 2).

Why rows without a learning signal are skipped (`rl.skip_zero_advantage`): under a policy loss
that is 0 wherever the advantage is 0 (PPO-clip: -A r and -A clip(r) are both 0), with no
entropy bonus and no KL term, a row whose advantage is 0 on every model token adds exactly 0 to
the loss and to the gradient. GRPO gives every row of a group that scored alike that advantage,
and such groups are common (all wrong early, all right late; on SmolLM2 whole batches), yet
each costs a forward and a backward pass. Those rows stay in the count the loss is divided by,
so the gradient is the same; they are left out of the passes.

The advantage estimator and the policy loss are the ones the config names (`rl.advantage`,
`rl.policy_loss`), looked up in the registries of `tirl.algos` and called with their
hyper-parameters from the config (`RLConfig.advantage_kwargs`, `policy_loss_kwargs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tirl.algos.advantages import token_advantages
from tirl.algos.losses import agg_loss, get_policy_loss, kl_penalty
from tirl.run.config import RLConfig
from tirl.train.batch import TokenBatch, token_logprobs


@dataclass(frozen=True)
class Shard:
    """Which rows of a minibatch this process works on: rows[rank::world]."""

    rank: int = 0
    world: int = 1

    def rows(self, rows: torch.Tensor) -> torch.Tensor:
        return rows[self.rank :: self.world]


def agg_count(mask: torch.Tensor, mode: str) -> int:
    """The denominator `agg_loss` divides by: model tokens for token-mean, else sequences with
    at least one model token."""
    if mode == "token-mean":
        return int(mask.sum().item())
    return int((mask.sum(-1) > 0).sum().item())


def skips_zero_advantage_rows(
    cfg: RLConfig, policy_loss: Callable, ref_logprobs: torch.Tensor | None
) -> bool:
    """Whether rows whose advantage is 0 everywhere may be left out of the update's passes:
    `rl.skip_zero_advantage` is on, `policy_loss` says it is 0 at advantage 0 (the
    `zero_at_zero_advantage` attribute a registered loss may carry), no entropy bonus and no
    KL term (both are nonzero on any row)."""
    return (
        cfg.skip_zero_advantage
        and getattr(policy_loss, "zero_at_zero_advantage", False)
        and cfg.entropy_coef == 0
        and (ref_logprobs is None or cfg.kl_coef == 0)
    )


def rows_with_signal(
    rows: torch.Tensor, token_adv: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The rows of `rows` with a nonzero advantage on at least one model token (`mask` > 0);
    `token_adv` and `mask` are [B, T-1]."""
    signal = ((token_adv != 0) & (mask > 0)).any(-1)  # [B]
    return rows[signal[rows]]


def token_budget_runs(ordered: torch.Tensor, lengths: torch.Tensor, budget: int) -> list:
    """`ordered` rows (longest first) cut into runs whose padded size, rows x the run's first
    (longest) row's length, stays within `budget` tokens; a row longer than the budget runs
    alone. verl's dynamic batch size (`use_dynamic_bsz`) bounds a micro-batch the same way."""
    runs, start = [], 0
    while start < len(ordered):
        take = max(1, budget // max(1, int(lengths[ordered[start]])))
        runs.append(ordered[start : start + take])
        start += take
    return runs


def shard_micro_batches(
    rows: torch.Tensor, lengths: torch.Tensor, size: int, shard: Shard, tokens: int = 0
) -> list[torch.Tensor]:
    """This shard's rows of a minibatch in micro-batches, longest rows first: of at most
    `size` rows each (0: one), or, with `tokens` > 0, of at most `tokens` padded tokens each.
    `lengths` [B] are every row's real tokens.

    The rows are sorted by length, so that each micro-batch, cut to its own longest row
    (`TokenBatch.trimmed`), computes little padding; the minibatch's gradient is the same
    whichever rows go together (`minibatch_loss_backward` weighs each micro-batch by its
    share). The split is planned over the whole minibatch and each micro-batch then sharded,
    so every rank gets the same number of micro-batches, some possibly empty: FSDP's
    collectives need each rank to run the same number of forward and backward passes.
    """
    ordered = rows[lengths[rows].argsort(descending=True, stable=True)]
    if tokens > 0:
        runs = token_budget_runs(ordered, lengths, tokens * shard.world)
    else:
        per_rank = -(-len(rows) // shard.world)  # the largest shard
        count = max(1, -(-per_rank // size)) if size > 0 else 1
        runs = list(torch.tensor_split(ordered, count))
    return [shard.rows(run) for run in runs]


def batch_advantages(
    cfg: RLConfig, rewards: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per-token advantages `[B, T]` of a scored batch from the configured estimator:
    `rewards [B]`, `group_ids [B]` (same id = same prompt), `mask [B, T]` (the loss mask)."""
    return token_advantages(
        cfg.advantage, rewards, group_ids, mask, gamma=cfg.gamma, **cfg.advantage_kwargs()
    )


@torch.no_grad()
def batch_logprobs(
    model: torch.nn.Module, batch: TokenBatch, micro: int, tokens: int = 0
) -> torch.Tensor:
    """[B, T-1] log-probabilities of every target token (0 past the longest row of its pass:
    only a row's real positions mean anything, as in one padded pass), in length-sorted
    micro-batches of `micro` rows or `tokens` padded tokens (`shard_micro_batches`)."""
    rows = torch.arange(batch.input_ids.shape[0], device=batch.input_ids.device)
    out = torch.zeros(batch.loss_mask.shape, device=batch.input_ids.device)
    for part in shard_micro_batches(rows, batch.lengths(), micro, Shard(), tokens):
        logprobs = token_logprobs(model, batch.select(part).trimmed())[0]
        out[part, : logprobs.shape[1]] = logprobs
    return out


# Set on a root module sharded under a bfloat16 policy (by `mark_computes_in_bf16`, read by
# `computes_in_bf16`): FSDP2 has no public getter for a module's policy.
_BF16_POLICY_MARK = "_tirl_fsdp_bf16_params"


def mark_computes_in_bf16(model: torch.nn.Module, bf16: bool) -> None:
    """Record on `model` whether its FSDP policy computes in bfloat16 (`shard_model` calls it)."""
    setattr(model, _BF16_POLICY_MARK, bf16)


def computes_in_bf16(model: torch.nn.Module) -> bool:
    """Whether `tirl.train.distributed.shard_model` gave `model` a policy that computes in
    bfloat16 (`mark_computes_in_bf16`).

    Then the update runs the forward without `torch.autocast`: autocast over bfloat16
    parameters changes little for Hugging Face decoders (matmuls are bfloat16 either way; their
    RMSNorm and rotary embeddings upcast to float32 by themselves), and leaving it out keeps the
    update's forward the same computation as the no-autocast pass that scores the old
    log-probabilities (`batch_logprobs`), so that the PPO ratio of an unchanged policy is 1 up
    to kernel differences between batch shapes, not bfloat16-vs-autocast noise. (verl runs both
    of its passes, log-probs and update, through one `FSDPEngineWithLMHead.forward_step` under
    one autocast, so its two passes match too.)
    """
    return bool(getattr(model, _BF16_POLICY_MARK, False))


def update_autocast(cfg: RLConfig, model: torch.nn.Module, device: torch.device):
    """bfloat16 autocast for `rl.bf16` on a GPU, unless FSDP's mixed-precision policy already
    runs the model in bfloat16 (`computes_in_bf16` says why). The passes that score old and
    reference log-probs run under it too, so that the PPO ratio of an unchanged policy is 1,
    not bfloat16-vs-float32 noise."""
    if cfg.bf16 and device.type == "cuda" and not computes_in_bf16(model):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def minibatch_loss_backward(
    model: torch.nn.Module,
    batch: TokenBatch,
    rows: torch.Tensor,
    old_logprobs: torch.Tensor,
    token_adv: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    cfg: RLConfig,
    shard: Shard = Shard(),
    norm_len: int | None = None,
) -> dict[str, float]:
    """Backward of the minibatch `rows`' loss (this shard's part of it); returns its metrics.

    The minibatch loss is the configured policy loss (`rl.policy_loss`, PPO-clip by default)
    over model tokens, minus `entropy_coef` x entropy, plus
    `kl_coef` x KL to the reference: each aggregated with `cfg.loss_agg` over the whole
    minibatch, whichever micro-batch or rank a token is in. `norm_len` is the constant
    divisor of "seq-mean-token-sum-norm" (Dr.GRPO): the model-token limit. Rows without an
    advantage are left out of the passes where that is exact (`skips_zero_advantage_rows`);
    the metrics are then means over the rows trained on, `actor/trained_row_share` of them.
    """
    policy_loss = get_policy_loss(cfg.policy_loss)
    loss_params = cfg.policy_loss_kwargs()
    total = agg_count(batch.loss_mask[rows], cfg.loss_agg)  # skipped rows count (module doc)
    trained = rows
    if skips_zero_advantage_rows(cfg, policy_loss, ref_logprobs):
        trained = rows_with_signal(rows, token_adv, batch.loss_mask)
    trained_share = len(trained) / max(1, len(rows))
    # With no row left, one still runs: its gradient is 0, and the optimizer steps on that 0
    # as it would have (Adam's momentum moves the weights all the same).
    trained = trained if len(trained) else rows[:1]
    device = batch.input_ids.device
    sums: dict[str, float] = {}
    lengths = batch.lengths()
    plan = shard_micro_batches(
        trained, lengths, cfg.micro_batch_size, shard, cfg.micro_batch_tokens
    )
    for micro in plan:
        # An empty micro-batch still runs (on one row, weighted 0) to keep ranks in step.
        weight = agg_count(batch.loss_mask[micro], cfg.loss_agg) / max(1, total)
        micro = micro if len(micro) else rows[:1]
        mb = batch.select(micro).trimmed()
        cols = slice(0, mb.loss_mask.shape[1])  # the [B, T-1] columns of the trimmed rows
        with update_autocast(cfg, model, device):
            logprobs, entropy = token_logprobs(model, mb, with_entropy=True)
        loss, metrics = policy_loss(
            logprobs.float(),
            old_logprobs[micro, cols],
            token_adv[micro, cols],
            mb.loss_mask,
            agg=cfg.loss_agg,
            norm_len=norm_len,
            **loss_params,
        )
        entropy_term = agg_loss(entropy.float(), mb.loss_mask, cfg.loss_agg, norm_len=norm_len)
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * entropy_term
        metrics["actor/entropy"] = float(entropy_term.detach())
        if ref_logprobs is not None:
            kl = agg_loss(
                kl_penalty(logprobs.float(), ref_logprobs[micro, cols], cfg.kl_estimator),
                mb.loss_mask,
                cfg.loss_agg,
                norm_len=norm_len,
            )
            loss = loss + cfg.kl_coef * kl
            metrics["actor/kl_ref"] = float(kl.detach())
        (loss * weight * shard.world).backward()
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value * weight
    # Means over the rows trained on: the weights of their passes add up to this share.
    covered = agg_count(batch.loss_mask[trained], cfg.loss_agg) / max(1, total)
    return {key: value / max(covered, 1e-12) for key, value in sums.items()} | {
        "actor/trained_row_share": trained_share / shard.world
    }  # this shard's share of each metric; summed over ranks by the caller
