"""The run layer, below the pipelines (train, eval, synth) and what joins them (apps, studies,
integrations): a run's config (`tirl.run.config.RunConfig`) and the builders that turn it into
the parts every command samples with (`tirl.run.build`: sandbox, engine, rollout settings,
evaluation sets)."""
