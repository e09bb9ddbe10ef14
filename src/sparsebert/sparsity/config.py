"""Typed config sections for sparse training: which weights, how sparse, and how masks evolve.

Each section validates itself so a misconfiguration fails at startup with a one-line ``ValueError`` that
names the offending key, instead of deep inside a training run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Encoder Linear weights of a Hugging Face BERT. ``(^|\.)`` lets the same patterns match a bare ``BertModel``
# (no prefix), task models (``bert.`` prefix) and wrapped models (``module.`` prefix).
DEFAULT_INCLUDE: tuple[str, ...] = (
    r"(^|\.)encoder\.layer\.\d+\.attention\.self\.(query|key|value)\.weight$",
    r"(^|\.)encoder\.layer\.\d+\.attention\.output\.dense\.weight$",
    r"(^|\.)encoder\.layer\.\d+\.intermediate\.dense\.weight$",
    r"(^|\.)encoder\.layer\.\d+\.output\.dense\.weight$",
)
WORD_EMBEDDINGS_PATTERN = r"(^|\.)embeddings\.word_embeddings\.weight$"
MLM_HEAD_PATTERN = r"(^|\.)predictions\.transform\.dense\.weight$"

DISTRIBUTIONS = ("uniform", "erk", "explicit")
MASK_INITS = ("random", "magnitude", "zeros")
DROP_SCHEDULES = ("cosine", "constant")
GROW_INITS = ("zeros", "normal")
GROW_SECOND_MOMENTS = ("zeros", "layer_mean")
PRUNING_SCORES = ("magnitude", "movement", "obs")
PATTERNS = ("unstructured", "2:4")
TWO_FOUR_INITS = ("magnitude", "zeros")


@dataclass
class SparsityConfig:
    """Which weights are sparse and how sparse each one is."""

    sparsity: float = 0.8
    """Overall target sparsity over the selected weights, in [0, 1)."""
    distribution: str = "uniform"
    """How the overall target is split across layers: "uniform", "erk" (Erdős–Rényi-Kernel) or "explicit"."""
    per_layer: dict[str, float] | None = None
    """For "explicit": regex on the parameter name -> sparsity; first match wins; every selected layer must match."""
    include: list[str] = field(default_factory=lambda: list(DEFAULT_INCLUDE))
    """Regexes (``re.search``) selecting the sparse weights; by default the BERT encoder Linear weights."""
    exclude: list[str] = field(default_factory=list)
    """Regexes; a parameter matching any of them is never sparse."""
    include_embeddings: bool = False
    """Also make the word embeddings sparse (the tied MLM decoder shares them)."""
    include_mlm_head: bool = False
    """Also make the MLM head transform dense layer sparse."""
    init: str = "random"
    """Initial mask: "random" (seeded), "magnitude" (keep the largest |w|, for a pretrained start), or "zeros"
    (active where the weight is non-zero: keep the masks of an exported sparse model while finetuning it)."""
    rescale_init: bool = False
    """With init "random" (training from scratch): multiply each layer's kept weights by 1/sqrt(density), so a unit
    of a sparse layer starts with the pre-activation variance of the dense init (the sparse-aware init of Evci et
    al. 2022, "Gradient flow in sparse neural networks"). Without it an 80 %-sparse layer starts with 1/5 of the
    dense variance, and attention scores (a product of two such layers) with 1/25."""
    pattern: str = "unstructured"
    """"unstructured" (any weight may be pruned) or "2:4" (semi-structured: in every group of 4 consecutive
    weights along a row, i.e. the input dimension, exactly 2 are kept, which sparse tensor cores of sm80+ GPUs
    run ~2x faster). "2:4" needs sparsity 0.5, distribution "uniform", init "magnitude" or "zeros", and masks
    that stay fixed (no rigl/gmp)."""

    def validate(self) -> None:
        _check_fraction("sparsity.sparsity", self.sparsity)
        _check_choice("sparsity.distribution", self.distribution, DISTRIBUTIONS)
        _check_choice("sparsity.init", self.init, MASK_INITS)
        _check_choice("sparsity.pattern", self.pattern, PATTERNS)
        if self.rescale_init and self.init != "random":
            raise ValueError(f'sparsity.rescale_init rescales a random init for training from scratch: it needs '
                             f'sparsity.init "random", got {self.init!r} (a pretrained start keeps its weights)')
        if self.pattern == "2:4":
            if self.sparsity != 0.5:
                raise ValueError(
                    f'sparsity.sparsity must be 0.5 with sparsity.pattern "2:4" (2:4 keeps exactly half), '
                    f"got {self.sparsity!r}"
                )
            if self.distribution != "uniform":
                raise ValueError(
                    f'sparsity.distribution must be "uniform" with sparsity.pattern "2:4" (every layer keeps '
                    f'exactly half), got "{self.distribution}"'
                )
            if self.init not in TWO_FOUR_INITS:
                raise ValueError(
                    f'sparsity.init must be one of {", ".join(TWO_FOUR_INITS)} with sparsity.pattern "2:4" '
                    f"(a random 2:4 mask throws away the weights that matter), got {self.init!r}"
                )
        if self.distribution == "explicit":
            if not self.per_layer:
                raise ValueError(
                    'sparsity.per_layer must map regex -> sparsity when sparsity.distribution is "explicit"'
                )
            for pattern, value in self.per_layer.items():
                _check_regex("sparsity.per_layer", pattern)
                _check_fraction(f"sparsity.per_layer[{pattern!r}]", value)
        elif self.per_layer is not None:
            raise ValueError(
                f'sparsity.per_layer is only used with sparsity.distribution "explicit", got "{self.distribution}"'
            )
        if not isinstance(self.include, (list, tuple)):
            raise ValueError(f"sparsity.include must be a list of regexes, got {type(self.include).__name__}")
        if not isinstance(self.exclude, (list, tuple)):
            raise ValueError(f"sparsity.exclude must be a list of regexes, got {type(self.exclude).__name__}")
        if not self.include and not self.include_embeddings and not self.include_mlm_head:
            raise ValueError(
                "sparsity.include is empty and no embeddings/head are included: nothing would be sparse"
            )
        for pattern in self.include:
            _check_regex("sparsity.include", pattern)
        for pattern in self.exclude:
            _check_regex("sparsity.exclude", pattern)


@dataclass
class RigLConfig:
    """Rigged Lottery (Evci et al. 2020): periodically drop small weights and regrow where gradients are large."""

    update_freq: int = 100
    """Optimizer steps between mask updates."""
    begin_step: int = 0
    end_step: int | None = None
    """Last step (exclusive) with updates; None: ``end_fraction`` of the total optimizer steps."""
    end_fraction: float = 0.75
    drop_fraction: float = 0.3
    """Fraction of each layer's active weights moved at ``begin_step``; decays per ``drop_schedule``."""
    drop_schedule: str = "cosine"
    """"cosine" (decays to 0 at ``end_step``) or "constant"."""
    global_ranking: bool = False
    """Rank all layers together, so layer densities may drift (the total stays fixed)."""
    grow_init: str = "zeros"
    """Value of a regrown weight: "zeros" (RigL's choice: the new connection starts without effect on the output)
    or "normal" (drawn from N(0, s^2), s the standard deviation of the layer's weights that stay active, so a new
    connection starts at the scale of the ones around it). Its first moment starts at 0 either way."""
    grow_second_moment: str = "zeros"
    """Adam's second moment of a regrown weight: "zeros" (empty: Adam's step count is shared by the whole tensor,
    so its first hundred steps are 3-6x an ordinary Adam step, see ``seed_second_moment``) or "layer_mean" (the mean
    over the layer's weights that stay active: ordinary steps from the start). The larger steps pretrain better
    (docs/results.md, "The RigL plateau")."""

    def validate(self) -> None:
        _check_positive_int("rigl.update_freq", self.update_freq)
        _check_choice("rigl.grow_init", self.grow_init, GROW_INITS)
        _check_choice("rigl.grow_second_moment", self.grow_second_moment, GROW_SECOND_MOMENTS)
        _check_step_range("rigl", self.begin_step, self.end_step, self.end_fraction)
        if not 0.0 < self.drop_fraction < 1.0:
            raise ValueError(f"rigl.drop_fraction must be in (0, 1), got {self.drop_fraction}")
        _check_choice("rigl.drop_schedule", self.drop_schedule, DROP_SCHEDULES)

    def resolved_end_step(self, total_steps: int) -> int:
        return _resolve_end_step("rigl", self.begin_step, self.end_step, self.end_fraction, total_steps)

    def check_run_length(self, total_steps: int) -> None:
        """Refuse a schedule that cannot run within ``total_steps`` (when that is known before training), or
        that would never update the masks: updates fall on multiples of ``update_freq`` in [begin, end)."""
        end = _check_run_length("rigl", self.begin_step, self.end_step, self.end_fraction, total_steps)
        stop = min(end, total_steps + 1)  # steps are counted from 1; updates happen before end
        first = -(-max(self.begin_step, 1) // self.update_freq) * self.update_freq
        if first >= stop:
            raise ValueError(f"rigl would never update the masks: the first multiple of rigl.update_freq "
                             f"({self.update_freq}) from rigl.begin_step ({self.begin_step}) is step {first}, but "
                             f"updates stop before step {stop} (rigl.end_step / end_fraction, {total_steps} "
                             "optimizer steps in all); lower rigl.update_freq")


@dataclass
class GMPConfig:
    """Gradual magnitude pruning (Zhu & Gupta 2017): sparsity rises on a cubic schedule from dense-ish to target."""

    initial_sparsity: float = 0.0
    """Sparsity of every layer at ``begin_step`` (capped at the layer's own target)."""
    begin_step: int = 0
    end_step: int | None = None
    """Step at which every layer reaches its target; None: ``end_fraction`` of the total optimizer steps."""
    end_fraction: float = 0.75
    frequency: int = 100
    """Prune every this many optimizer steps (counted from ``begin_step``), and at ``end_step``."""
    score: str = "magnitude"
    """What decides which weights go: "magnitude" (|w|, Zhu & Gupta) or "movement" (hard movement pruning,
    Sanh et al. 2020: the score ``S = -sum_t grad_t * w_t`` accumulated over the optimizer steps up to the end of
    pruning, so weights moving towards zero go first even if they are still large) or "obs" (the Optimal BERT
    Surgeon, Kurtic et al. 2022: ``w^2 / (2 [F^-1]_qq)``, the loss increase a second-order model predicts for
    removing the weight, F a block-diagonal empirical Fisher of recent gradients; the ``obs_*`` settings;
    ``sparsity/scores.py``)."""
    global_ranking: bool = False
    """Rank the scores of all selected layers together against the overall target, so each layer ends as sparse
    as its scores make it (the total is fixed); False: every layer reaches its own target of the distribution."""
    max_tensor_sparsity: float | None = None
    """With ``global_ranking``: no tensor is pruned beyond this share; each keeps its best-scored
    ``ceil((1 - max_tensor_sparsity) * numel)`` weights and the rest of the budget is ranked over all of them.
    None: no limit (oBERT upstream left MiniLM's last layer 1-10 % dense, docs/results.md). Must exceed the overall
    target sparsity."""
    rewind_lr: bool = False
    """Learning-rate rewinding: when pruning ends, the linear schedule starts again from the peak learning rate and
    decays to 0 over the recovery steps that remain (``train.lr_scheduler`` linear, no onecycle)."""
    obs_block_size: int = 50
    """score "obs": the Fisher couples blocks of this many consecutive entries of each flattened weight (oBERT's 50).
    Its inverse takes ``ceil(numel / obs_block_size) * obs_block_size^2 * 4`` bytes per layer (2.1 GB for
    MiniLM-L6's encoder at 50, 17 GB for BERT-base's), on every process: lower it when that does not fit."""
    obs_num_grads: int = 1024
    """score "obs": the Fisher of a prune is built from the gradients of (up to) this many optimizer steps just before
    it, never from steps before the previous prune (oBERT's 1024; its gradients are of mini-batches of 16-32
    sequences, ours of whole optimizer steps, so 1024 of them span 1024 steps: with ``frequency`` below it the
    window is the steps since the previous prune)."""
    obs_damping: float = 1e-2
    """score "obs": ``F = obs_damping * I + (1/obs_num_grads) sum g g^T`` with every gradient of a window divided by
    the root mean square of its first one, so the damping is relative to the Fisher's diagonal (about 1 in those
    units), whatever the loss's scale. oBERT's absolute 1e-7 suits its task losses; a distillation loss of 0.03, as
    upstream pruning has, gives gradients whose outer products are far below it (obs would be magnitude pruning)."""
    obs_update_weights: bool = True
    """score "obs": at each prune, move the kept weights of each block by the optimal correction for the removed ones
    (``-F^-1[:, Q] (F^-1[Q, Q])^-1 w_Q``), as oBERT does; their optimizer state is left as it is."""

    def validate(self) -> None:
        _check_fraction("gmp.initial_sparsity", self.initial_sparsity)
        _check_step_range("gmp", self.begin_step, self.end_step, self.end_fraction)
        _check_positive_int("gmp.frequency", self.frequency)
        _check_choice("gmp.score", self.score, PRUNING_SCORES)
        _check_positive_int("gmp.obs_block_size", self.obs_block_size)
        _check_positive_int("gmp.obs_num_grads", self.obs_num_grads)
        cap = self.max_tensor_sparsity
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0.0 < cap < 1.0):
            raise ValueError(f"gmp.max_tensor_sparsity must be None or in (0, 1), got {cap!r}")
        damping = self.obs_damping
        if isinstance(damping, bool) or not isinstance(damping, (int, float)) or not 0.0 < damping < float("inf"):
            raise ValueError(f"gmp.obs_damping must be a positive number, got {damping!r}")
        if not isinstance(self.obs_update_weights, bool):
            raise ValueError(f"gmp.obs_update_weights must be true or false, got {self.obs_update_weights!r}")

    def resolved_end_step(self, total_steps: int) -> int:
        return _resolve_end_step("gmp", self.begin_step, self.end_step, self.end_fraction, total_steps)

    def check_run_length(self, total_steps: int) -> None:
        """Refuse a schedule that cannot run within ``total_steps``, or would stop pruning short of the target."""
        end = _check_run_length("gmp", self.begin_step, self.end_step, self.end_fraction, total_steps)
        if end > total_steps:
            raise ValueError(f"gmp.end_step ({end}) must be <= the run's optimizer steps ({total_steps}): the run "
                             "would end before the layers reach their target sparsity")


