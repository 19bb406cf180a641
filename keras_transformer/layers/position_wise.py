"""Position-wise products: a function of each position's features, applied to every position at once.

Section 3.3: the feed-forward network "is applied to each position
separately and identically", and so are the attention projections W^Q, W^K,
W^V and W^O and the output projection. Each is one matrix product of a
`(positions, features)` matrix, whatever axes the positions come on
(`(batch, length)` when training, `(rows, 1)` at a decoding step).

`position_wise` flattens the leading axes itself and restores them after.
TensorFlow computes the same product either way (Keras' `ops.matmul` of a
3-D tensor by a matrix is a `tensordot`, which flattens just so), but the
shapes it leaves in a traced graph differ. `tensordot` takes the flattened
size from a product of the input's shape, which an interpreter that plans
its memory ahead computes only when a graph runs; inside a decoding loop
that makes every later tensor of the loop "dynamic", and such an interpreter
then prepares the loop body again at every step and copies the whole loop
state, the key/value cache, into the body and out of it. Flattened here with
a -1 and the positions' known axes, every shape in a decoding step is known
when the loop is prepared.
"""

from keras import ops


def position_wise(function, inputs):
    """`function` of `(positions, features)` applied to `inputs` `(..., features)`: `(..., out_features)`.

    Example:
    >>> kernel = keras.ops.ones((64, 32))
    >>> position_wise(lambda rows: keras.ops.matmul(rows, kernel), keras.ops.zeros((2, 10, 64))).shape
    (2, 10, 32)
    """
    if len(inputs.shape) == 2:
        return function(inputs)
    outputs = function(ops.reshape(inputs, (-1, inputs.shape[-1])))
    # The first axis as -1 where the others are known (a decoding step's single position).
    positions = inputs.shape[1:-1]
    if all(size is not None for size in positions):
        return ops.reshape(outputs, (-1, *positions, outputs.shape[-1]))
    return ops.reshape(outputs, (*ops.shape(inputs)[:-1], outputs.shape[-1]))


def matrix_product(inputs, kernel):
    """`inputs` `(..., d_in)` times `kernel` `(d_in, d_out)`, as one 2-D matrix product (`position_wise`)."""
    return position_wise(lambda rows: ops.matmul(rows, kernel), inputs)
