"""LoRA (`model.lora`, `tirl.models.lora`): adapters trained by SFT and RL on a frozen base,
merged exactly wherever a plain model is needed (engines, saved folders), saved and resumed.
Real tiny models, the real pipeline and peft."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import TINY

from tirl.cli import main
from tirl.models.lora import add_lora, merged_state_dict, plain_copy
from tirl.models.tiny import TinyModelSpec, build_model, load_policy

LORA = ["model.lora.rank=4", "model.lora.alpha=8", "sft.lr=5e-3", "rl.lr=5e-3"]


def _adapted(tokenizer):
    model = build_model(tokenizer, TinyModelSpec(hidden_size=32, layers=2, heads=2), seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lora = add_lora(model, rank=4, alpha=8.0, dropout=0.0, targets=["all-linear"])
    with torch.no_grad():  # B starts at 0 (the adapted model is the base); make it count
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return lora.eval(), before


def test_the_merged_weights_compute_what_the_adapted_model_computes(tokenizer):
    lora, before = _adapted(tokenizer)
    merged = merged_state_dict(lora)
    assert set(merged) == set(before)  # the base class's own names, nothing of peft's
    changed = [k for k in merged if not torch.equal(merged[k], before[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed), changed
    plain = plain_copy(lora)
    assert type(plain).__name__ == "Qwen2ForCausalLM" and not hasattr(plain, "peft_config")
    ids = torch.tensor([tokenizer("Compute 12 * 7.")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, lora(ids).logits, atol=1e-5, rtol=1e-5)
    # merging left the adapted model's own base weights as they were
    base = lora.get_base_model().state_dict()
    assert torch.equal(base["model.layers.0.self_attn.q_proj.base_layer.weight"],
                       before["model.layers.0.self_attn.q_proj.weight"])  # fmt: skip


def test_sft_and_rl_train_the_adapters_only_and_a_resume_restores_them(tmp_path, capsys):
    argv = ["train", f"out_dir={tmp_path}", "name=lora", *TINY, *LORA]
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    capsys.readouterr()
    run = tmp_path / "lora" / "code"
    sft, rl = load_policy(run / "sft")[0].state_dict(), load_policy(run / "rl")[0].state_dict()
    # the saved folders are plain models; what LoRA does not target never moved
    assert torch.equal(sft["model.embed_tokens.weight"], rl["model.embed_tokens.weight"])
    assert torch.equal(sft["model.norm.weight"], rl["model.norm.weight"])
    records = [json.loads(ln) for ln in (tmp_path / "lora" / "metrics.jsonl").open()]
    rl_steps = [r for r in records if r["phase"] == "rl"]
    moved = not torch.equal(sft["model.layers.0.mlp.up_proj.weight"],
                            rl["model.layers.0.mlp.up_proj.weight"])  # fmt: skip
    # groups whose members all scored alike have no advantage: no update moves anything
    assert moved == any(r["train/uniform_group_share"] < 1 for r in rl_steps)
    adapter = load_file(str(run / "rl" / "adapter" / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)
    config = json.loads((run / "rl" / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8
    # RL's checkpoint holds the adapters and their optimizer state, not the frozen base
    state = torch.load(run / "rl_state" / "trainer.pt", weights_only=False)
    assert state["model"] and all("lora_" in k for k in state["model"])
    samples = tmp_path / "lora" / "samples" / "code_rl_heldout.jsonl"

    def sampled_ids() -> list:
        return [[seg["ids"] for seg in json.loads(ln)["segments"]] for ln in samples.open()]

    greedy = sampled_ids()

    # Resume with RL's end cut off: the SFT adapters load, RL continues from its checkpoint
    # and ends where it ended (greedy evaluation of the same weights gives the same answers).
    shutil.rmtree(run / "rl")
    progress = tmp_path / "lora" / "eval_progress.json"
    done = json.loads(progress.read_text())
    del done["code"]["rl"]
    progress.write_text(json.dumps(done))
    assert main([*argv, "--resume"]) == 0, capsys.readouterr().err[-3000:]
    assert sampled_ids() == greedy
    resumed = load_policy(run / "rl")[0].state_dict()
    for key, value in rl.items():
        torch.testing.assert_close(resumed[key], value, atol=1e-6, rtol=0)


def test_an_rl_update_moves_the_adapters_only_and_the_engine_takes_them_merged(tokenizer):
    """One update on a batch with mixed rewards: the adapters move, the base does not, and
    the push hands the engine (sampling a plain copy, as `tirl train` builds it) the merge."""
    from rl_trainer import rl_trainer
    from test_trainer import synthetic_batch

    from tirl.backends.hf import HFEngine
    from tirl.rollout.runner import Rollout
    from tirl.run.config import RLConfig

    lora, _ = _adapted(tokenizer)
    engine = HFEngine(plain_copy(lora), tokenizer.eos_token_id)
    trainer = rl_trainer(lora, RLConfig(lr=1e-2), Rollout(engine, tokenizer, None), pad_id=0)
    before = {k: v.clone() for k, v in lora.state_dict().items()}
    trainer.update(synthetic_batch(groups=3, group_size=3), max_tokens=20)
    after = lora.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all("lora_" in k for k in moved), moved
    assert len(trainer.optimizer.param_groups[0]["params"]) == len(
        [k for k in before if "lora_" in k]
    )
    import asyncio

    asyncio.run(trainer.push_weights())
    sampled, merged = engine.model.state_dict(), merged_state_dict(lora)
    assert all(torch.equal(sampled[k], merged[k]) for k in merged)
    engine.close()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.lora.targets=[no_such_proj]"], "model.lora.targets ['no_such_proj']:"),
        (["model.lora.targets=[all-linear, q_proj]"], "'all-linear' stands alone"),
        (["model.lora.rank=-1"], "model.lora.rank"),
    ],
)
def test_bad_lora_settings_are_one_line(overrides, message, tmp_path, capsys):
    argv = ["train", f"out_dir={tmp_path}", "name=bad", *TINY, "model.lora.rank=4", *overrides]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("tirl: error:")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "bad").exists()  # refused before the run folder is made


def test_lora_on_an_engine_that_keeps_its_own_weights_is_refused(tmp_path, capsys):
    argv = ["train", f"out_dir={tmp_path}", "name=srv", "model.name_or_path=gpt2",
            "rollout.engine=openai", "rollout.urls=[http://127.0.0.1:9]", "sft.steps=0",
            "rl.steps=0", "model.lora.rank=8"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "model.lora.rank: rollout.engine openai samples a server's own weights" in err
    assert not (tmp_path / "srv").exists()


def test_lora_without_peft_names_the_extra(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a)
    )
    assert main(["train", f"out_dir={tmp_path}", *TINY, "model.lora.rank=4"]) == 2
    assert "pip install 'tirl[lora]'" in capsys.readouterr().err
