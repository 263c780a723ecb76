"""Loop helpers shared by the searches of `transformer.decoding`: argument checks, the ``tf.while_loop`` over a state
dict, the sequence buffers, and dropping finished rows (``compact``) with their results stored at their original rows.
Internal to the package."""

import tensorflow as tf

from transformer.vocab import PAD_ID


def check_compact(compact, static_shapes):
    if compact is None:
        return
    if static_shapes:
        raise ValueError("compact drops rows: it needs static_shapes=False (not under XLA)")
    if not 0.0 <= compact <= 1.0:
        raise ValueError(f"compact must be a fraction in [0, 1], got {compact!r}")


def caller(step_fn, memory):
    """``call(ids, index, cache, memory)``: passes ``memory`` on only if the search was given one."""
    if memory is None:
        return lambda ids, index, cache, _: step_fn(ids, index, cache)
    return step_fn


def state_loop(cond, body, state, static_shapes):
    """``tf.while_loop`` over the state dict; ``static_shapes=False`` lets every dimension change (not the ranks)."""
    if static_shapes:
        return tf.while_loop(cond, body, (state,))
    invariants = tf.nest.map_structure(lambda x: tf.TensorShape([None] * x.shape.rank), state)
    return tf.while_loop(cond, body, (state,), shape_invariants=(invariants,))


def rows_to_drop(done, compact):
    """``(M,)`` bool: the done rows, if they are at least one and at least ``compact`` of the ``M`` rows."""
    count = tf.reduce_sum(tf.cast(done, tf.float32))
    enough = tf.logical_and(count > 0.0, count >= compact * tf.cast(tf.size(done), tf.float32))
    return tf.logical_and(done, enough)


def store_rows(out, rows, which, values):
    """``out[name][rows[i]] = values[name][i]`` for the rows ``i`` where ``which`` is True."""
    at = tf.where(which)[:, 0]  # (D,)
    indices = tf.gather(rows, at)[:, None]  # (D, 1)
    return {
        name: tf.tensor_scatter_nd_update(out[name], indices, tf.gather(values[name], at)) for name in out
    }


def drop_rows(state, gone, results, names):
    """Stores ``results(state)`` of the rows where ``gone`` is True in ``state["out"]`` and removes them from
    ``state[name]`` for ``names``; nothing happens (one `tf.cond`) in the steps where no row goes."""

    def drop():
        keep = tf.where(tf.logical_not(gone))[:, 0]  # (M',)
        kept = {name: tf.nest.map_structure(lambda x: tf.gather(x, keep), state[name]) for name in names}
        return dict(kept, out=store_rows(state["out"], state["original"], gone, results(state)))

    def stay():
        return {name: state[name] for name in (*names, "out")}

    return dict(state, **tf.cond(tf.reduce_any(gone), drop, stay))


def step_limit(max_steps, max_length):
    limit = tf.cast(max_length, tf.int32)
    if max_steps is None:
        return limit
    return tf.minimum(tf.cast(max_steps, tf.int32), limit)


def initial_sequences(leading_shape, max_length, first_id):
    """``leading_shape + [max_length + 1]`` int32: ``first_id`` at position 0, ``PAD`` elsewhere."""
    first = tf.fill(leading_shape + [1], tf.constant(first_id, tf.int32))
    rest = tf.fill(leading_shape + [max_length], tf.constant(PAD_ID, tf.int32))
    return tf.concat([first, rest], axis=-1)


def write_token(seq, position, token):
    """``seq[..., position] = token`` with a fixed-shape select (XLA friendly)."""
    at = tf.equal(tf.range(tf.shape(seq)[-1]), position)  # (max_length + 1,)
    return tf.where(at, token[..., None], seq)
