"""Runs that join the pipelines, for the `tirl` commands: what `tirl eval` does with a saved
model or a server (`tirl.apps.evaluate`), what `tirl serve` does with a saved model
(`tirl.apps.serve`), and tirl.eval's evaluation handed to the training pipeline
(`tirl.apps.evaluation`).

This layer may import `train`, `eval`, `synth` and everything below them, which none of those
may import of each other; only `tirl.cli` imports it (docs/architecture.md, "Layers").
"""
