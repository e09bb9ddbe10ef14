"""Typed sections of the Trainer hooks outside the sparsity core (``kd``, ``onecycle``): validated here, once, and
used by the hook's code (``trainer/distillation.py``, ``trainer/onecycle.py``). ``sparsity``, ``rigl`` and ``gmp``
live in ``sparsebert/sparsity/config.py``, beside the plain-PyTorch core that uses them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DistillationConfig:
    teacher: str = ""  # a finished run (name or dir), a model dir, "minilm", or a hub name
    alpha: float = 0.5  # weight of the distillation term at the start
    alpha_end: float | None = None  # if set, alpha moves linearly to this value by the last step
    temperature: float = 2.0
    # start the student from the teacher's weights (the same task's finetuned run): a sparse student is then pruned
    # from the dense model that finished training, not from the pretrained one
    student_from_teacher: bool = False
    # weight of a second term: the mean squared distance between the student's and the teacher's hidden states,
    # averaged over the encoder layers (TinyBERT's intermediate-layer loss). It needs a teacher of the student's
    # shape (layers and hidden size), e.g. a dense student's sparse twin; 0 leaves it out.
    hidden_weight: float = 0.0
    # task upstream only: weight of the KL divergence between the two models' attention distributions (MiniLM's
    # self-attention transfer; needs model.attn_implementation=eager, which returns them)
    attention_weight: float = 0.0

    def validate(self) -> None:
        if not self.teacher:
            raise ValueError("kd.teacher must name the teacher model (a run, a model directory or a hub name)")
        for name in ("alpha", "alpha_end"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"kd.{name} must be in [0, 1], got {value}")
        if self.temperature <= 0:
            raise ValueError(f"kd.temperature must be > 0, got {self.temperature}")
        for name in ("hidden_weight", "attention_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"kd.{name} must be >= 0, got {getattr(self, name)}")

    def alpha_at(self, step: int, max_steps: int) -> float:
        if self.alpha_end is None or max_steps <= 0:
            return self.alpha
        return self.alpha + (self.alpha_end - self.alpha) * min(step / max_steps, 1.0)


@dataclass
class OneCycleConfig:
    max_lr: float | None = None  # None: train.learning_rate
    pct_start: float = 0.3
    div_factor: float = 25.0  # initial lr = max_lr / div_factor
    final_div_factor: float = 1e4  # final lr = initial lr / final_div_factor
    anneal_strategy: str = "cos"
    cycle_momentum: bool = True  # cycles AdamW's beta1 between base_momentum and max_momentum, as torch does
    base_momentum: float = 0.85
    max_momentum: float = 0.95
    three_phase: bool = False

    def validate(self) -> None:
        if self.max_lr is not None and self.max_lr <= 0:
            raise ValueError(f"onecycle.max_lr must be > 0, got {self.max_lr}")
        if not 0.0 < self.pct_start < 1.0:
            raise ValueError(f"onecycle.pct_start must be in (0, 1), got {self.pct_start}")
        if self.anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"onecycle.anneal_strategy must be cos or linear, got {self.anneal_strategy!r}")
        if self.div_factor <= 0 or self.final_div_factor <= 0:
            raise ValueError("onecycle.div_factor and onecycle.final_div_factor must be > 0")
        if self.base_momentum > self.max_momentum:
            # torch would cycle beta1 upside down (highest while the lr peaks) without a word
            raise ValueError(f"onecycle.base_momentum ({self.base_momentum}) must be <= onecycle.max_momentum "
                             f"({self.max_momentum})")
