"""A preference run's learning signal, read from what TRL's trainers log: reward accuracy and margins, the chosen
and rejected answers' log-probabilities (DPOTrainer, ORPOTrainer, KTOTrainer name them alike: rewards/accuracies,
rewards/margins, logps/chosen, logps/rejected; KTO logs no accuracy), and GRPO's: the mean reward, each scorer's
(rewards/<scorer>/mean), the sampled answers' mean length and the KL to the reference. Light (no library imports): the event callback
(core/train/callbacks.py) and the recipe's summary (core/train/stages.py) both read it.
"""

from __future__ import annotations

import math
from typing import Any

# TRL's log name -> memtune's event / summary name
NAMES = {"rewards/accuracies": "reward_accuracy", "rewards/margins": "reward_margin",
         "rewards/chosen": "reward_chosen", "rewards/rejected": "reward_rejected",
         "logps/chosen": "logp_chosen", "logps/rejected": "logp_rejected"}
# GRPOTrainer's (reward: the weighted sum over the scorers, averaged over the sampled answers)
GRPO_NAMES = {"reward": "reward_mean", "reward_std": "reward_std", "completions/mean_length": "completion_length",
              "kl": "kl"}
SAMPLING_S = "sampling_s"  # GRPO: seconds spent generating answers per generation batch (core/train/grpo.py)
BY_SCORER = "reward_by_"  # + the scorer's name: its mean reward (TRL's rewards/<name>/mean)


def grpo_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """GRPO's figures in one of the Trainer's training logs: GRPO_NAMES' and each scorer's mean reward ({} for other
    stages: only GRPOTrainer logs `reward`)."""
    if not isinstance(logs.get("reward"), (int, float)):
        return {}
    out = {name: round(float(logs[trl]), 6) for trl, name in GRPO_NAMES.items()
           if isinstance(logs.get(trl), (int, float)) and math.isfinite(logs[trl])}
    if isinstance(logs.get(SAMPLING_S), (int, float)) and math.isfinite(logs[SAMPLING_S]):
        out[SAMPLING_S] = round(float(logs[SAMPLING_S]), 4)
    for key, value in logs.items():
        scorer = key[len("rewards/"):-len("/mean")] if key.startswith("rewards/") and key.endswith("/mean") else ""
        if scorer and isinstance(value, (int, float)) and math.isfinite(value):
            out[BY_SCORER + scorer] = round(float(value), 6)
    return out


def grpo_summary(log_history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """summary.json["grpo"]: each logged step's figures, the first, final and best mean reward (and its step), the
    final completion length and KL; None when nothing was logged."""
    steps = [{"step": int(h.get("step", 0)), **grpo_metrics(h)} for h in log_history if "loss" in h]
    steps = [s for s in steps if "reward_mean" in s]
    if not steps:
        return None
    best = max(steps, key=lambda s: (s["reward_mean"], -s["step"]))
    first, last = steps[0], steps[-1]
    return {"first_reward": first["reward_mean"], "final_reward": last["reward_mean"],
            "best_reward": best["reward_mean"], "best_reward_step": best["step"],
            "first_rewards_by_scorer": {k[len(BY_SCORER):]: v for k, v in first.items() if k.startswith(BY_SCORER)},
            "final_rewards_by_scorer": {k[len(BY_SCORER):]: v for k, v in last.items() if k.startswith(BY_SCORER)},
            "final_completion_length": last.get("completion_length"), "final_kl": last.get("kl"), "steps": steps}


def reward_metrics(logs: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The reward metrics in one of the Trainer's training logs (none for an SFT run); prefix "eval_": in one of its
    evals' (TRL names them eval_rewards/accuracies ...)."""
    out = {}
    for trl_name, name in NAMES.items():
        value = logs.get(prefix + trl_name)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[name] = round(float(value), 6)
    return out


def reward_summary(log_history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """summary.json["preference"]: each logged step's reward metrics, the first, final and best reward accuracy
    (and its step) and the final margin; None when nothing was logged."""
    steps = [{"step": int(h.get("step", 0)), **reward_metrics(h)} for h in log_history if "loss" in h]
    steps = [s for s in steps if len(s) > 1]
    if not steps:
        return None
    acc = [(s["step"], s["reward_accuracy"]) for s in steps if "reward_accuracy" in s]
    best = max(acc, key=lambda sa: (sa[1], -sa[0])) if acc else (None, None)
    last = steps[-1]
    return {"first_reward_accuracy": acc[0][1] if acc else None, "final_reward_accuracy": acc[-1][1] if acc else None,
            "best_reward_accuracy": best[1], "best_reward_accuracy_step": best[0],
            "final_reward_margin": last.get("reward_margin"), "final_logp_chosen": last.get("logp_chosen"),
            "final_logp_rejected": last.get("logp_rejected"), "steps": steps}


def rewards_said(rewards: dict[str, float]) -> dict[str, float]:
    """log.pref.rewards' parameters (KTO logs no accuracy: nan, said as such)."""
    nan = float("nan")
    return {"accuracy": 100 * rewards.get("reward_accuracy", nan), "margin": rewards.get("reward_margin", nan),
            "chosen": rewards.get("logp_chosen", nan), "rejected": rewards.get("logp_rejected", nan)}


def eval_rewards(log_history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """summary.json["preference"]'s validation part: TRL's reward metrics of each eval on the validation pairs
    (eval_rewards/accuracies ...: core.train.rewards names them), the baseline (before training), final and best
    reward accuracy (and its step) and the final margin; None without an eval."""
    evals = [{"step": int(h.get("step", 0)), **reward_metrics(h, prefix="eval_")} for h in log_history
             if "eval_loss" in h]
    evals = sorted({e["step"]: e for e in evals if len(e) > 1}.values(), key=lambda e: e["step"])  # a resume logs again
    if not evals:
        return None
    acc = [(e["step"], e["reward_accuracy"]) for e in evals if "reward_accuracy" in e]  # KTO logs no accuracy
    best = max(acc, key=lambda sa: (sa[1], -sa[0])) if acc else (None, None)
    return {"baseline_eval_reward_accuracy": acc[0][1] if acc and acc[0][0] == 0 else None,
            "final_eval_reward_accuracy": acc[-1][1] if acc else None,
            "best_eval_reward_accuracy": best[1], "best_eval_reward_accuracy_step": best[0],
            "final_eval_reward_margin": evals[-1].get("reward_margin"), "eval_steps": evals}
