#!/usr/bin/env bash
# Three CIR steps of a small model on verl with tirl's agent loop, then the checks a broken
# integration fails first (examples/verl/check_smoke.py). Needs GPUs and `pip install 'tirl[verl]'`.
#
#   bash examples/verl/smoke.sh Qwen/Qwen2.5-0.5B-Instruct [N_GPUS]
#
# Not yet run on real hardware (written on a machine without a GPU); the plugin's CPU tests
# are in tests/verl.
set -euo pipefail
MODEL=${1:?usage: smoke.sh MODEL [N_GPUS]}
GPUS=${2:-1}
OUT=${SMOKE_DIR:-runs/verl_smoke}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"

# arithmetic tasks scored exactly, CIR's switches, three steps
CONFIG=(recipes/verl/cir.yaml "model.name_or_path=$MODEL" "data.train=[{source: arithmetic}]"
        "data.eval=[{name: heldout, items: 16}]" rl.steps=3 rl.prompts_per_step=8
        rl.group_size=4 rl.max_model_tokens=512 eval.samples_per_item=0)
tirl verl data "${CONFIG[@]}" --split train --n 24 --out "$OUT/train.parquet" --force
tirl verl data "${CONFIG[@]}" --split test --out "$OUT/test.parquet" --force

python -m verl.trainer.main_ppo $(tirl verl config "${CONFIG[@]}") \
    data.train_files="$OUT/train.parquet" data.val_files="$OUT/test.parquet" \
    trainer.nnodes=1 trainer.n_gpus_per_node="$GPUS" trainer.logger=[console] \
    trainer.rollout_data_dir="$OUT/rollouts" trainer.save_freq=-1 \
    2>&1 | tee "$OUT/train.log"

python "$HERE/check_smoke.py" "$OUT/train.log" "$OUT/rollouts"
