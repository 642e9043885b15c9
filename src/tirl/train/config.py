"""Where the run config lived before the run layer: `tirl.run.config` (kept for code that
imports the old path)."""

from tirl.run.config import (  # noqa: F401
    POLICY_LOSS_FIELDS,
    CurriculumConfig,
    DataConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    PromptConfig,
    ProtocolConfig,
    RLConfig,
    RLStage,
    RolloutConfig,
    RunConfig,
    SFTConfig,
    SFTStage,
)
