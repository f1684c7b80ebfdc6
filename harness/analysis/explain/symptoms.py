"""What a training log says when nothing was raised: the loss and the gradient norm it logged step by step, and
DeepSpeed's own count of skipped steps, read as the log streams past (bounded: a count and the last values).

A failure that raises nothing shows in these: a gradient norm of ``nan`` or ``inf`` beside a finite loss that
stays flat (the step was skipped: F34), DeepSpeed's ``step=N, skipped=M`` with M > 0, where nothing said
"OVERFLOW". Each symptom read is given to ``explain`` as the exception a harness run raises for it
(``repros/trainer/silent_failures.py``), so a documented failure's signature can name it like any other.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

#: ``'loss': 2.31``, ``loss=2.31``, ``"loss": nan`` (HF Trainer's log dicts, accelerate's and most loops').
_NUMBER = r"(?P<v>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
_LOSS = re.compile(r"""['"]?\b(?:train_)?loss['"]?\s*[:=]\s*""" + _NUMBER, re.I)
_GRAD_NORM = re.compile(r"""['"]?\bgrad(?:ient)?_?norm['"]?\s*[:=]\s*(?:tensor\()?""" + _NUMBER, re.I)
#: DeepSpeed's progress line (``steps_per_print``): ``[Rank 0] step=10, skipped=10, lr=[...]``.
_DEEPSPEED_STEPS = re.compile(r"\bstep=(?P<step>\d+), skipped=(?P<skipped>\d+)")
#: What DeepSpeed (or a trainer) writes where it says a step was skipped.
_SAID = re.compile(r"OVERFLOW|Skipping step|step was skipped", re.I)
#: The exception a harness run raises for a step skipped and not said (F34's signature names it).
SKIPPED_SILENTLY = "repros.trainer.silent_failures.OptimizerStepSkippedSilently"
#: Fewest logged steps that make a pattern of them.
MIN_STEPS = 3


@dataclass
class Symptoms:
    """Fed each log line (cleaned of prefixes) in order."""

    steps: int = 0
    #: Logged steps with a finite loss and a gradient norm that is not finite.
    nonfinite_grad: int = 0
    first_nonfinite_line: int | None = None
    losses: list[float] = field(default_factory=list)
    deepspeed_step: int | None = None
    deepspeed_skipped: int = 0
    deepspeed_line: int | None = None
    said: bool = False

    def line(self, number: int, line: str) -> None:
        if _SAID.search(line):
            self.said = True
        counted = _DEEPSPEED_STEPS.search(line)
        if counted:
            self.deepspeed_step, self.deepspeed_skipped = int(counted["step"]), int(counted["skipped"])
            self.deepspeed_line = number
        loss, norm = _LOSS.search(line), _GRAD_NORM.search(line)
        if loss is None or norm is None:
            return
        loss_value, norm_value = float(loss["v"]), float(norm["v"])
        self.steps += 1
        if len(self.losses) < 8:
            self.losses.append(loss_value)
        if math.isfinite(loss_value) and not math.isfinite(norm_value):
            self.nonfinite_grad += 1
            if self.first_nonfinite_line is None:
                self.first_nonfinite_line = number

    def found(self) -> list[tuple[str, str, int]]:
        """(exception type, message, line) for each symptom the log showed."""
        if self.said:
            return []  # the skip was said: whatever else this is, it is not a silent skip
        found: list[tuple[str, str, int]] = []
        if self.deepspeed_skipped and self.deepspeed_line is not None:
            found.append(
                (
                    SKIPPED_SILENTLY,
                    f"{self.deepspeed_skipped} of {self.deepspeed_step} optimizer steps were skipped (DeepSpeed's "
                    f"step={self.deepspeed_step}, skipped={self.deepspeed_skipped}) and nothing was logged of them",
                    self.deepspeed_line,
                )
            )
        if self.nonfinite_grad >= MIN_STEPS and self.first_nonfinite_line is not None:
            shown = ", ".join(f"{v:.4g}" for v in self.losses)
            found.append(
                (
                    SKIPPED_SILENTLY,
                    f"{self.nonfinite_grad} of {self.steps} logged optimizer steps were skipped, by the look of it "
                    f"(the gradient norm not finite, the loss finite: {shown}) and nothing was logged of them",
                    self.first_nonfinite_line,
                )
            )
        return found