def check_mask_evolution(sparsity: SparsityConfig | None, rigl: RigLConfig | None, gmp: GMPConfig | None) -> None:
    """How the masks may evolve: by RigL, by GMP, or by both (gradual pruning whose kept weights RigL moves between
    prunes, the "neuroregeneration" of GraNet, Liu et al. 2021); not at all for 2:4 masks, which stay fixed."""
    if rigl is not None and gmp is not None:
        if gmp.score == "movement":
            # a pruned weight's movement score freezes (its weight is 0), so a regrown one would restart from it
            raise ValueError('rigl with gmp.score "movement" is not supported: a regrown weight would keep the score '
                             'it had when it was pruned; use gmp.score "magnitude"')
        if gmp.score == "obs":
            # a masked weight's gradient is 0, so one regrown inside a window has too small a Fisher row
            raise ValueError('rigl with gmp.score "obs" is not supported: a weight regrown inside the gradient window '
                             'has zero gradients in the Fisher for the steps it was masked, so the next prune would '
                             'remove it first; use gmp.score "magnitude"')
        if rigl.global_ranking and not gmp.global_ranking:
            # RigL would leave some layers sparser than their GMP target, and a per-layer prune only removes weights
            raise ValueError("rigl.global_ranking=true with gmp.global_ranking=false would overshoot the sparsity "
                             "target (RigL moves weights between layers, the per-layer prunes cannot refill one): "
                             "set gmp.global_ranking=true or rigl.global_ranking=false")
        if rigl.global_ranking and gmp.max_tensor_sparsity is not None:
            # the floor is applied when GMP prunes; a global RigL move between prunes ignores it and can empty a layer
            raise ValueError("rigl.global_ranking=true moves weights between layers without gmp.max_tensor_sparsity's "
                             "floor, so a layer could lose all its weights: set rigl.global_ranking=false (each layer "
                             "keeps its count) or drop gmp.max_tensor_sparsity")
    if sparsity is not None and sparsity.pattern == "2:4" and (rigl is not None or gmp is not None):
        raise ValueError('rigl/gmp cannot be used with sparsity.pattern "2:4": RigL/GMP change the number of weights '
                         "per group; 2:4 masks stay fixed")


