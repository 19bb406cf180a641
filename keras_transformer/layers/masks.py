"""Attention masks: which keys each query may look at.

Every mask in this package is boolean with **True meaning "may attend"**, and
every attention call merges its masks in one place, `merge_attention_masks`,
into a single tensor broadcastable to `(batch, heads, query_length,
key_length)`. Three kinds of mask appear in "Attention Is All You Need":

* padding (Section 3.2.3 implicitly: sentences of different lengths share a
  batch, and padded positions must never be attended),
* causal (Section 3.2.3: "we need to prevent leftward information flow in the
  decoder ... by masking out (setting to -inf) all values in the input of the
  softmax which correspond to illegal connections"),
* and, as an alternative to global attention, a local window of +-w positions
  (Section 4 mentions restricting self-attention to a neighbourhood of size r).

`offset` shifts query positions: during incremental decoding the queries are
the newest positions of a longer sequence whose keys sit in a cache.
"""

from keras import ops


def padding_mask(token_ids, padding_id=0):
    """`(batch, length)` mask, True at real tokens and False at padding.

    Example:
    >>> padding_mask([[5, 7, 0]])  # -> [[True, True, False]]
    """
    return ops.not_equal(token_ids, padding_id)


def _relative_positions(query_length, key_length, offset):
    """`(query_length, key_length)` matrix of query position - key position."""
    query_positions = ops.expand_dims(ops.arange(query_length) + offset, 1)
    key_positions = ops.expand_dims(ops.arange(key_length), 0)
    return query_positions - key_positions


def causal_mask(query_length, key_length=None, offset=0):
    """`(query_length, key_length)` mask: query i sees keys 0..i+offset.

    Example:
    >>> causal_mask(3)  # lower-triangular 3x3, True on and below the diagonal
    """
    key_length = query_length if key_length is None else key_length
    return _relative_positions(query_length, key_length, offset) >= 0


def sliding_window_mask(query_length, key_length, window, causal=False, offset=0):
    """`(query_length, key_length)` mask for local attention.

    Query i sees keys within `window` positions: i-window..i+window, or with
    `causal=True` the previous `window` keys and itself, i-window..i.
    """
    if window is None or int(window) < 1:
        raise ValueError(f"sliding window must be a positive integer, got {window!r}")
    distance = _relative_positions(query_length, key_length, offset)
    if causal:
        return ops.logical_and(distance >= 0, distance <= window)
    return ops.abs(distance) <= window


def _to_rank4(mask, name):
    """Expand a mask to `(batch or 1, heads or 1, query_length, key_length)`."""
    mask = ops.cast(mask, "bool")
    rank = len(mask.shape)
    if rank == 2:  # (query_length, key_length), shared by the batch
        return _with_axes(mask, (0, 1))
    if rank == 3:  # (batch, query_length, key_length): Keras' own convention
        return _with_axes(mask, (1,))
    if rank == 4:
        return mask
    raise ValueError(f"{name} must have rank 2, 3 or 4; got shape {mask.shape}")


def merge_attention_masks(
    query_length,
    key_length,
    query_mask=None,
    key_mask=None,
    attention_mask=None,
    causal=False,
    sliding_window=None,
    offset=0,
    valid_key_length=None,
):
    """Combine every source of masking into one boolean tensor (or None).

    Args:
        query_length, key_length: sizes of the two sequence axes.
        query_mask: `(batch, query_length)`, False at padded queries. A padded
            query attends to nothing, and its attention weights are all zero.
        key_mask: `(batch, key_length)`, False at padded keys.
        attention_mask: any extra mask of rank 2, 3 `(batch, q, k)` or 4.
        causal: hide keys after each query's position.
        sliding_window: hide keys more than this many positions away.
        offset: position of the first query (the decoding step with a cache).
        valid_key_length: keys at or beyond this index are hidden (unfilled
            slots of a decoding cache).

    Returns:
        None when nothing is masked, else a bool tensor of rank 4 that
        broadcasts to `(batch, heads, query_length, key_length)`.
    """
    masks = []
    if query_mask is not None:
        masks.append(_with_axes(ops.cast(query_mask, "bool"), (1, 3)))
    if key_mask is not None:
        masks.append(_with_axes(ops.cast(key_mask, "bool"), (1, 2)))
    if attention_mask is not None:
        masks.append(_to_rank4(attention_mask, "attention_mask"))
    if sliding_window is not None:
        window = sliding_window_mask(
            query_length, key_length, sliding_window, causal=causal, offset=offset
        )
        masks.append(_with_axes(window, (0, 1)))
    elif causal:
        masks.append(_with_axes(causal_mask(query_length, key_length, offset), (0, 1)))
    if valid_key_length is not None:
        filled = ops.arange(key_length) < valid_key_length
        masks.append(_with_axes(filled, (0, 1, 2)))
    if not masks:
        return None
    merged = masks[0]
    for mask in masks[1:]:
        merged = ops.logical_and(merged, mask)
    return merged


def _with_axes(mask, axes):
    """`mask` with a new axis of size 1 at each of `axes` (ascending).

    `expand_dims`, not `mask[:, None, ...]`: a strided slice that adds axes
    to a bool tensor of unknown shape is one op fewer graph converters can
    turn into a mobile runtime's builtin operators.
    """
    for axis in axes:
        mask = ops.expand_dims(mask, axis)
    return mask


def keras_mask(tensor):
    """The Keras mask attached to a tensor by a masking layer, or None."""
    return getattr(tensor, "_keras_mask", None)
