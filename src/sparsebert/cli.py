"""``sparsebert`` (also ``python -m sparsebert`` and ``python run.py``): list, show and run experiments in sequence,
with --set overrides; search hyperparameters; tables, plots, predictions and exports of finished runs."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparsebert.config import ConfigError, ExperimentRegistry
from sparsebert.console import configure_logging
from sparsebert.errors import SparseBertError, Terminated
from sparsebert.sigterm import terminate_on_sigterm

OUTPUT_ENV = "SPARSEBERT_OUTPUT"
log = logging.getLogger("sparsebert")


# The real defaults of flags that only some commands read. Their argparse default is None, so that one given to a
# command that ignores it can be told from one left out and refused (_refuse_flags_of_other_commands); the commands
# read them through flag_value(), which applies these, and --help shows them.
FLAG_DEFAULTS: dict[str, object] = {"format": "md", "agg": "max", "corpus": "wikipedia-enwiki-2015-wikiextractor",
                                    "corpus_format": "wikiextractor", "vocab_size": 30522}
# every flag that only some commands read (those above and others) -> those commands; given to another, refused
FLAG_COMMANDS: dict[str, tuple[str, ...]] = {
    "--format": ("--table", "--runs"), "--agg": ("--table",), "--out": ("--plot",),
    "--corpus": ("--train-tokenizer",), "--corpus-format": ("--train-tokenizer",),
    "--vocab-size": ("--train-tokenizer",), "--max-files": ("--train-tokenizer",),
    "--status": ("--runs",), "--to": ("--export",), "--compressed": ("--export",), "--onnx": ("--export",)}
# flags that, given without their command, lead to it (main's dispatch, in its order), which says what else it
# needs: the flags beside them are checked against that command, not against running experiments
LEADING_FLAGS = {"input": "--predict", "output": "--predict", "long_rows": "--predict", "sparse24_kernel": "--predict",
                 "to": "--export", "compressed": "--export", "onnx": "--export", "status": "--runs"}
# where a refused flag is likely taken for another one
FLAG_HINTS = {("--out", "--export"): " (--export writes to --to DIR)",
              ("--out", "--predict"): " (--predict writes to --output FILE)",
              ("--format", "--plot"): " (the suffix of --out picks the image format)"}


def flag_value(args: argparse.Namespace, dest: str) -> Any:
    """The value of a flag of FLAG_DEFAULTS (``dest`` as argparse names it): as given, else its real default."""
    value = getattr(args, dest)
    return FLAG_DEFAULTS[dest] if value is None else value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sparsebert",
        allow_abbrev=False,  # --gpu would pass for --gpus, which the relaunch under torchrun strips by its full name
        description="Run sparsebert experiments in sequence, e.g. sparsebert bert_100k sparse_80_rigl",
    )
    p.add_argument("experiments", nargs="*", metavar="NAME", help="experiments to run, in order")
    p.add_argument("--list", action="store_true",
                   help="list every experiment with a one-line description; with words (--list glue sparse80), "
                        "those whose names contain every word")
    p.add_argument("--keys", action="store_true",
                   help="list every experiment key --set accepts, with its type and default (an experiment's own "
                        "values: --show NAME)")
    p.add_argument("--show", metavar="NAME",
                   help="print experiment NAME as it would run (with --set), each value with its origin: the "
                        "experiment of its parent chain that set it, --set, or default")
    p.add_argument("--experiments", dest="experiment_paths", action="append", type=Path, default=[],
                   metavar="PATH",
                   help="add your own experiments to the built-in ones: a .py file (EXPERIMENTS, optionally "
                        "SEARCH_SPACES dicts), a .yaml/.yml file (name: settings) or a folder of them; they may "
                        "name a built-in parent, not reuse a built-in name (repeatable)")
    p.add_argument("--output-dir", type=Path, default=None,
                   help=f"output root (default: ${OUTPUT_ENV}, else runs/)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="data directory (default: $SPARSEBERT_DATA, else ./data if present, else the HF hub)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting, e.g. --set train.max_steps=1000 (repeatable)")
    p.add_argument("--resume", action="store_true", help="continue unfinished runs from their last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="delete an existing run directory and start over")
    p.add_argument("--profile", action="store_true",
                   help="write a torch.profiler trace of 3 training steps after 5 warm-up steps into the run dir "
                        "(on a GPU also the host-GPU syncs of the steps before them: profile/host_syncs.json)")
    p.add_argument("--table", choices=["glue"], help="print a results table from the registry in the output root")
    p.add_argument("--only", dest="table_experiments", nargs="+", default=None, metavar="NAME",
                   help="with --table: only these experiments (rows); with --plot: the runs to plot")
    p.add_argument("--plot", choices=["loss", "density"],
                   help="plot runs named by --only (paths under the output root): loss curves from "
                        "log_history.json (a finetuning run's epochs.json), or density per tensor from sparsity.json; "
                        "written to --out")
    p.add_argument("--out", type=Path, default=None, help="with --plot: the image file (default <kind>.png)")
    p.add_argument("--format", choices=["md", "csv", "latex"],
                   help=f"with --table or --runs (default {FLAG_DEFAULTS['format']})")
    p.add_argument("--agg", choices=["max", "mean"],
                   help="with --table: how runs of one task with different seeds combine "
                        f"(default {FLAG_DEFAULTS['agg']})")
    p.add_argument("--runs", action="store_true",
                   help="list every run in the registry of the output root: status, headline metric, wall time")
    p.add_argument("--status", choices=["running", "done", "failed"], help="with --runs: only runs in this status")
    p.add_argument("--export", metavar="RUN",
                   help="copy the model of a finished run (a path under the output root, e.g. "
                        "EXPERIMENT/glue_rte/run0, or a run directory) to --to DIR")
    p.add_argument("--to", type=Path, metavar="DIR", help="with --export: the new model directory")
    p.add_argument("--compressed", action="store_true",
                   help="with --export: store mostly-zero tensors as bitmask + values, with their reader beside "
                        "them: from_pretrained(DIR, trust_remote_code=True) loads it")
    p.add_argument("--onnx", action="store_true",
                   help="with --export: add model.onnx, kept only if ONNX Runtime (CPU) matches PyTorch to 1e-4 "
                        "(pip install sparsebert[onnx])")
    p.add_argument("--gpus", metavar="N|IDS",
                   help="use the N least busy GPUs of this node (NVML), or these ids (e.g. 0,3); with more than "
                        "one, sparsebert restarts under torchrun with one process per GPU")
    p.add_argument("--train-tokenizer", type=Path, metavar="OUT_DIR",
                   help="train a WordPiece vocab on the corpus of --corpus (under --data-dir) and save it to OUT_DIR")
    p.add_argument("--corpus",
                   help="with --train-tokenizer: corpus path under the data directory (or absolute; default "
                        f"{FLAG_DEFAULTS['corpus']})")
    p.add_argument("--corpus-format", choices=["wikiextractor", "text"],
                   help="with --train-tokenizer: WikiExtractor <doc> files, or plain text with blank lines between "
                        f"documents (default {FLAG_DEFAULTS['corpus_format']})")
    p.add_argument("--vocab-size", type=int,
                   help=f"with --train-tokenizer (default {FLAG_DEFAULTS['vocab_size']})")
    p.add_argument("--max-files", type=int, default=None, help="with --train-tokenizer: read only N files")
    p.add_argument("--search", metavar="NAME",
                   help="hyperparameter search over experiment NAME with --space and --trials; run again to resume "
                        "(see src/sparsebert/search/)")
    p.add_argument("--space", help="with --search: the search space (SEARCH_SPACES of an experiments module)")
    p.add_argument("--trials", type=int, metavar="N",
                   help="with --search: the complete trials the study should hold (those it has count)")
    p.add_argument("--metric", metavar="KEY",
                   help="with --search: what to optimize: headline (finetuning default), TASK/METRIC (e.g. "
                        "glue:rte/accuracy), or a pretraining metrics.json key (default eval_loss)")
    p.add_argument("--direction", choices=["max", "min"],
                   help="with --search: default min for losses and perplexity, else max")
    p.add_argument("--parallel", type=int, metavar="P",
                   help="with --search: trials at once, each on one GPU (default: one per visible GPU; 1 on CPU)")
    p.add_argument("--study", metavar="NAME",
                   help="with --search: the study, in <output root>/search/NAME (default EXPERIMENT-SPACE)")
    p.add_argument("--predict", metavar="RUN",
                   help="predict --input with a finished finetuning run (its directory, or its path under the "
                        "output root, e.g. minilm_glue/glue_rte/run0) in the task's own output format")
    p.add_argument("--input", type=Path, metavar="FILE",
                   help="with --predict: the file to predict (the task's format; labels optional: metrics if present)")
    p.add_argument("--output", type=Path, metavar="FILE",
                   help="with --predict: the predictions file (default <run>/predict/<input stem>.<ext>)")
    p.add_argument("--long-rows", choices=["truncate", "skip", "error"], default=None,
                   help="with --predict of a GAP run: a row whose pronoun and names do not fit one window is "
                        "truncated around them (default: a submission needs every ID), left out, or an error")
    p.add_argument("--sparse24-kernel", action="store_true",
                   help="with --predict of a 2:4 run: its sparse encoder Linears through our CUTLASS 2:4 kernel, "
                        "in bf16 (an sm90 GPU; build once with python -m sparsebert.kernels.build)")
    p.add_argument("--run-name", default=None, help=argparse.SUPPRESS)  # a search trial's run directory
    return p


def output_root(explicit: Path | None) -> Path:
    if explicit is not None:
        return explicit
    return Path(os.environ.get(OUTPUT_ENV) or "runs")


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (without the program name; default ``sys.argv[1:]``); returns the exit status.

    A reader that closes the pipe early (``run.py --list | head -1``) ends the output quietly, with the status a
    process killed by SIGPIPE has (as ``yes | head`` does), instead of a BrokenPipeError traceback; Ctrl-C ends
    with one line and the status of SIGINT."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, not at interpreter exit: a closed pipe fails this write where it is caught
        return status
    except BrokenPipeError:
        _discard_stdout()
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:  # Ctrl-C: the run has recorded itself interrupted; a traceback would add nothing
        print("\nerror: interrupted (Ctrl-C)", file=sys.stderr)
        return 128 + signal.SIGINT


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not hit the closed pipe again (the
    recipe of Python's signal docs, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def log_level() -> int:
    """INFO on the job's main process, WARNING on the others: N ranks would print every INFO line N times."""
    from sparsebert.distributed import global_rank

    return logging.INFO if global_rank() == 0 else logging.WARNING


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    configure_logging(log_level())
    try:
        registry = load_registry(args)
        if args.search:
            with terminate_on_sigterm() as raise_if_terminated:  # stops the trials: they record themselves failed
                return search(args, registry, raise_if_terminated)
        _refuse_search_flags(args)
        _refuse_what_the_command_ignores(args)
        if args.predict or args.input or args.output or args.sparse24_kernel or args.long_rows:
            return predict(args)
        if args.gpus and "LOCAL_RANK" not in os.environ:
            return choose_gpus(args.gpus, argv)
        if args.train_tokenizer:
            return train_tokenizer(args)
        if args.export or args.to or args.compressed or args.onnx:
            return export(args)
        if args.runs or args.status:
            return list_runs(args)
        if args.table:
            return print_table(output_root(args.output_dir), args.table_experiments, flag_value(args, "format"),
                               flag_value(args, "agg"))
        if args.plot:
            return make_plot(output_root(args.output_dir), args.plot, args.table_experiments,
                             args.out or Path(f"{args.plot}.png"))
        if args.show:
            return show_experiment(registry, args)
        if args.keys:
            if args.experiments:  # the schema's reference names no experiment; --show prints one's values
                raise ConfigError(f"--keys lists the keys of every experiment; for {args.experiments[0]}'s own "
                                  f"values use --show {args.experiments[0]}")
            return print_keys()
        if args.list:
            return list_experiments(registry, args.experiments)
        if not args.experiments:
            print("sparsebert: name at least one experiment (sparsebert --list shows them)", file=sys.stderr)
            return 2
        # build every experiment first: a typo in the third name must not surface after two long runs
        configs = [registry.build(name, args.overrides) for name in args.experiments]
        if args.run_name:
            if len(configs) != 1:
                raise ConfigError("--run-name names the run of one experiment")
            check_run_name_flag(args.run_name)
            configs = [dataclasses.replace(configs[0], name=args.run_name)]
        from sparsebert.data.paths import resolve_data_dir

        data_dir = resolve_data_dir(args.data_dir)  # before the runner's imports (seconds): a wrong path fails at once
        from sparsebert.console import quiet_progress_bars

        quiet_progress_bars()
        from sparsebert.runner import RunOptions, run_experiment

        opts = RunOptions(output_root=output_root(args.output_dir), data_dir=data_dir, resume=args.resume,
                          overwrite=args.overwrite)
        from sparsebert.trainer.termination import StopWhenTerminated

        with terminate_on_sigterm() as raise_if_terminated:
            for cfg in configs:
                log.info("running %s -> %s", cfg.name, opts.output_root / cfg.name)
                callbacks = [StopWhenTerminated(raise_if_terminated)]
                if args.profile:
                    from sparsebert.trainer.profiling import ProfilerCallback

                    callbacks.append(ProfilerCallback())
                metrics = run_experiment(cfg, opts, callbacks=callbacks)
                if metrics is not None and _is_main_process():  # one line per job, not one per rank
                    log.info("%s finished: %s", cfg.name, _headline(metrics))
                raise_if_terminated()  # a SIGTERM swallowed after the run's last step: no next run, exit 143
        return 0
    except (ConfigError, SparseBertError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Terminated as e:
        print(f"error: {e}", file=sys.stderr)
        return 128 + signal.SIGTERM


def _is_main_process() -> bool:
    from sparsebert.distributed import process_state

    return process_state().is_main_process


def predict(args: argparse.Namespace) -> int:
    """``--predict RUN --input FILE [--output FILE]``: write the predictions, print the metrics of a labelled file."""
    if not args.predict:
        given = [flag for flag, value in (("--input", args.input), ("--output", args.output),
                                          ("--sparse24-kernel", args.sparse24_kernel),
                                          ("--long-rows", args.long_rows)) if value]
        raise ConfigError(f"{' and '.join(given)} {'goes' if len(given) == 1 else 'go'} with --predict RUN")
    if args.input is None:
        raise ConfigError("--predict needs --input FILE: the file to predict")
    if args.experiments:
        raise ConfigError(f"--predict runs no experiment; drop {' '.join(args.experiments)}")
    from sparsebert.console import quiet_progress_bars
    from sparsebert.predict import predict as run_predict

    quiet_progress_bars()

    result = run_predict(args.predict, args.input, args.output, output_root(args.output_dir),
                         sparse24_kernel=args.sparse24_kernel, overrides=args.overrides, long_rows=args.long_rows)
    if result.kernel_layers is not None:
        print(f"2:4 kernel: {len(result.kernel_layers)} Linear layers converted (bf16)")
    for path in result.written:
        print(f"wrote {path}")
    if result.metrics is not None:
        shown = {k: v for k, v in result.metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        print("metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()))
    return 0


SEARCH_FLAGS = ("space", "trials", "metric", "direction", "parallel", "study")


def check_run_name_flag(name: str) -> None:
    """``--run-name NAME``: a search trial's run name, or one a run directory of its own may have (see
    :func:`~sparsebert.config.experiment_registry.check_run_name`: ``--overwrite`` deletes that directory)."""
    # (not from search/: that imports optuna, which a run needs not have)
    from sparsebert.config.experiment_registry import TRIAL_RUN_NAME, check_run_name

    if not TRIAL_RUN_NAME.fullmatch(name):
        check_run_name(name, f"--run-name {name}")


def _refuse_what_the_command_ignores(args: argparse.Namespace) -> None:
    """Refuse arguments that the command given (--runs, --table, --export, ...; none: running experiments) would
    silently ignore: the user would believe they filtered or changed something. (--search checks its own.)"""
    given = [flag for flag, value in (("--predict", args.predict), ("--train-tokenizer", args.train_tokenizer),
                                      ("--export", args.export), ("--runs", args.runs), ("--table", args.table),
                                      ("--plot", args.plot), ("--show", args.show), ("--keys", args.keys),
                                      ("--list", args.list)) if value]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} are separate commands; give one at a time")
    command = given[0] if given else None
    _refuse_flags_of_other_commands(args, command)
    if command is None:
        if args.resume and args.overwrite:
            raise ConfigError("--resume continues an unfinished run and --overwrite deletes it to start over; "
                              "give one")
        if args.table_experiments is not None:
            raise ConfigError("--only goes with --table or --plot; to run experiments, name them without --only")
        return
    run_flags = [flag for flag, value in (("--resume", args.resume), ("--overwrite", args.overwrite),
                                          ("--profile", args.profile), ("--run-name", args.run_name),
                                          ("--gpus", args.gpus)) if value]
    if run_flags:
        raise ConfigError(f"{' and '.join(run_flags)} {'goes' if len(run_flags) == 1 else 'go'} with running "
                          f"experiments, not with {command}; drop {' '.join(run_flags)}")
    if args.overrides and command not in ("--predict", "--show"):
        raise ConfigError(f"{command} takes no --set (it changes the experiment you run, --show or --predict with); "
                          f"drop --set {' --set '.join(args.overrides)}")
    if args.table_experiments is not None and command not in ("--table", "--plot"):
        hint = " (it lists every run; --status picks those of one status)" if command == "--runs" else ""
        raise ConfigError(f"--only goes with --table or --plot, not {command}{hint}")
    if args.experiments and command in ("--train-tokenizer", "--export", "--runs", "--table", "--plot"):
        hint = {"--table": " (--only NAME ... picks its rows)", "--plot": " (--only RUN ... names the runs to plot)"}
        raise ConfigError(f"{command} runs no experiment; drop {' '.join(args.experiments)}{hint.get(command, '')}")


def _refuse_flags_of_other_commands(args: argparse.Namespace, command: str | None) -> None:
    """Refuse a flag of FLAG_COMMANDS given to a command that does not read it (None: running experiments), e.g.
    ``--vocab-size`` without --train-tokenizer: it would change nothing, silently."""
    if command is None:
        command = next((led for dest, led in LEADING_FLAGS.items() if getattr(args, dest)), None)
    ignored = [(flag, value) for flag, commands in FLAG_COMMANDS.items()
               if (value := getattr(args, flag[2:].replace("-", "_"))) not in (None, False) and command not in commands]
    if not ignored:
        return
    goes = " and ".join(f"{flag} {'goes ' if i == 0 else ''}with {' or '.join(FLAG_COMMANDS[flag])}"
                        for i, (flag, _) in enumerate(ignored))
    hint = "".join(FLAG_HINTS.get((flag, command), "") for flag, _ in ignored)
    raise ConfigError(f"{goes}, not with {command or 'running experiments'}{hint}; "
                      f"drop {' '.join(flag if value is True else f'{flag} {value}' for flag, value in ignored)}")


def _refuse_search_flags(args: argparse.Namespace) -> None:
    given = [f"--{name}" for name in SEARCH_FLAGS if getattr(args, name) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: only with --search EXPERIMENT")


def load_registry(args: argparse.Namespace) -> ExperimentRegistry:
    """The built-in experiments and those of ``--experiments PATH ...``."""
    paths = [path.resolve() for path in args.experiment_paths]  # a trial or torchrun worker may run elsewhere
    missing = [path for path in args.experiment_paths if not path.exists()]
    if missing and (args.table or args.plot):  # --experiments named --table/--plot's rows before it was --only
        raise ConfigError(f"--experiments {missing[0]}: no such file or folder (--table and --plot take their "
                          "experiments or runs with --only NAME ...)")
    return ExperimentRegistry.builtin(paths)


def show_experiment(registry: ExperimentRegistry, args: argparse.Namespace) -> int:
    """``--show NAME [--set ...]``: every setting of the experiment as built, with its origin (see
    :meth:`ExperimentRegistry.origins`): first those its parent chain or --set set, then the schema defaults."""
    if args.experiments:
        raise ConfigError(f"--show prints one experiment and runs none; drop {' '.join(args.experiments)}")
    print(format_experiment(registry, args.show, args.overrides))
    return 0


def format_experiment(registry: ExperimentRegistry, name: str, overrides: list[str]) -> str:
    """The text of ``--show``: a header (name, file, parents, description), then one ``key  value  origin`` row
    per setting, the set ones before the defaults."""
    from sparsebert.config import to_dict
    from sparsebert.config.experiment_registry import DEFAULT_ORIGIN, origin_of

    cfg = registry.build(name, overrides)  # validates: a bad --set fails before anything prints
    origins = registry.origins(name, overrides)
    rows = [(key, value, origin_of(origins, key)) for key, value in _flat_settings(to_dict(cfg), type(cfg))
            if key not in ("name", "description")]
    base = name.partition("=")[0]
    lines = [f"{cfg.name}: {cfg.description}" if cfg.description else cfg.name,
             f"  defined in {registry.origin(base)}",
             f"  parents: {' <- '.join(registry.parents(base))}"]
    width = max(len(key) for key, _, _ in rows)
    set_rows = [(key, repr(value), origin) for key, value, origin in rows if origin != DEFAULT_ORIGIN]
    value_width = min(max((len(value) for _, value, _ in set_rows), default=0), 24)  # a long mapping: ragged
    lines.append("set by the experiment, its parents or --set:")
    lines += [f"  {key:<{width}}  {value:<{value_width}}  <- {origin}" for key, value, origin in set_rows]
    lines.append("defaults:")
    lines += [f"  {key:<{width}}  {value!r}" for key, value, origin in rows if origin == DEFAULT_ORIGIN]
    before = {key: value for key, value, _ in rows}
    return "\n".join(lines + _gpu_fast_path_changes(cfg, before, width))


def _gpu_fast_path_changes(cfg, before: dict[str, object], width: int) -> list[str]:
    """The rows ``finetune.gpu_fast_path`` changes when the run starts on a GPU (none where it is off), against
    ``before``, the experiment's settings as written (--show's rows; the run directory's config.json: what ran)."""
    from sparsebert.config import to_dict
    from sparsebert.jobs.finetune.fast_path import GIB_PER_RUN, GPU_RUNS_AT_ONCE, with_gpu_fast_path

    if not cfg.finetune.gpu_fast_path:
        return []
    gpu = with_gpu_fast_path(cfg, on_gpu=True, runs_at_once=GPU_RUNS_AT_ONCE)
    after = dict(_flat_settings(to_dict(gpu), type(cfg)))
    lines = ["on a GPU, finetune.gpu_fast_path makes these (the run's config.json records what ran):"]
    for key, value in after.items():
        if key in before and value != before[key] and key != "finetune.gpu_fast_path":
            # unset runs at once resolve on the machine (fast_path.gpu_runs_at_once): the rule, not a number
            shown = (f"up to {GPU_RUNS_AT_ONCE} per GPU (one per {GIB_PER_RUN} GiB), at most one per CPU core; 1 "
                     "under torchrun or --profile" if key == "finetune.parallel_runs" else repr(value))
            lines.append(f"  {key:<{width}}  {before[key]!r} -> {shown}")
    return lines


def _flat_settings(data: dict, schema: type, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value) of every setting in ``data`` (a config's plain form), sections walked into."""
    from sparsebert.config.experiment_registry import section_type

    rows: list[tuple[str, object]] = []
    for key, value in data.items():
        section = section_type(schema, key)
        if section is not None and isinstance(value, dict):
            rows += _flat_settings(value, section, f"{prefix}{key}.")
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


def list_experiments(registry: ExperimentRegistry, words: list[str]) -> int:
    """``--list [WORD ...]``: every experiment, or those whose names contain every word, with its description."""
    names = [name for name in registry.names() if all(word in name for word in words)]
    if not names:
        raise ConfigError(f"no experiment name contains {' and '.join(map(repr, words))} (--list shows them all)")
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {registry.description(name)}")
    return 0


def search(args: argparse.Namespace, registry: ExperimentRegistry, raise_if_terminated: Callable[[], None]) -> int:
    """``--search``: check the request in full, then run the study's missing trials (see sparsebert.search)."""
    if args.experiments:
        raise ConfigError(f"--search runs one experiment, named by --search; drop {' '.join(args.experiments)}")
    clashing = [flag for flag, given in (("--overwrite", args.overwrite), ("--profile", args.profile),
                                         ("--table", args.table), ("--plot", args.plot), ("--list", args.list),
                                         ("--train-tokenizer", args.train_tokenizer)) if given]
    if clashing:  # --resume needs no refusal: a search always resumes
        raise ConfigError(f"{', '.join(clashing)} cannot be combined with --search")
    _refuse_flags_of_other_commands(args, "--search")
    if args.space is None or args.trials is None:
        raise ConfigError("--search needs --space SPACE and --trials N")
    if args.gpus:
        _use_gpus(args.gpus)  # the trials share out these GPUs; no torchrun relaunch
    from sparsebert.data.paths import resolve_data_dir
    from sparsebert.search import plan_search, run_search

    plan = plan_search(registry, args.search, args.space, args.trials, output_root=output_root(args.output_dir),
                       data_dir=resolve_data_dir(args.data_dir),
                       experiment_paths=[path.resolve() for path in args.experiment_paths],
                       overrides=args.overrides, metric=args.metric, direction=args.direction,
                       parallel=args.parallel, study=args.study)
    summary = run_search(plan, raise_if_terminated)
    print(f"summary: {plan.study_dir / 'summary.md'}")
    print(f"best: trial {summary['best_trial']}, {summary['metric']} = {summary['best_value']:.4g}: "
          f"{summary['best_command']}")
    return 0


def _use_gpus(spec: str) -> list[int]:
    """Choose the GPUs of ``--gpus SPEC`` and make them the visible ones (before CUDA starts)."""
    from sparsebert.distributed.gpus import allowed_gpus, pick_gpus, query_gpus

    ids = pick_gpus(spec, allowed_gpus(query_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES")))
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's numbering = NVML's, which chose the ids
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
    log.info("--gpus %s: using GPU(s) %s", spec, os.environ["CUDA_VISIBLE_DEVICES"])
    return ids


def choose_gpus(spec: str, argv: list[str]) -> int:
    """Set CUDA_VISIBLE_DEVICES before CUDA starts; one GPU continues here, several restart under torchrun with the
    same arguments (``--experiments`` included: torchrun's workers start in this cwd)."""
    from sparsebert.distributed.gpus import torchrun_command, without_gpus_flag

    ids = _use_gpus(spec)
    if len(ids) == 1:
        return main(without_gpus_flag(argv))
    # torchrun takes this process's place, so a signal to the job (a scheduler's SIGTERM) reaches torchrun and
    # through it the workers, instead of leaving them running behind a parent that exited
    cmd = torchrun_command(sys.argv[0], argv, len(ids))
    os.execv(cmd[0], cmd)
    return 1  # not reached


def print_keys() -> int:
    from sparsebert.config import ExperimentConfig
    from sparsebert.config.schema import all_keys

    rows = [row for row in all_keys(ExperimentConfig) if row[0] not in ("name", "description")]
    width = max(len(key) for key, _, _ in rows)
    for key, type_name, default in rows:
        print(f"{key:<{width}}  {type_name:<22}  {default!r}")
    return 0


def train_tokenizer(args: argparse.Namespace) -> int:
    from sparsebert.data.corpus import corpus_files
    from sparsebert.data.paths import HOW_TO_POINT, resolve_data_dir
    from sparsebert.data.tokenizer import train_wordpiece

    corpus = Path(flag_value(args, "corpus"))
    if not corpus.is_absolute():
        data_dir = resolve_data_dir(args.data_dir)
        if data_dir is None:
            raise SparseBertError(f"no data directory for corpus '{corpus}'; {HOW_TO_POINT}")
        corpus = data_dir / corpus
    files = corpus_files(corpus, args.max_files)
    tok = train_wordpiece(files, flag_value(args, "corpus_format"), args.train_tokenizer,
                          vocab_size=flag_value(args, "vocab_size"))
    print(f"trained a {len(tok)}-token WordPiece vocab on {len(files)} files -> {args.train_tokenizer} "
          f"(use it with --set model.tokenizer={args.train_tokenizer})")
    return 0


def export(args: argparse.Namespace) -> int:
    """``--export RUN --to DIR [--compressed | --onnx]``: see :mod:`sparsebert.export`."""
    if not args.export or args.to is None:
        raise SparseBertError("--export RUN and --to DIR go together (--compressed and --onnx only with them)")
    from sparsebert.console import quiet_progress_bars
    from sparsebert.export import export_run
    from sparsebert.export.model_dir import against_plain_export

    quiet_progress_bars()  # transformers' weight-loading bar, not a run's
    summary = export_run(args.export, output_root(args.output_dir), args.to, args.compressed, args.onnx)
    if args.compressed:
        # the whole directory against the plain export's: config, tokenizer and card weigh the same in both
        print(f"exported {summary['run']} -> {args.to} ({len(summary['compressed_tensors'])} of "
              f"{summary['tensors']} tensors compressed, weights {summary['dense_bytes'] / 1e6:.2f} MB -> "
              f"{summary['packed_bytes'] / 1e6:.2f} MB; whole directory {summary['plain_dir_bytes'] / 1e6:.2f} MB "
              f"-> {summary['dir_bytes'] / 1e6:.2f} MB, "
              f"{against_plain_export(summary['plain_dir_bytes'], summary['dir_bytes'])}; load with "
              "from_pretrained(DIR, trust_remote_code=True))")
    else:
        onnx = (f"; model.onnx matches PyTorch in ONNX Runtime to {summary['onnx_max_abs_diff']:.1e}"
                if "onnx_max_abs_diff" in summary else "")
        print(f"exported {summary['run']} -> {args.to} ({summary['dir_bytes'] / 1e6:.2f} MB; load with "
              f"from_pretrained{onnx})")
    return 0


def list_runs(args: argparse.Namespace) -> int:
    """``--runs [--status S] [--format md|csv|latex]``: every run in the registry, oldest first."""
    from sparsebert.results import REGISTRY_FILENAME, RunRegistry
    from sparsebert.results.run_list import runs_table

    if not args.runs:
        raise SparseBertError("--status goes with --runs")
    root = output_root(args.output_dir)
    if not (root / REGISTRY_FILENAME).is_file():
        raise SparseBertError(f"no results registry at {root / REGISTRY_FILENAME}: run an experiment first, or "
                              "point --output-dir at the output root that holds it")
    records = RunRegistry.in_output_root(root, read_only=True).runs(status=args.status)
    print(runs_table(records, root, flag_value(args, "format")))
    return 0


def print_table(root: Path, experiments: list[str] | None, fmt: str, agg: str) -> int:
    from sparsebert.results import REGISTRY_FILENAME, RunRegistry, glue_table

    if not (root / REGISTRY_FILENAME).is_file():
        raise SparseBertError(f"no results registry at {root / REGISTRY_FILENAME}: run a finetuning experiment "
                              "first, or point --output-dir at the output root that holds it")
    records = RunRegistry.in_output_root(root, read_only=True).runs(experiments=experiments, task_prefix="glue:")
    if not records:
        raise SparseBertError(f"the registry in {root} has no finished GLUE runs"
                              + (f" of {', '.join(experiments)}" if experiments else ""))
    missing = [name for name in experiments or [] if name not in {r.experiment for r in records}]
    if missing:  # a misspelled name would otherwise just leave its row out
        raise SparseBertError(f"the registry in {root} has no finished GLUE runs of {', '.join(missing)}")
    print(glue_table(records, agg=agg, fmt=fmt))
    return 0


# file(s) each plot reads, the first present of a run, and what kind of run writes them
PLOT_INPUTS = {"loss": (("log_history.json", "epochs.json"), "pretraining or finetuning"),
               "density": (("sparsity.json",), "sparse")}
PLOT_FORMATS = ("png", "pdf", "svg")


def loss_title(root: Path, runs: list[str]) -> str:
    """What the loss of these runs is: an upstream run's is its layers' distance to the teacher, not MLM."""
    import json

    tasks = set()
    for run in runs:
        config = root / run / "config.json"
        tasks.add(json.loads(config.read_text()).get("task", "mlm") if config.is_file() else "mlm")
    if tasks == {"upstream"}:
        return "distance to the teacher's layers (task upstream)"
    return "MLM loss" if tasks == {"mlm"} else "loss"


def make_plot(root: Path, kind: str, runs: list[str] | None, out: Path) -> int:
    import json

    from sparsebert.results.plots import plot_density_per_layer, plot_loss_curves

    if not runs:
        raise SparseBertError(f"--plot {kind} needs --only: the runs to plot, as paths under {root}")
    if out.suffix.lower().lstrip(".") not in PLOT_FORMATS:
        raise SparseBertError(f"--out {out}: the name must end in one of .{', .'.join(PLOT_FORMATS)} "
                              "(it picks the image format)")
    if not out.parent.is_dir():
        raise SparseBertError(f"--out {out}: the folder {out.parent} does not exist")
    filenames, writer = PLOT_INPUTS[kind]
    data = {}
    for run in runs:
        source = next((root / run / name for name in filenames if (root / run / name).is_file()), None)
        if source is None:
            raise SparseBertError(f"--plot {kind}: {root / run / filenames[0]} does not exist "
                                  + (f"(nor {filenames[1]}) " if len(filenames) > 1 else "")
                                  + f"(a finished {writer} run writes it)")
        try:
            data[run] = json.loads(source.read_text())
        except json.JSONDecodeError as e:
            raise SparseBertError(f"--plot {kind}: {source} is not valid JSON ({e})") from None
        shape_ok = (isinstance(data[run], list) if kind == "loss"
                    else isinstance(data[run], dict) and isinstance(data[run].get("layers"), list))
        if not shape_ok:
            raise SparseBertError(f"--plot {kind}: {source} is not what a {writer} run writes "
                                  + ("(a list of log entries)" if kind == "loss" else "(no 'layers' list)"))
        if source.name == "epochs.json":  # a finetuning run from before log_history.json: one row per epoch
            data[run] = [{"epoch": row["epoch"], **({"loss": row["train_loss"]} if "train_loss" in row else {}),
                          **({"eval_loss": row["eval_loss"]} if "eval_loss" in row else {})}
                         for row in data[run] if isinstance(row, dict) and "epoch" in row]
    try:
        if kind == "loss":
            # optimizer steps where every run has them; epochs where a run only has its epochs.json rows
            x = "step" if all(any("step" in h for h in history) for history in data.values()) else "epoch"
            plot_loss_curves(data, out, title=loss_title(root, runs), x=x)
        else:
            plot_density_per_layer(data, out)
    except OSError as e:
        raise SparseBertError(f"--plot {kind}: cannot write {out}: {e.strerror or e}") from None
    print(f"wrote {out}")
    return 0


def _headline(metrics: dict) -> str:
    keys = ("eval_loss", "perplexity", "masked_accuracy", "train_samples_per_second")
    if any(k in metrics for k in keys):
        return ", ".join(f"{k}={metrics[k]:.4g}" for k in keys if isinstance(metrics.get(k), int | float))
    headline = []  # finetuning: the main metric of each task, mean over its runs
    for task, summary in metrics.items():
        for key in ("score", "f1", "accuracy", "matthews_corr"):
            if isinstance(summary, dict) and key in summary:
                headline.append(f"{task} {key}={summary[key]['mean']:.4g}")
                break
    return ", ".join(headline)


if __name__ == "__main__":  # python -m sparsebert.cli, as before python -m sparsebert
    sys.exit(main())
