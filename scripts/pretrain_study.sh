#!/usr/bin/env bash
# The sparse-pretraining study of docs/results.md ("Sparse pretraining at the bert_small_wiki scale") on one machine
# with any number of GPUs: a queue of pretraining runs, one per GPU at a time (the KD runs once the teacher is done,
# the plateau ablations and the optional runs last), and GLUE from every model as soon as it is done (a pool of
# one-thread processes spread over the GPUs: finetuning at batch 32 is host-bound).
#
#   scripts/pretrain_study.sh OUT_ROOT DATA_DIR TOKENIZER_DIR [SECONDS]
#
# DATA_DIR holds the Wikipedia mirror and glue/. SECONDS (default 1380): every process is stopped then; finished
# runs stay (DONE), unfinished ones do not count. Then: python scripts/pretrain_study_table.py OUT_ROOT.
# Environment (all optional):
#   STUDY_GPUS     GPUs for pretraining, e.g. "0 1 2 3" (default: every GPU nvidia-smi lists); a GPU named twice
#                  ("0 1 0 1") runs two at a time, each at about half speed (the KD runs of a 2-GPU lease)
#   GLUE_GPUS      GPUs the GLUE processes share (default: STUDY_GPUS); GLUE_PARALLEL: how many at a time
#                  (default: half the CPUs)
#   GLUE_TASKS     the GLUE tasks of every model (default "sst2 cola stsb mrpc rte wnli")
#   GLUE_LRS       extra finetuning learning rates (default "1e-4 2e-4") for the tasks in GLUE_LR_TASKS (default
#                  "cola stsb mrpc rte") on the models in GLUE_LR_RUNS (default: the two dense baselines and the
#                  RigL KD runs at 80 and 90 %, and plain 80 % RigL)
#   STUDY_RUNS     the pretraining runs to make, in this order, separated by any whitespace (default: all, in
#                  the queue order below); a name the queue does not hold is an error
#   STUDY_SET, GLUE_SET  extra arguments for every pretraining / GLUE process (a CPU dry run shrinks the model)
# A pretraining worker waits while OUT_ROOT/hold/GPU exists: another job (a benchmark, say) has that GPU (GLUE
# processes do not look at holds). Use a fresh OUT_ROOT per call: nothing is resumed, and the logs/*.exit and hold/*
# files of an earlier call would be taken as this call's. Paths must not contain spaces.
set -u
root=$1 data=$2 tokenizer=$3
deadline=$(( $(date +%s) + ${4:-1380} ))
export OMP_NUM_THREADS=1
mkdir -p "$root/logs" "$root/hold"

# every run on the pretraining defaults: compiled, a fixed masked-token count, CUDA graphs (docs/performance.md)
common="--output-dir $root --data-dir $data --set model.tokenizer=$tokenizer --set train.eval_steps=500"
common="$common --set train.save_steps=4000 --set train.report_to=[] ${STUDY_SET:-}"
# the plateau ablations: 80 % RigL with one thing changed, stopped at step 4 000 of the 8 000-step schedules; last,
# the numerics pair (bert_small_wiki with and without the bf16 residual stream and hash dropout, at two seeds):
# eval loss only, no GLUE; then the learning-rate pairs: dense and 80 % RigL ERK at lr 1e-3 (full schedules, eval
# loss only), dense + KD and 80 % RigL ERK + KD with the one-cycle peak at 2e-3 (with GLUE); the same two KD runs
# at a second seed, and with the hidden-state term (kd.hidden_weight) at three seeds; 80 % RigL ERK with the
# regrown weights' Adam second moment seeded (rigl.grow_second_moment=layer_mean), plain and with KD + hidden; the
# gradual-pruning recipe (GMP global ending at 90 %) at a third seed; the FP8 quality pair (docs/performance.md:
# with bert_small_wiki and kd_hidden_gmp_global at seeds 42 and 43, the same runs with train.precision=fp8; also
# small_wiki_sparse_80_gmp, a sparse pair without a teacher that fits a one-GPU lease)
early="--set train.stop_after_steps=4000"

