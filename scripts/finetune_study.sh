#!/usr/bin/env bash
# The sparse-finetuning study of docs/results.md on one machine with 2 GPUs: every task family at once, ~16
# processes per GPU (MiniLM at batch 32 is host-bound: one process leaves a GPU mostly idle; one CPU thread each,
# no data-loader workers, so the processes share the cores instead of fighting over them). Every task family has
# its own output root, so its dense teacher (run0 of minilm_glue / minilm_squad_v1 / minilm_gap_*) and its
# students share a registry; the students start once run0 of their teacher is DONE.
#
#   scripts/finetune_study.sh OUT_ROOT DATA_DIR MINILM_DIR [SECONDS]
#
# SECONDS (default 540): every lane is stopped then; finished runs stay (DONE), unfinished ones do not count.
set -u
root=$1 data=$2 minilm=$3
deadline=$(( $(date +%s) + ${4:-540} ))
# one process per lane (the GPU fast path would otherwise train a lane's seeds side by side): lanes are what
# this script shares the GPU by
common=(--data-dir "$data" --set "model.init_from=$minilm" --set train.dataloader_workers=0 \
  --set finetune.parallel_runs=1)
export OMP_NUM_THREADS=1
mkdir -p "$root/logs"

# lane GPU NAME COMMAND...: run COMMAND in the background on GPU, output to logs/NAME.log
lane() {
  local gpu=$1 name=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout $(( deadline - $(date +%s) )) bash -c "$*" >"$root/logs/$name.log" 2>&1 &
}
# after TEACHER_RUN_DIR EXPERIMENT ARGS...: once the teacher's run0 is DONE, run EXPERIMENT in the same output root
after() {
  local teacher=$1; shift
  printf 'until [ -f %q/DONE ]; do sleep 3; done; python run.py %s' "$teacher" "$*"
}

glue() {  # glue GPU TASK DIRNAME
  local gpu=$1 task=$2 out="$root/glue_$2" set=(--set "finetune.glue_tasks=$2")
  local args="--output-dir $out ${common[*]} ${set[*]}"
  lane "$gpu" "$task-dense" "python run.py minilm_glue $args"
  for student in minilm_glue_kd minilm_glue_downstream80 minilm_glue_downstream90; do
    lane "$gpu" "$task-${student#minilm_glue_}" "$(after "$out/minilm_glue/glue_$task/run0" "$student $args")"
  done
}
family() {  # family GPU DENSE OUT_NAME TASK_DIR: a dense teacher and its _kd, _downstream80, _downstream90 students
  local gpu=$1 dense=$2 out="$root/$3" task_dir=$4
  local args="--output-dir $out ${common[*]}"
  lane "$gpu" "$dense" "python run.py $dense $args"
  for suffix in kd downstream80 downstream90; do
    lane "$gpu" "${dense}_$suffix" "$(after "$out/$dense/$task_dir/run0" "${dense}_$suffix $args")"
  done
}

glue 0 sst2; glue 0 stsb; glue 0 rte; family 0 minilm_gap_mul gap_mul gap
glue 1 cola; glue 1 mrpc; family 1 minilm_squad_v1 squad squad_v1; family 1 minilm_gap_concat gap_concat gap
wait
