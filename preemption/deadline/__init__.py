"""Deadline-aware admission and continuation (Khalid et al.; docs/deadline.md), pure functions
shared by the agent, the Slurm hook's threshold file and the simulator.

    from preemption.deadline import x_factor, admit, continuation, Continuation
    from preemption.deadline import adaptive_threshold, cdf_threshold, failure_rate, Bounds
    from preemption.deadline import VOModel, fit_vo_model, fit_training, TrainingResult

    x = x_factor(remaining_s=3600, time_to_deadline_s=3000)     # 0.1666...: 1/6 too late
    admit(x, threshold=0.2)                                     # True: x < X
    continuation(x, threshold=0.1, action="checkpoint", can_meet_elsewhere=True)
    held_verdict(x_alone=-0.1, x_placement=0.05, threshold=0.0)  # Held.HOLD: not there, alone yes
    X = adaptive_threshold(X, target=0.15, measured=0.3, delta_x=0.05, bounds=Bounds(0.1, 0.9))
    X = cdf_threshold(headrooms, probability=0.9, bounds=Bounds(0.1, 0.9), default=0.1)
    vo = VOModel.default(); vo.slowdown("mem", ("cpu", "mem"))  # 1 + base + neighbours' share
    vo = refit_vo_model(vo, observations)  # learned from finished vjobs (actual / time limit)
"""

from preemption.deadline.decisions import (
    Continuation,
    Held,
    admit,
    continuation,
    held_verdict,
    predicted_remaining,
    resume_x,
)
from preemption.deadline.thresholds import Bounds, adaptive_threshold, cdf_threshold, failure_rate
from preemption.deadline.training import TrainingResult, fit_training
from preemption.deadline.vo_learning import refit_vo_model
from preemption.deadline.vo_model import KINDS, VOModel, fit_vo_model, job_kind
from preemption.deadline.xfactor import x_factor

__all__ = [
    "KINDS",
    "Bounds",
    "Continuation",
    "Held",
    "TrainingResult",
    "VOModel",
    "adaptive_threshold",
    "admit",
    "cdf_threshold",
    "continuation",
    "failure_rate",
    "fit_training",
    "fit_vo_model",
    "held_verdict",
    "job_kind",
    "predicted_remaining",
    "refit_vo_model",
    "resume_x",
    "x_factor",
]
