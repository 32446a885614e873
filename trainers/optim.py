"""Optimizer settings: which update rule replay applies, with which constants.

The arithmetic lives in `replay.update`; this module only validates the settings and
says how ES coefficients relate to the rule: for `sgd` the learning rate is folded into
the coefficients (θ += Σ cᵢεᵢ, the paper's update), for `momentum` and `adam` the
coefficients are the gradient estimate and the rule applies the learning rate.

Momentum is damped by default (dampening 0.9: v = 0.9·v + 0.1·g): undamped momentum
with the paper's settings diverged (docs/design.md, "Decisions that changed"; tests/test_momentum_quadratic.py).
`record` always writes every constant of the rule into the generation record, so replay
never falls back on its own defaults — which differ: `replay.update` reads a record
without `dampening` as 0.0 (torch's convention), not as this module's 0.9.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_DAMPENING = 0.9  # deliberately not replay.update's 0.0: see the module docstring


class OptimizerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value):
        """A bare name is shorthand: `optimizer: adam` means `{name: adam}`."""
        return {"name": value} if isinstance(value, str) else value

    name: Literal["sgd", "momentum", "adam"] = Field(
        "sgd", description="`sgd`: the paper's update; `momentum`, `adam`: state replay rebuilds"
    )
    beta: float = Field(0.9, ge=0.0, lt=1.0, description="momentum coefficient")
    dampening: float = Field(
        DEFAULT_DAMPENING,
        ge=0.0,
        le=1.0,
        description="v = β·v + (1 − dampening)·g; default damped (replay's default for a "
        "record without the key is 0.0, so records always carry it)",
    )
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="adam: decay β₁ of the first moment m")
    beta2: float = Field(0.999, ge=0.0, lt=1.0, description="adam: decay β₂ of the second moment v")
    eps: float = Field(1e-8, gt=0.0, le=1.0, description="adam: ε added to √v̂ in the denominator")

    @property
    def folds_lr(self) -> bool:
        """True when the learning rate is part of the coefficients (plain SGD)."""
        return self.name == "sgd"

    def record(self, lr: float) -> dict:
        """The settings in force for one generation, as stored in the ledger."""
        base = {"name": self.name, "lr": lr}
        if self.name == "momentum":
            base |= {"beta": self.beta, "dampening": self.dampening}
        elif self.name == "adam":
            base |= {"beta1": self.beta1, "beta2": self.beta2, "eps": self.eps}
        return base
