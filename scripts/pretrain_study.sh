#!/usr/bin/env bash
# The sparse-pretraining study of docs/results.md ("Sparse pretraining at the bert_small_wiki scale") on one machine
# with 4 GPUs: every run at bert_small_wiki's data, steps, eval masks and seed, two or three runs per GPU at a time,
# then GLUE from every pretrained model (one process per model and task, one CPU thread each: finetuning at batch 32
# is host-bound), then the plateau ablations.
#
#   scripts/pretrain_study.sh OUT_ROOT DATA_DIR TOKENIZER_DIR [SECONDS]
#
# DATA_DIR holds the Wikipedia mirror and glue/. SECONDS (default 1380): every lane is stopped then; finished runs
# stay (DONE), unfinished ones do not count. STUDY_SET: extra arguments for every run (a CPU dry run shrinks the
# model and the steps with it). AFTER_STUDY: a command run on GPU 3 once its lanes are done (a benchmark, say).
# Then: python scripts/pretrain_study_table.py OUT_ROOT.
set -u
root=$1 data=$2 tokenizer=$3
deadline=$(( $(date +%s) + ${4:-1380} ))
export OMP_NUM_THREADS=1
mkdir -p "$root/logs"

# the fast GPU settings that leave the arithmetic alone (docs/performance.md), the same for every run
fast="--set train.torch_compile=true --set data.static_mask_count=true --set train.torch_compile_mode=reduce-overhead"
common="--output-dir $root --data-dir $data --set model.tokenizer=$tokenizer --set train.eval_steps=500"
common="$common --set train.save_steps=4000 --set train.report_to=[]"

# lane GPU NAME COMMAND: run COMMAND in the background on GPU; logs/NAME.log, then logs/NAME.exit (its status)
lane() {
  local gpu=$1 name=$2; shift 2
  ( CUDA_VISIBLE_DEVICES=$gpu timeout $(( deadline - $(date +%s) )) bash -c "$*" >"$root/logs/$name.log" 2>&1
    echo $? >"$root/logs/$name.exit" ) &
}
# after RUN...: wait until every RUN has finished (DONE) or its lane has exited without it (then fail)
after() {
  local run out=""
  for run in "$@"; do
    out="$out until [ -f $root/$run/DONE ] || [ -f $root/logs/$run.exit ]; do sleep 5; done;"
    out="$out [ -f $root/$run/DONE ] || { echo 'not finished: $run'; exit 3; };"
  done
  printf '%s' "$out"
}
pretrain() {  # pretrain NAME EXPERIMENT [ARGS]: one pretraining run named NAME
  local name=$1 experiment=$2; shift 2
  printf 'python run.py %s --run-name %s %s %s %s %s' "$experiment" "$name" "$common" "$fast" "$*" "${STUDY_SET:-}"
}
glue() {  # glue GPU RUN: GLUE from RUN, one lane per task (3 seeds on the small tasks: glue_from's runs_per_task)
  local gpu=$1 run=$2 task
  for task in cola sst2 mrpc stsb rte wnli; do
    lane "$gpu" "glue-$run-$task" "$(after "$run") python run.py glue_from=$root/$run --run-name glue_from=$run~$task \
      --output-dir $root --data-dir $data --set finetune.glue_tasks=$task --set train.dataloader_workers=0 \
      ${GLUE_SET:-}"
  done
}
# chain NAME EXPERIMENT [ARGS]: the command of pretraining run NAME that waits for the teacher first
kd() { printf '%s %s' "$(after small_wiki_teacher)" "$(pretrain "$@")"; }

# GPU 0: the teacher alone, then the 80 % KD run; GPUs 1-3: two or three runs at once, then a KD run or ablations
lane 0 small_wiki_teacher "$(pretrain small_wiki_teacher small_wiki_teacher)"
lane 0 small_wiki_sparse_80_kd_onecycle_lr_rigl "$(kd small_wiki_sparse_80_kd_onecycle_lr_rigl \
  small_wiki_sparse_80_kd_onecycle_lr_rigl)"
lane 1 bert_small_wiki "$(pretrain bert_small_wiki bert_small_wiki)"
lane 1 small_wiki_sparse_80_static "$(pretrain small_wiki_sparse_80_static small_wiki_sparse_80_static)"
lane 1 small_wiki_sparse_90_kd_onecycle_lr_rigl "$(after bert_small_wiki) $(kd \
  small_wiki_sparse_90_kd_onecycle_lr_rigl small_wiki_sparse_90_kd_onecycle_lr_rigl)"
