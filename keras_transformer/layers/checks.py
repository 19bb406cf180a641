"""Argument checks shared by the layers: bad sizes fail early, naming the argument."""


def check_positive_int(**sizes):
    """Raise ValueError naming the first argument that is not a positive integer."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_rate(**rates):
    """Raise ValueError naming the first rate outside [0, 1)."""
    for name, value in rates.items():
        if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")


def check_heads_divide(d_model, num_heads):
    """Multi-head attention splits d_model into num_heads equal slices."""
    if d_model % num_heads != 0:
        raise ValueError(
            f"d_model={d_model} is not divisible by num_heads={num_heads}; "
            "choose a num_heads that divides d_model"
        )
