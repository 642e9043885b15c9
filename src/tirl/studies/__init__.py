"""Studies: experiments built on tirl's library, kept out of its core packages.

- `ablate`: `tirl ablate`, RL from one SFT model under several switch combinations;
- `races_tasks`, `races_study`, `races_report`: `tirl study races`, RACES's composition study
  on a tiny model (its task sets, its runner, its analysis and report);
- `simulate`: a discrete-event model of rollout schedules on a cluster (`bench/rollout.py`).

A study may import `train`, `eval`, `synth` and everything below them; only `tirl.cli`
imports a study (docs/architecture.md, "Layers").
"""