lane 2 small_wiki_sparse_80_rigl "$(pretrain small_wiki_sparse_80_rigl small_wiki_sparse_80_rigl)"
lane 2 small_wiki_sparse_80_rigl_erk "$(pretrain small_wiki_sparse_80_rigl_erk small_wiki_sparse_80_rigl_erk)"
# the two settings that change the arithmetic (bf16 residual stream, hash dropout), against bert_small_wiki
lane 2 small_wiki_dense_bf16_residual_fast_dropout "$(pretrain small_wiki_dense_bf16_residual_fast_dropout \
  bert_small_wiki --set model.half_precision_residual=true --set model.fast_dropout=true)"
lane 2 small_wiki_dense_kd_onecycle_lr "$(after small_wiki_sparse_80_rigl) $(kd small_wiki_dense_kd_onecycle_lr \
  small_wiki_dense_kd_onecycle_lr)"
lane 3 small_wiki_sparse_80_static_erk "$(pretrain small_wiki_sparse_80_static_erk small_wiki_sparse_80_static_erk)"
lane 3 small_wiki_sparse_80_gmp "$(pretrain small_wiki_sparse_80_gmp small_wiki_sparse_80_gmp)"
lane 3 small_wiki_sparse_80_rigl_rescaled "$(pretrain small_wiki_sparse_80_rigl_rescaled \
  small_wiki_sparse_80_rigl_rescaled)"

# GLUE from every model of the study (the teacher is not one)
glue 1 bert_small_wiki; glue 1 small_wiki_sparse_80_static; glue 1 small_wiki_sparse_90_kd_onecycle_lr_rigl
glue 2 small_wiki_sparse_80_rigl; glue 2 small_wiki_sparse_80_rigl_erk; glue 2 small_wiki_dense_kd_onecycle_lr
glue 0 small_wiki_sparse_80_static_erk; glue 2 small_wiki_sparse_80_gmp; glue 0 small_wiki_sparse_80_rigl_rescaled
glue 0 small_wiki_sparse_80_kd_onecycle_lr_rigl  # none on GPU 3: it ends with AFTER_STUDY (a benchmark) alone

# The RigL plateau: 3 000-step variants of small_wiki_sparse_80_rigl against dense at the same length (the linear
# schedule ends at 3 000), once GPU 0's KD run and GPU 3's runs are done
short="--set train.max_steps=3000 --set train.warmup_steps=300"
ablation() {  # ablation GPU WAIT_FOR NAME EXPERIMENT [ARGS]
  local gpu=$1 wait_for=$2 name=$3 experiment=$4; shift 4
  lane "$gpu" "$name" "$(after "$wait_for") $(pretrain "$name" "$experiment" "$short" "$*")"
}
ablation 0 small_wiki_sparse_80_kd_onecycle_lr_rigl plateau_dense bert_small_wiki
ablation 0 small_wiki_sparse_80_kd_onecycle_lr_rigl plateau_rigl small_wiki_sparse_80_rigl
ablation 0 small_wiki_sparse_80_kd_onecycle_lr_rigl plateau_dense_eager bert_small_wiki \
  --set train.torch_compile=false --set data.static_mask_count=false --set train.torch_compile_mode=default
ablation 0 small_wiki_sparse_80_kd_onecycle_lr_rigl plateau_rigl_lr1e-3 small_wiki_sparse_80_rigl \
  --set train.learning_rate=1e-3
ablation 0 small_wiki_sparse_80_kd_onecycle_lr_rigl plateau_rigl_drop0.1 small_wiki_sparse_80_rigl \
  --set rigl.drop_fraction=0.1
ablation 3 small_wiki_sparse_80_rigl_rescaled plateau_rigl_every500 small_wiki_sparse_80_rigl \
  --set rigl.update_freq=500
ablation 3 small_wiki_sparse_80_rigl_rescaled plateau_static_rescaled small_wiki_sparse_80_static \
  --set sparsity.rescale_init=true
# the default (eager) path: no compile, no fixed mask count, no CUDA graphs (the fast settings come first, so these
# later --set win)
ablation 3 small_wiki_sparse_80_rigl_rescaled plateau_rigl_eager small_wiki_sparse_80_rigl \
  --set train.torch_compile=false --set data.static_mask_count=false --set train.torch_compile_mode=default

if [ -n "${AFTER_STUDY:-}" ]; then  # once GPU 3's lanes have exited, finished or not
  lane 3 after_study "until [ -f $root/logs/plateau_rigl_eager.exit ] && [ -f $root/logs/plateau_rigl_every500.exit ] \
    && [ -f $root/logs/plateau_static_rescaled.exit ]; do sleep 5; done; $AFTER_STUDY"
fi
wait
