"""The one timing rule of tools/bench's training comparisons, applied to both sides (cairn's
metrics.jsonl and the PyTorch references), so that both are timed between the same points.

A step's time is the interval from the end of the previous step (for the first step: the start of
the training loop, after start-up) to the end of this step. It therefore includes everything the
training loop does for that step: reading and collating the batch, forward, backward, the
all-reduce or ring sync, the optimizer, the per-step bookkeeping, an epoch rollover. cairn's
provider writes exactly this interval as batch / samples_per_s in every step record
(trainer/StepRecorder.cpp: the time since the previous record); the references measure it the
same way with time.perf_counter().

Evaluation runs between two steps, so its pause lands in the interval of the step right after it
(on both sides). Those steps are not counted as measured: their time is replaced by the median
time of the other steps after the warm-up (so time to target counts one ordinary step for them and
no evaluation). Start-up (process spawn, loading the data and the model, connecting) is before the
first interval on both sides and never counted. The first `warmup` steps count in time to target
but not in samples/s.
"""
import statistics


def after_eval(step, eval_every):
    """True for 1-based step numbers whose interval contains an evaluation pause."""
    return bool(eval_every) and step > 1 and (step - 1) % eval_every == 0


def reached(evaluation, target, metric="accuracy"):
    """True when an evaluation meets the target: accuracy at or above it, loss at or below it."""
    value = evaluation.get(metric)
    if value is None:
        return False
    return value <= target if metric == "loss" else value >= target


def figures(times, evals, eval_every, warmup, batch, target, metric="accuracy"):
    """times: per-step intervals (seconds; index i is step i + 1). evals: dicts with 'step' (steps
    done when evaluated) and `metric` ('accuracy', or 'loss' for a validation-loss target). batch:
    samples per step (all processes). Returns samples/s over steps after `warmup`, time to the first
    evaluation that reaches `target` (see reached) and its step."""
    clean = [t for i, t in enumerate(times) if i >= warmup and not after_eval(i + 1, eval_every)]
    if not clean:
        clean = [t for i, t in enumerate(times) if not after_eval(i + 1, eval_every)] or list(times)
    typical = statistics.median(clean) if clean else 0.0
    counted = [typical if after_eval(i + 1, eval_every) else t for i, t in enumerate(times)]
    timed = counted[warmup:]
    hit = next((e for e in evals if reached(e, target, metric)), None)
    return {"samples_per_s": batch * len(timed) / sum(timed) if timed and sum(timed) > 0 else None,
            "median_step_s": typical,
            "time_to_target_s": sum(counted[:hit["step"]]) if hit else None,
            "steps_to_target": hit["step"] if hit else None,
            "steps_after_eval_replaced": sum(1 for i in range(len(times)) if after_eval(i + 1, eval_every))}