def check_schedules_fit(rigl: RigLConfig | None, gmp: GMPConfig | None, total_steps: int) -> None:
    """Each schedule fits a run of ``total_steps``; with both and GMP starting dense, RigL must still update once
    pruning has begun: until then every layer is dense and each RigL update would copy the dense gradients for
    nothing."""
    for schedule in (rigl, gmp):
        if schedule is not None:
            schedule.check_run_length(total_steps)
    if rigl is None or gmp is None or gmp.initial_sparsity > 0:
        return
    end = rigl.resolved_end_step(total_steps)
    if end <= gmp.begin_step:
        raise ValueError(f"rigl.end_step (resolved to {end}) must be > gmp.begin_step ({gmp.begin_step}): RigL "
                         "would only update while every layer is still dense")


def check_gmp_fits(gmp: GMPConfig, sparsity: SparsityConfig) -> None:
    """Settings of ``gmp`` that depend on the sparsity section."""
    if gmp.global_ranking and sparsity.distribution != "uniform":
        raise ValueError("gmp.global_ranking=true sets the sparsity of each layer by ranking all layers together, so "
                         'sparsity.distribution must stay "uniform" (the overall target), got '
                         f'"{sparsity.distribution}"')
    cap = gmp.max_tensor_sparsity
    if cap is not None and not gmp.global_ranking:
        raise ValueError("gmp.max_tensor_sparsity limits how far the global ranking prunes one tensor: set "
                         "gmp.global_ranking=true (per-layer pruning reaches each layer's own target)")
    if cap is not None and cap <= sparsity.sparsity:
        raise ValueError(f"gmp.max_tensor_sparsity ({cap}) must exceed the target sparsity ({sparsity.sparsity}): "
                         "no tensor could then be pruned past it while the total reaches the target")