# NAME|NEEDS|ARGUMENTS: pretraining run NAME (run.py ARGUMENTS), started once run NEEDS (if any) is done
all_runs="
small_wiki_teacher||small_wiki_teacher
bert_small_wiki||bert_small_wiki
small_wiki_sparse_80_rigl||small_wiki_sparse_80_rigl
small_wiki_sparse_80_static||small_wiki_sparse_80_static
small_wiki_sparse_80_kd_onecycle_lr_rigl|small_wiki_teacher|small_wiki_sparse_80_kd_onecycle_lr_rigl
small_wiki_dense_kd_onecycle_lr|small_wiki_teacher|small_wiki_dense_kd_onecycle_lr
small_wiki_sparse_90_kd_onecycle_lr_rigl|small_wiki_teacher|small_wiki_sparse_90_kd_onecycle_lr_rigl
small_wiki_sparse_80_kd_onecycle_lr_gmp|small_wiki_teacher|small_wiki_sparse_80_kd_onecycle_lr_gmp
small_wiki_sparse_80_rigl_erk||small_wiki_sparse_80_rigl_erk
small_wiki_sparse_80_static_erk||small_wiki_sparse_80_static_erk
small_wiki_sparse_80_gmp||small_wiki_sparse_80_gmp
small_wiki_sparse_80_gmp_erk||small_wiki_sparse_80_gmp_erk
ablation_rigl_drop_0.1||small_wiki_sparse_80_rigl $early --set rigl.drop_fraction=0.1
ablation_rigl_drop_0.5||small_wiki_sparse_80_rigl $early --set rigl.drop_fraction=0.5
ablation_rigl_every_400||small_wiki_sparse_80_rigl $early --set rigl.update_freq=400
ablation_rigl_lr_1e-3||small_wiki_sparse_80_rigl $early --set train.learning_rate=1e-3
ablation_rigl_eager||small_wiki_sparse_80_rigl $early --set train.torch_compile=false \
--set data.static_mask_count=false --set train.torch_compile_mode=default --set train.clip_in_optimizer=false
ablation_rigl_grow_normal||small_wiki_sparse_80_rigl $early --set rigl.grow_init=normal
small_wiki_sparse_80_kd_onecycle_lr_rigl_erk|small_wiki_teacher|small_wiki_sparse_80_kd_onecycle_lr_rigl_erk
small_wiki_dense_exact_numerics||small_wiki_dense_exact_numerics
ablation_dense_lr_1e-3||bert_small_wiki --set train.learning_rate=1e-3
ablation_rigl_erk_lr_1e-3||small_wiki_sparse_80_rigl_erk --set train.learning_rate=1e-3
kd_dense_max_lr_2e-3|small_wiki_teacher|small_wiki_dense_kd_onecycle_lr --set onecycle.max_lr=2e-3
kd_rigl_erk_max_lr_2e-3|small_wiki_teacher|small_wiki_sparse_80_kd_onecycle_lr_rigl_erk --set onecycle.max_lr=2e-3
kd_hidden_dense|small_wiki_teacher|small_wiki_dense_kd_hidden_onecycle_lr
kd_hidden_rigl_erk|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_rigl_erk
kd_hidden_gmp_erk|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_erk
kd_hidden_gmp_global|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_global
kd_hidden_gmp_global_end50|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_global_end50
kd_hidden_gmp_rigl|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_rigl
kd_hidden_gmp_global_end90|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_global_end90
kd_hidden_gmp_rigl_late|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_rigl_late
kd_hidden_dense_seed43|small_wiki_teacher|small_wiki_dense_kd_hidden_onecycle_lr --set seed=43
kd_hidden_rigl_erk_seed43|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_rigl_erk --set seed=43
kd_hidden_dense_seed44|small_wiki_teacher|small_wiki_dense_kd_hidden_onecycle_lr --set seed=44
kd_hidden_rigl_erk_seed44|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_rigl_erk --set seed=44
kd_hidden_gmp_erk_seed43|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_erk --set seed=43
kd_hidden_gmp_global_seed43|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_global --set seed=43
kd_hidden_gmp_global_end50_seed43|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_global_end50 --set seed=43
kd_hidden_gmp_rigl_seed43|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_rigl --set seed=43
kd_hidden_gmp_global_end90_seed43|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_global_end90 --set seed=43
kd_hidden_gmp_rigl_late_seed43|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_rigl_late --set seed=43
kd_hidden_gmp_global_end90_seed44|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_global_end90 --set seed=44
kd_dense_seed43|small_wiki_teacher|small_wiki_dense_kd_onecycle_lr --set seed=43
kd_rigl_erk_seed43|small_wiki_teacher|small_wiki_sparse_80_kd_onecycle_lr_rigl_erk --set seed=43
ablation_rigl_erk_grow_layer_mean||small_wiki_sparse_80_rigl_erk --set rigl.grow_second_moment=layer_mean
kd_hidden_rigl_erk_grow_layer_mean|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_rigl_erk \
--set rigl.grow_second_moment=layer_mean
numerics_fast_seed43||bert_small_wiki --set seed=43
numerics_exact_seed43||small_wiki_dense_exact_numerics --set seed=43
fp8pair_dense_seed43||bert_small_wiki --set seed=43
fp8pair_dense_fp8||bert_small_wiki --set train.precision=fp8
fp8pair_dense_fp8_seed43||bert_small_wiki --set seed=43 --set train.precision=fp8
fp8pair_sparse_fp8|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_global --set train.precision=fp8
fp8pair_sparse_fp8_seed43|small_wiki_teacher|small_wiki_sparse_80_kd_hidden_onecycle_lr_gmp_global --set seed=43 \
--set train.precision=fp8
fp8pair_gmp_fp8||small_wiki_sparse_80_gmp --set train.precision=fp8
fp8pair_gmp_seed43||small_wiki_sparse_80_gmp --set seed=43
fp8pair_gmp_fp8_seed43||small_wiki_sparse_80_gmp --set seed=43 --set train.precision=fp8
"
# STUDY_RUNS: any whitespace between names (a list written over several lines loses no run); a name the list
# above does not hold is an error before anything starts
wanted=" $(echo ${STUDY_RUNS:-}) "
known=" $(cut -d'|' -f1 <<<"$all_runs" | tr '\n' ' ') "
for name in $wanted; do
  [[ "$known" == *" $name "* ]] || { echo "pretrain_study.sh: STUDY_RUNS names an unknown run: $name" >&2; exit 2; }
