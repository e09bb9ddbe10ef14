#!/usr/bin/env bash
# The sparse-pretraining study of docs/results.md ("Sparse pretraining at the bert_small_wiki scale") on one machine
# with 2 GPUs: every run at bert_small_wiki's data, steps, eval masks and seed, up to three runs per GPU at a time,
# then GLUE from every pretrained model (one process per model and task, one CPU thread each: finetuning at batch 32
# is host-bound).
#
#   scripts/pretrain_study.sh OUT_ROOT DATA_DIR TOKENIZER_DIR [SECONDS]
#
# DATA_DIR holds the Wikipedia mirror and glue/. SECONDS (default 1380): every lane is stopped then; finished runs
# stay (DONE), unfinished ones do not count. STUDY_SET: extra arguments for every run (a CPU dry run shrinks the
# model and the steps with it). AFTER_STUDY: a command run on GPU 0 once its lanes are done (a benchmark, say).
# Then: python scripts/pretrain_study_table.py OUT_ROOT.
set -u
root=$1 data=$2 tokenizer=$3
deadline=$(( $(date +%s) + ${4:-1380} ))
export OMP_NUM_THREADS=1
mkdir -p "$root/logs"

# every run on the pretraining defaults: compiled, a fixed masked-token count, CUDA graphs (docs/performance.md)
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
  printf 'python run.py %s --run-name %s %s %s %s' "$experiment" "$name" "$common" "$*" "${STUDY_SET:-}"
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

# GPU 0: the teacher alone, then the two KD runs of the target (80 % and its dense baseline), then AFTER_STUDY alone.
# GPU 1: three runs at a time, then three more; every GLUE lane (host-bound) shares GPU 1.
lane 0 small_wiki_teacher "$(pretrain small_wiki_teacher small_wiki_teacher)"
lane 0 small_wiki_sparse_80_kd_onecycle_lr_rigl "$(kd small_wiki_sparse_80_kd_onecycle_lr_rigl \
  small_wiki_sparse_80_kd_onecycle_lr_rigl)"
lane 0 small_wiki_dense_kd_onecycle_lr "$(kd small_wiki_dense_kd_onecycle_lr small_wiki_dense_kd_onecycle_lr)"
lane 1 bert_small_wiki "$(pretrain bert_small_wiki bert_small_wiki)"
lane 1 small_wiki_sparse_80_rigl "$(pretrain small_wiki_sparse_80_rigl small_wiki_sparse_80_rigl)"
lane 1 small_wiki_sparse_80_static "$(pretrain small_wiki_sparse_80_static small_wiki_sparse_80_static)"
lane 1 small_wiki_sparse_90_kd_onecycle_lr_rigl "$(after bert_small_wiki) $(kd \
  small_wiki_sparse_90_kd_onecycle_lr_rigl small_wiki_sparse_90_kd_onecycle_lr_rigl)"
lane 1 small_wiki_sparse_80_gmp "$(after small_wiki_sparse_80_rigl) $(pretrain small_wiki_sparse_80_gmp \
  small_wiki_sparse_80_gmp)"
lane 1 small_wiki_sparse_80_rigl_rescaled "$(after small_wiki_sparse_80_static) $(pretrain \
  small_wiki_sparse_80_rigl_rescaled small_wiki_sparse_80_rigl_rescaled)"

# GLUE from every model of the study (the teacher is not one), in the order the models finish
for run in bert_small_wiki small_wiki_sparse_80_rigl small_wiki_sparse_80_static small_wiki_sparse_80_kd_onecycle_lr_rigl \
    small_wiki_dense_kd_onecycle_lr small_wiki_sparse_90_kd_onecycle_lr_rigl small_wiki_sparse_80_gmp \
    small_wiki_sparse_80_rigl_rescaled; do
  glue 1 "$run"
done

if [ -n "${AFTER_STUDY:-}" ]; then  # once GPU 0's lanes have exited, finished or not
  lane 0 after_study "until [ -f $root/logs/small_wiki_sparse_80_kd_onecycle_lr_rigl.exit ] \
    && [ -f $root/logs/small_wiki_dense_kd_onecycle_lr.exit ]; do sleep 5; done; $AFTER_STUDY"
fi
wait
