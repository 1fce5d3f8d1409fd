"""What the book's chapters use to bind their prose to their outputs.

:func:`glue` records a value computed in a chapter cell under a name, so that the text can
show it with ``{glue:text}`name:.3f``` (myst-nb). The value is stored as a plain Python
number or string, so that the book's formatter reads it back (a NumPy scalar would be
stored as ``np.float64(0.9)``, which cannot be formatted). Outside a myst-nb build -- in
Colab, say, where ``myst_nb`` is not installed -- glueing does nothing and the cell runs on.
"""

from __future__ import annotations

import numbers

__all__ = ["glue", "plain"]


def plain(value):
    """``value`` as a built-in ``float``, ``int``, ``bool`` or ``str``.

    Args:
        value: a Python or NumPy scalar, a 0-d or one-element ``torch.Tensor`` / ``ndarray``,
            or a string.

    Returns:
        The same value as a built-in type.

    Raises:
        TypeError: for anything with more than one element (glue one number at a time).

    Example:
        >>> import numpy as np
        >>> plain(np.float64(0.25)), plain(np.int64(3)), plain("FedAvg")
        (0.25, 3, 'FedAvg')
    """
    if isinstance(value, (str, bool)):
        return value
    if hasattr(value, "numel") and callable(value.numel):  # torch.Tensor
        if value.numel() != 1:
            raise TypeError(f"glue one number at a time; got a tensor of shape {tuple(value.shape)}.")
        return value.item()
    if hasattr(value, "size") and hasattr(value, "item") and not isinstance(value, numbers.Number):  # ndarray
        if value.size != 1:
            raise TypeError(f"glue one number at a time; got an array of shape {value.shape}.")
        return value.item()
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"glue takes a number or a string; got {type(value).__name__}.")


def glue(name: str, value, display: bool = False) -> None:
    """Record ``value`` under ``name`` for the chapter's text (myst-nb's ``glue``).

    Args:
        name: the key the text pastes, e.g. ``{glue:text}`name:.3f```.
        value: a number or a string (see :func:`plain`).
        display: also show the value in the cell's output.
    """
    value = plain(value)
    try:
        from myst_nb import glue as myst_glue
    except ImportError:  # not building the book: nothing to bind
        return
    myst_glue(name, value, display=display)
