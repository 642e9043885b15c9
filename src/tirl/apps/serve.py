"""What `tirl serve MODEL` runs: the saved policy loaded, its HF engine built through the engine
registry (`tirl.rollout.engines`, as every run's engine is), and served over the
OpenAI-compatible API of `tirl.backends.server`."""

from __future__ import annotations

from tirl.httpauth import bind_refusal


def serve_model(
    model_path: str,
    host: str,
    port: int,
    max_batch: int = 64,
    seed: int = 0,
    api_key: str | None = None,
    insecure_no_auth: bool = False,
) -> None:
    """Run until SIGINT/SIGTERM. Refuses (ValueError) a non-loopback `host` without `api_key`
    unless `insecure_no_auth`, before the model loads."""
    refusal = bind_refusal(host, api_key, insecure_no_auth, "--api-key-env")
    if refusal:
        raise ValueError(refusal)
    from tirl.backends.server import serve
    from tirl.models.tiny import load_policy
    from tirl.rollout.engines import EngineSpec, make_engine

    model, tokenizer = load_policy(model_path)
    model.eval()
    spec = EngineSpec(model=model, eos_id=tokenizer.eos_token_id, max_batch=max_batch, seed=seed)
    engine = make_engine("hf", spec)
    serve(
        engine,
        tokenizer,
        model_path,
        host,
        port,
        api_key=api_key,
        insecure_no_auth=insecure_no_auth,
    )
