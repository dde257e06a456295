"""Every rank runs the same number of steps per epoch, so every rank runs the same collectives.

A rank whose shard ends early stops calling allreduce while the others wait for it forever. So all
ranks agree on the smallest shard's ``records // batch_size`` (one allgather in ``setup()``) and each
epoch is cut to exactly that many batches; a shard shorter than promised fails naming the rank.
"""

from __future__ import annotations

import logging

from sagemaker_dist.runtime.tensorflow.keras.errors import TrainingSetupError

log = logging.getLogger(__name__)


def agree_on_steps(records, batch_size, what, hvd) -> tuple[int | None, list[int] | None]:
    """``(steps, counts)``: the smallest shard's ``records // batch_size`` and every rank's record count.

    All ranks call this (an allgather, skipped when ``records`` is None); a rank with fewer records than
    one batch is named in the error, raised on every rank alike.
    """
    if records is None:
        return None, None
    counts = [int(c) for c in hvd.allgather_object(int(records), name=f"sagemaker_dist_{what}_records")]
    smallest = min(counts)
    steps = smallest // batch_size
    if steps < 1:
        poor = counts.index(smallest)
        raise TrainingSetupError(
            f"rank {poor} has {smallest} {what} record(s), fewer than one batch of {batch_size}; "
            f"records per rank: {counts}. Use a smaller batch size or more data per shard"
        )
    if max(counts) // batch_size > steps:
        log.info(
            "%s shards differ (%d..%d records per rank); every rank runs %d steps per epoch",
            what,
            smallest,
            max(counts),
            steps,
        )
    return steps, counts


def exact_epoch(batches, *, steps, counts, what, rank, size, batch_size, skip=None):
    """One epoch of ``batches``: exactly ``steps`` of them, or ``batches`` as is on one rank without steps.

    Several ranks without steps would stop at different batches and stall, so that raises. With
    ``skip`` (a ``stop.ResumeSkip``) the first iteration drops the steps trained before a stop and is
    that much shorter; the epochs' length is then no longer static (mark the dataset ``AGREED``).
    """
    if steps is None:
        if size > 1:
            raise TrainingSetupError(
                f"{what}: no steps per epoch, so ranks would run out of data at different steps "
                f"and stall; pass {what}_records= (records in this rank's shard) and batch_size= "
                "to setup()"
            )
        return batches
    message = (
        f"rank {rank}: its {what} shard ran out before the {steps} batches of "
        f"{batch_size} agreed per epoch (records per rank given to setup(): {counts}); "
        f"{what}_records must be the records in this rank's shard. Batches delivered:"
    )
    if skip is not None:
        return skip_first_batches(batches, skip, then=lambda rest, n: cut_to_steps(rest, steps - n, message))
    return cut_to_steps(batches, steps, message)


def skip_first_batches(batches, skip, then=None):
    """``batches`` whose first iteration drops ``skip.take()`` batches (read, not trained): the steps
    trained before a stop, skipped once after the resume (``stop.ResumeSkip``); later iterations skip 0.
    ``then(rest, n)``, if given, makes each iteration's dataset of the rest and the count skipped."""
    import tensorflow as tf

    counts = tf.data.Dataset.range(1).map(lambda _: tf.reshape(tf.py_function(skip.take, [], tf.int64), []))
    return counts.flat_map(lambda n: then(batches.skip(n), n) if then else batches.skip(n))


def blank_like(element_spec):
    """An element of ``element_spec`` with no records: zeros, unknown dimensions 0 (an end marker)."""
    import tensorflow as tf

    specs = tf.nest.flatten(element_spec)
    zeros = [tf.zeros([d if d is not None else 0 for d in spec.shape], spec.dtype) for spec in specs]
    return tf.nest.pack_sequence_as(element_spec, zeros)


def cut_to_steps(batches, steps: int, message: str | None = None):
    """``batches`` cut to ``steps`` with that cardinality; ending early raises ``message`` (plus the
    count), checked by an end marker appended after the batches, before TensorFlow's own check."""
    import tensorflow as tf

    cut = batches.take(steps)
    specs = tf.nest.flatten(batches.element_spec)
    if message is None or not all(
        isinstance(spec, tf.TensorSpec) and spec.shape.rank is not None for spec in specs
    ):
        return cut.apply(tf.data.experimental.assert_cardinality(steps))
    blank = blank_like(batches.element_spec)
    marked = cut.map(lambda *b: (False, b if len(b) > 1 else b[0])).concatenate(
        tf.data.Dataset.from_tensors((True, blank))
    )

    def count(seen, item):
        is_end, batch = item
        check = tf.debugging.Assert(tf.logical_or(tf.logical_not(is_end), seen >= steps), [message, seen])
        with tf.control_dependencies([check]):
            return seen + 1, item

    checked = marked.scan(tf.constant(0, tf.int64), count)
    checked = checked.filter(lambda is_end, batch: tf.logical_not(is_end))
    return checked.map(lambda is_end, batch: batch).apply(tf.data.experimental.assert_cardinality(steps))
