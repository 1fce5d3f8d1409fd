"""A data set that a chapter can always have: the one it asks for, or the bundled digits."""

from __future__ import annotations

from .datasets import load_dataset


def dataset_or_digits(name: str, *, root=None, download: bool = True) -> str:
    """``name`` if its files are on disk or can be downloaded now, else ``"digits"`` with a printed note.

    For notebooks run away from the repository (Colab, a chapter alone): MNIST and the others come
    from the folders :func:`~fedlearn_edu.data.load_dataset` searches, or from torchvision's download;
    without either (offline, say, or with ``FEDLEARN_OFFLINE=1``, which turns downloads off) the
    chapter goes on with scikit-learn's bundled digits.

    Args:
        name: a :func:`~fedlearn_edu.data.load_dataset` name, e.g. ``"mnist"``.
        root: passed to ``load_dataset``.
        download: passed to ``load_dataset`` (default: try to download).

    Returns:
        The name to load: ``name`` or ``"digits"``.

    Example:
        >>> dataset_or_digits("digits")
        'digits'
    """
    if name == "digits":
        return name
    try:
        load_dataset(name, root=root, download=download)
    except (OSError, RuntimeError) as err:  # not on disk and no download (URLError is an OSError)
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"Note: {name} is not available here ({first}); using scikit-learn's bundled digits instead.")
        return "digits"
    return name