done
queue=$root/queue
: >"$queue"
# in the order STUDY_RUNS names them (a run that needs another still waits for it), else in the list's order; each
# run once. (Inside double quotes bash removed each backslash-newline: every run is one line of all_runs.)
order=$wanted
[ -n "${order// /}" ] || order=$known
queued=" "
for name in $order; do
  [[ "$queued" == *" $name "* ]] && continue
  queued="$queued$name "
  awk -F'|' -v name="$name" '$1 == name' <<<"$all_runs" >>"$queue"
done

seconds_left() {  # until the deadline, at least 1 ("timeout 0" would mean no limit at all)
  local left=$(( deadline - $(date +%s) ))
  echo $(( left > 0 ? left : 1 ))
}
take() {  # the first queue line whose NEEDS is done (removed from the queue); "wait" if none yet; "" if empty
  (
    flock 9
    local n=0 name needs args
    while IFS='|' read -r name needs args; do
      n=$((n + 1))
      if [ -z "$needs" ] || [ -f "$root/$needs/DONE" ]; then
        sed -i "${n}d" "$queue"; touch "$root/logs/$name.started"; echo "run|$name|$args"; return
      elif [ -f "$root/logs/$needs.exit" ]; then  # what it needs ended unfinished
        sed -i "${n}d" "$queue"; echo "skip|$name|$needs"; return
      elif [ ! -f "$root/logs/$needs.started" ] && ! grep -q "^$needs|" "$queue"; then  # nor queued nor running
        sed -i "${n}d" "$queue"; echo "skip|$name|$needs"; return
      fi
    done <"$queue"
    if [ -s "$queue" ]; then echo wait; fi
  ) 9>"$root/queue.lock"
}
worker() {  # worker GPU: pretraining runs from the queue on GPU, one at a time
  local gpu=$1 item kind name rest
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if [ -e "$root/hold/$gpu" ]; then sleep 5; continue; fi
    item=$(take)
    IFS='|' read -r kind name rest <<<"$item"
    case $kind in
      "") return ;;
      wait) sleep 5 ;;
      skip) echo "not run: it needs $rest, which did not finish here" >"$root/logs/$name.log"; echo 3 >"$root/logs/$name.exit" ;;
      run)
        # shellcheck disable=SC2086  # the arguments are split on purpose
        CUDA_VISIBLE_DEVICES=$gpu timeout -k 30 "$(seconds_left)" python run.py $rest --run-name "$name" \
          $common >"$root/logs/$name.log" 2>&1
        echo $? >"$root/logs/$name.exit" ;;
    esac
  done
}

