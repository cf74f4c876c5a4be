"""What the Trainer does on the host for every micro-batch, made cheaper where the result stays the same.

A `fastest` step on a GPU is bound by the host: Python launches kernels more slowly than the card runs them (the
GPU is busy 65-87% of the step, bench/RESULTS.md runs 24-25), so each millisecond of host work per micro-batch is a
millisecond of step time. Profiled on the CPU with the 8B's module tree (32 layers, LoRA on q/k/v/o, 4-bit), the
Trainer's flop count walks every parameter of the model once per micro-batch to count them again: 5 ms of the step,
the same number every time (bench/RESULTS.md run 25).

`counted_once(trainer_class)`: the trainer class with that count taken once per model. `Trainer.floating_point_ops`
is the hook transformers documents for this ("subclass and override this method"); its result (total_flos in the
Trainer's state and logs) is the same number as before.
"""

from __future__ import annotations

import functools


@functools.cache  # one class per trainer class, not one per run
def counted_once(trainer_class: type) -> type:
    """`trainer_class` whose floating_point_ops counts the model's parameters (without the embeddings) once per
    model object instead of once per micro-batch: 6 x the batch's tokens x that count, as the Trainer computes it."""

    class CountedOnce(trainer_class):
        def floating_point_ops(self, inputs) -> int:
            model = self.model
            main_input = getattr(model, "main_input_name", "input_ids")
            if main_input not in inputs or not hasattr(model, "num_parameters"):
                return super().floating_point_ops(inputs)
            cached = getattr(self, "_memtune_parameters", None)
            if cached is None or cached[0] is not model:  # a new model object (model_init): count it again
                cached = (model, model.num_parameters(exclude_embeddings=True))
                self._memtune_parameters = cached
            return 6 * inputs[main_input].numel() * cached[1]

    CountedOnce.__name__ = CountedOnce.__qualname__ = trainer_class.__name__
    return CountedOnce
