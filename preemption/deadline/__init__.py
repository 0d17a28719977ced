"""Deadline-aware admission and continuation (Khalid et al.; docs/deadline.md), pure functions
shared by the agent, the Slurm hook's threshold file and the simulator.

    from preemption.deadline import x_factor, admit, continuation, Continuation
    from preemption.deadline import adaptive_threshold, cdf_threshold, failure_rate, Bounds
    from preemption.deadline import VOModel, fit_vo_model, fit_training, TrainingResult

    x = x_factor(remaining_s=3600, time_to_deadline_s=3000)     # 0.1666...: 1/6 too late
    admit(x, threshold=0.2)                                     # True: x < X
    continuation(x, threshold=0.1, action="checkpoint", can_meet_elsewhere=True)
    X = adaptive_threshold(X, target=0.15, measured=0.3, delta_x=0.05, bounds=Bounds(0.1, 0.9))
    X = cdf_threshold(headrooms, probability=0.9, bounds=Bounds(0.1, 0.9), default=0.1)
    vo = VOModel.default(); vo.slowdown("mem", ("cpu", "mem"))  # 1 + base + neighbours' share
    vo = refit_vo_model(vo, observations)  # learned from finished vjobs (actual / time limit)
"""

from preemption.deadline.decisions import Continuation, admit, continuation, predicted_remaining
from preemption.deadline.thresholds import Bounds, adaptive_threshold, cdf_threshold, failure_rate
from preemption.deadline.training import TrainingResult, fit_training
from preemption.deadline.vo_learning import refit_vo_model
from preemption.deadline.vo_model import KINDS, VOModel, fit_vo_model
from preemption.deadline.xfactor import x_factor

__all__ = [
    "KINDS",
    "Bounds",
    "Continuation",
    "TrainingResult",
    "VOModel",
    "adaptive_threshold",
    "admit",
    "cdf_threshold",
    "continuation",
    "failure_rate",
    "fit_training",
    "fit_vo_model",
    "predicted_remaining",
    "refit_vo_model",
    "x_factor",
]