def _resolve_end_step(section: str, begin: int, end: int | None, fraction: float, total_steps: int) -> int:
    if end is None:
        if total_steps <= 0:
            raise ValueError(
                f"{section}.end_step is None and total_steps is {total_steps}: set {section}.end_step"
            )
        end = round(fraction * total_steps)
    if end <= begin:
        raise ValueError(f"{section}.end_step (resolved to {end}) must be > {section}.begin_step ({begin})")
    return end


def _check_run_length(section: str, begin: int, end: int | None, fraction: float, total_steps: int) -> int:
    """The resolved end step; the schedule must start before the run ends and end after it starts."""
    if begin >= total_steps:
        raise ValueError(f"{section}.begin_step ({begin}) must be < the run's optimizer steps ({total_steps}): "
                         f"the {section} schedule would never start")
    return _resolve_end_step(section, begin, end, fraction, total_steps)  # which refuses end <= begin


def _check_fraction(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{key} must be in [0, 1), got {value!r}")


def _check_choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}; got {value!r}")


def _check_positive_int(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")


def _check_step_range(section: str, begin: object, end: object, fraction: object) -> None:
    if isinstance(begin, bool) or not isinstance(begin, int) or begin < 0:
        raise ValueError(f"{section}.begin_step must be an integer >= 0, got {begin!r}")
    if end is not None and (isinstance(end, bool) or not isinstance(end, int) or end <= begin):
        raise ValueError(
            f"{section}.end_step must be None or an integer > {section}.begin_step ({begin}), got {end!r}"
        )
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
        raise ValueError(f"{section}.end_fraction must be in (0, 1], got {fraction!r}")


def _check_regex(key: str, pattern: object) -> None:
    if not isinstance(pattern, str):
        raise ValueError(f"{key} entries must be regex strings, got {pattern!r}")
    try:
        re.compile(pattern)
    except re.error as err:
        raise ValueError(f"{key} has an invalid regex {pattern!r}: {err}") from None