glue_job() {  # glue_job GPU RUN TASK [LR]: GLUE TASK from the finished RUN (3 seeds on the small tasks)
  local gpu=$1 run=$2 task=$3 lr=${4:-} name=glue_from=$2~$3 extra=""
  if [ -n "$lr" ]; then name="$name~lr$lr" extra="--set train.learning_rate=$lr"; fi
  [ "$(date +%s)" -lt "$deadline" ] || { echo "not run: the deadline passed" >"$root/logs/$name.log"; return; }
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$gpu timeout -k 30 "$(seconds_left)" python run.py "glue_from=$root/$run" \
    --run-name "$name" --output-dir "$root" --data-dir "$data" --set "finetune.glue_tasks=$task" \
    --set train.dataloader_workers=0 $extra ${GLUE_SET:-} >"$root/logs/$name.log" 2>&1
  echo $? >"$root/logs/$name.exit"
}
export -f glue_job seconds_left
export root data deadline GLUE_SET

gpus=${STUDY_GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr '\n' ' ')}
[ -n "${gpus// /}" ] || { echo "pretrain_study.sh: no GPU found (nvidia-smi); set STUDY_GPUS" >&2; exit 2; }
read -ra glue_gpus <<<"${GLUE_GPUS:-$gpus}"
# half the CPUs: nproc counts only OMP_NUM_THREADS of them, and this script sets that to 1 for its processes
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
parallel=${GLUE_PARALLEL:-$(( cpus / 2 ))}
parallel=$(( parallel > 0 ? parallel : 1 ))
echo "pretrain_study.sh: pretraining on GPUs $(echo $gpus); GLUE $parallel processes at a time on GPUs ${glue_gpus[*]}"
lr_runs=${GLUE_LR_RUNS:-bert_small_wiki small_wiki_dense_kd_onecycle_lr small_wiki_sparse_80_rigl
  small_wiki_sparse_80_kd_onecycle_lr_rigl small_wiki_sparse_90_kd_onecycle_lr_rigl}
# each model's GLUE jobs (TASK [LR] per line), handed to the pool once the model is done
mkdir -p "$root/glue_jobs"
models=""
while IFS='|' read -r name _; do  # the study's models (not the teacher, the ablations, the numerics pairs)
  case $name in small_wiki_teacher|ablation_*|*numerics*) continue ;; esac
  models="$models $name"
  printf '%s\n' ${GLUE_TASKS:-sst2 cola stsb mrpc rte wnli} >"$root/glue_jobs/$name"
  if [[ " $(echo $lr_runs) " == *" $name "* ]]; then
    for lr in ${GLUE_LRS-1e-4 2e-4}; do
      printf '%s '"$lr"'\n' ${GLUE_LR_TASKS:-cola stsb mrpc rte} >>"$root/glue_jobs/$name"
    done
  fi
done <"$queue"

dispatch() {  # "GPU RUN TASK [LR]" lines, each model's as soon as it is done, GPUs in turn; until none is left
  local pending=" $models " name task lr n=0
  while [ -n "${pending// /}" ] && [ "$(date +%s)" -lt "$deadline" ]; do
    for name in $pending; do
      if [ -f "$root/$name/DONE" ]; then
        # (no trailing blank: xargs -L would join the next line to this one)
        while read -r task lr; do echo "${glue_gpus[n++ % ${#glue_gpus[@]}]} $name $task${lr:+ $lr}"; done \
          <"$root/glue_jobs/$name"
        pending=${pending/ $name / }
      elif [ -f "$root/logs/$name.exit" ]; then  # ended unfinished (or skipped): no GLUE
        pending=${pending/ $name / }
      fi
    done
    sleep 5
  done
}

for gpu in $gpus; do worker "$gpu" & done
dispatch | xargs -r -P "$parallel" -L 1 bash -c 'glue_job "$@"' _ &
wait
