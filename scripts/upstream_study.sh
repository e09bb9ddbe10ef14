#!/usr/bin/env bash
# The upstream-pruning study of docs/results.md on one machine (any number of GPUs; lanes are dealt out round
# robin): the package MiniLM pruned on Wikipedia (sparsebert/experiments/upstream.py), then every task finetuned from it with
# its masks fixed, each against the dense model of the same call and seeds, and today's downstream recipe beside.
#
#   scripts/upstream_study.sh OUT_ROOT DATA_DIR MINILM_DIR [SECONDS]
#
# Lanes: the upstream runs (STUDY_UPSTREAM, default "80_obs 80_obs_nodropout 90_obs"), and per task the dense run
# (3 seeds: also the teacher, run0), the downstream recipes (STUDY_DOWNSTREAM_VARIANTS, seed 42; only for the tasks in
# STUDY_DOWNSTREAM, default all) and one transfer lane per upstream run, which waits for both its upstream run and
# its teacher. Every task family has its own output root (so its teacher and students share a registry); the
# upstream runs have theirs. MiniLM at batch 32 is host-bound: many processes share each GPU, one CPU thread each.
# The upstream runs are not: on one H100 two side by side took 570-740 s, three 890 s (docs/results.md), and the
# transfers start after them. GPU memory bounds the lanes: each downstream oBERT lane holds 2 GB of Fisher
# inverses, and 16 of them beside the dense and transfer lanes ran one out of memory on an 80 GB H100 (docs/results.md,
# call G). SECONDS (default 1500): every lane is stopped then; finished runs stay (DONE),
# unfinished ones do not count. STUDY_UPSTREAM_SET / STUDY_TASK_SET: more "--set k=v" for the upstream runs / for
# every finetuning run (the CPU test makes them tiny). STUDY_VARIANTS: suffixes of more GLUE transfers from the
# first upstream run, as the search (e.g. "_lr2e4 _hidden" from 80_obs: minilm_glue_from_upstream80_obs_lr2e4 ...;
# "_searched" from 80_obs_nodropout), each a lane of its own beside the plain transfer. STUDY_SEED_LANES=1: every
# seed of a transfer is a process of its own (output root TASK/seedN, the teacher named by its path), so that one
# task's three seeds do not run one after another at the end.
# STUDY_DOWNSTREAM_VARIANTS (default _downstream80): the downstream recipes, e.g. "_downstream80 _downstream80_obs".
# STUDY_DENSE_VARIANTS: suffixes of more dense GLUE runs beside the teacher, same seeds (e.g. "_eager": minilm_glue_eager).
# STUDY_SEARCH="TASK ...": GLUE tasks that also get a --search lane over the transfer's settings from the first upstream
# run (space STUDY_SEARCH_SPACE, default transfer; STUDY_SEARCH_TRIALS trials, default 8, STUDY_SEARCH_PARALLEL at
# once, default 4), distilled from the same teacher; its study lands in TASK/search/.
# STUDY_MAX_LANES=N: at most N lanes of this study train on each GPU at once (a lane takes one of the GPU's N slots
# when its waits are over and holds it until it ends; 0: no limit). Default: what the smallest GPU in use holds at
# 3 GiB a lane (5 GiB when a downstream oBERT recipe is among the lanes: its Fisher inverses take 2 GiB more), less
# the extra runs of each search lane (one lane that trains STUDY_SEARCH_PARALLEL runs at once); no limit where
# nvidia-smi cannot tell or flock is missing. In call H (docs/results.md) the finetuning lanes took 1.4-2.7 GiB each
# on an H100 and 40 at once ran its 80 GB out.
# Every run.py gets --resume: the same command again, into the same root, skips the runs that finished, continues
# an upstream run from its last checkpoint and starts an unfinished finetuning run over, where without it they would
# be refused (a run that is still training is refused by its lock).
set -u
root=$1 data=$2 minilm=$3
deadline=$(( $(date +%s) + ${4:-1500} ))
upstreams=${STUDY_UPSTREAM:-"80_obs 80_obs_nodropout 90_obs"}
read -r first_upstream _ <<< "$upstreams"  # the search and the variants start from it
tasks=${STUDY_TASKS:-"rte mrpc stsb cola sst2 gap_mul gap_concat squad_v1"}
read -r -a gpus <<< "${STUDY_GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr '\n' ' ')}"
[ ${#gpus[@]} -gt 0 ] || gpus=(0)
export OMP_NUM_THREADS=1
# a search lane starts after the upstream run: refuse now, not after it, where it could not start
if [ -n "${STUDY_SEARCH:-}" ] && ! python -c "import optuna" 2>/dev/null; then
  echo "upstream_study.sh: STUDY_SEARCH needs optuna (pip install optuna), which this python cannot import" >&2
  exit 2
fi
# the default STUDY_MAX_LANES (above), or nothing
default_max_lanes() {
  local mem t searches=0 per_lane=3072 lanes
  command -v flock >/dev/null || return 0
  mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i "$(IFS=,; echo "${gpus[*]}")" \
        2>/dev/null | sort -n | head -1)
  [[ $mem =~ ^[0-9]+$ ]] || return 0
  for t in ${STUDY_SEARCH:-}; do [[ " $tasks " == *" $t "* ]] && searches=$(( searches + 1 )); done
  [[ "${STUDY_DOWNSTREAM-x}" != "" && "${STUDY_DOWNSTREAM_VARIANTS:-}" == *_obs* ]] && per_lane=5120
  lanes=$(( mem / per_lane - searches * (${STUDY_SEARCH_PARALLEL:-4} - 1) ))
  (( lanes >= 1 )) || lanes=1
  echo "upstream study: at most $lanes lanes a GPU ($mem MiB; STUDY_MAX_LANES sets another limit, 0 none)" >&2
  echo "$lanes"
}
# how a lane starts run.py once its waits are over; with a lane limit, after taking one of its GPU's slots: the
# lock is on fd 9, which run.py and its children inherit, so the slot is free again when they have all ended
run_py="python run.py --resume"
max_lanes=${STUDY_MAX_LANES:-$(default_max_lanes)}
if ! [[ -z $max_lanes || $max_lanes =~ ^(0|[1-9][0-9]*)$ ]]; then
  echo "upstream_study.sh: STUDY_MAX_LANES must be a whole number (0: no limit), got '$max_lanes'" >&2
  exit 2
fi
if [ "${max_lanes:-0}" != 0 ]; then
  if ! command -v flock >/dev/null; then
    echo "upstream_study.sh: STUDY_MAX_LANES needs flock (util-linux), which this machine lacks" >&2
    exit 2
  fi
  mkdir -p "$root/.slots"
  slots=$(printf %q "$root/.slots")
  run_py="while :; do for i in \$(seq $max_lanes); do exec 9>$slots/gpu\$CUDA_VISIBLE_DEVICES.\$i; \
if flock -n 9; then break 2; fi; done; sleep 2; done; $run_py"
fi
# one process per lane (the GPU fast path would otherwise train a lane's seeds side by side): lanes are what
# this script shares the GPU by
common=(--data-dir "$data" --set "model.init_from=$minilm" --set train.dataloader_workers=0 \
  --set finetune.parallel_runs=1)
mkdir -p "$root/logs"
echo "upstream study: GPUs ${gpus[*]}, upstream runs: $upstreams, tasks: $tasks"

lane_count=0
# lane NAME COMMAND...: run COMMAND in the background on the next GPU, output appended to logs/NAME.log (a second
# invocation into the same root, whose lane finds the run finished or running, keeps the first one's log)
lane() {
  local name=$1 gpu=${gpus[$(( lane_count % ${#gpus[@]} ))]}; shift
  lane_count=$(( lane_count + 1 ))
  CUDA_VISIBLE_DEVICES=$gpu timeout $(( deadline - $(date +%s) )) bash -c "$*" >>"$root/logs/$name.log" 2>&1 &
}
# after FILE... -- EXPERIMENT ARGS...: once every FILE exists, run.py EXPERIMENT ARGS
after() {
  local waits=""
  while [ "$1" != "--" ]; do waits+="until [ -f $(printf %q "$1") ]; do sleep 5; done; "; shift; done
  shift
  printf '%s%s %s' "$waits" "$run_py" "$*"
}

up_root="$root/upstream"
for u in $upstreams; do
  lane "upstream$u" "$run_py minilm_upstream_sparse$u --output-dir $up_root ${common[*]} \
    --set kd.teacher=$minilm --set model.tokenizer=$minilm --set train.dataloader_workers=2 ${STUDY_UPSTREAM_SET:-}"
done

# family TASK: dense (3 seeds), downstream80 (seed 42), one transfer per upstream run
family() {
  local task=$1 dense set=() out="$root/$1" dir seeds=(--set finetune.num_runs=3)
  case $task in
    gap_mul|gap_concat) dense=minilm_$task dir=gap ;;
    squad_v1) dense=minilm_squad_v1 dir=squad_v1 ;;
    *) dense=minilm_glue dir=glue_$task set=(--set "finetune.glue_tasks=$task") seeds=() ;;
  esac
  local args="--output-dir $out ${common[*]} ${set[*]} ${STUDY_TASK_SET:-}"
  local teacher="$out/$dense/$dir/run0/DONE"
  lane "$task-dense" "$run_py $dense $args ${seeds[*]}"
  if [ "$dense" = minilm_glue ]; then
    for d in ${STUDY_DENSE_VARIANTS:-}; do lane "$task-dense$d" "$run_py $dense$d $args"; done
  fi
  if [[ " ${STUDY_DOWNSTREAM-$tasks} " == *" $task "* ]]; then
    for d in ${STUDY_DOWNSTREAM_VARIANTS:-_downstream80}; do
      lane "$task-${d#_}" "$(after "$teacher" -- "$dense$d $args --set finetune.runs_per_task={}")"
    done
  fi
  if [ "$dense" = minilm_glue ] && [[ " ${STUDY_SEARCH:-} " == *" $task "* ]]; then
    local up="$up_root/minilm_upstream_sparse$first_upstream"
    lane "$task-search" "$(after "$teacher" "$up/DONE" -- "--search ${dense}_from_upstream$first_upstream \
      --space ${STUDY_SEARCH_SPACE:-transfer} --trials ${STUDY_SEARCH_TRIALS:-8} --parallel ${STUDY_SEARCH_PARALLEL:-4} \
      $args --set model.init_from=$up --set kd.teacher=$out/$dense")"
  fi
  local variants v
  for u in $upstreams; do
    variants=("")  # the GLUE variants exist for one upstream run each (sparsebert/experiments/upstream.py)
    [ "$dense" = minilm_glue ] && [ "$u" = "$first_upstream" ] && variants+=(${STUDY_VARIANTS:-})
    for v in "${variants[@]}"; do
      transfer "$task" "$task-from$u$v" "${dense}_from_upstream$u$v" "$teacher" "$up_root/minilm_upstream_sparse$u" \
        "$out" "$dense" "$args ${seeds[*]}"
    done
  done
}
# transfer TASK LANE EXPERIMENT TEACHER_DONE UPSTREAM_DIR OUT DENSE ARGS: one lane, or one per seed
transfer() {
  local task=$1 name=$2 experiment=$3 teacher=$4 upstream=$5 out=$6 dense=$7 args=$8 seed
  local run="$experiment $args --set model.init_from=$upstream"
  if [ "${STUDY_SEED_LANES:-0}" = 1 ] && [ "$task" != sst2 ]; then
    for seed in 42 43 44; do
      lane "$name-s$seed" "$(after "$teacher" "$upstream/DONE" -- "$run --output-dir $out/seed$seed --set seed=$seed \
        --set finetune.num_runs=1 --set finetune.runs_per_task={} --set kd.teacher=$out/$dense")"
    done
  else
    lane "$name" "$(after "$teacher" "$upstream/DONE" -- "$run")"
  fi
}
for task in $tasks; do family "$task"; done
wait
