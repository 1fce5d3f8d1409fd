"""The committed grids' records: :func:`records_folder` finds (or downloads) them."""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

from ..checks import check_bool, check_instance, check_path
from .results import _RECORD_COLUMNS
from .store import _atomic_write

# The classroom grid's committed records, as files of the project's repository; the chapter
# *Comparing the methods* reads them. $FEDLEARN_BENCHMARK_URL replaces the base (tests serve a
# local folder); $FEDLEARN_BENCHMARK_RECORDS names a folder to read instead of the repository's.
RECORDS_URL = "https://raw.githubusercontent.com/fedlearn-edu/fedlearn-edu/main/benchmarks/results/classroom"
RECORDS_URL_VAR = "FEDLEARN_BENCHMARK_URL"
RECORDS_DIR_VAR = "FEDLEARN_BENCHMARK_RECORDS"
RECORD_FILES = ("records.csv.gz", "runs.csv", "protocol.json")  # what :func:`load` reads
# The records in the repository this package sits in (an editable install or a clone).
REPO_RECORDS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "classroom"


def _check_record_file(name: str, data: bytes) -> None:
    """Raise ValueError unless ``data`` is a readable ``name`` of a results folder."""
    import pandas as pd

    if name == "protocol.json":
        proto = json.loads(data.decode())
        missing = [k for k in ("picks", "tuning_seeds", "eval_seeds") if k not in proto]
    else:
        raw = gzip.decompress(data) if name.endswith(".gz") else data
        frame = pd.read_csv(io.BytesIO(raw), keep_default_na=False)
        missing = [c for c in _RECORD_COLUMNS[name] if c not in frame.columns]
        if not missing and len(frame) == 0:
            missing = ["any row"]
    if missing:
        raise ValueError(f"lacks {missing}")


GRIDS = ("classroom", "lab", "robust")  # the committed grids, folders of benchmarks/results


def classroom_records(root=None, download: bool = True) -> Path:
    """The folder of the classroom grid's records (the chapter *Comparing the methods*).

    :func:`records_folder` ``("classroom", root, download)``; see there.

    Args:
        root: the data folder downloads go under (``None``: the default).
        download: fetch the files when no folder holds them.

    Returns:
        The folder, holding at least :data:`RECORD_FILES`.
    """
    return records_folder("classroom", root, download)


def records_folder(grid: str = "classroom", root=None, download: bool = True) -> Path:
    """The folder of a committed grid's records, one of :data:`GRIDS` (``benchmarks/results/GRID``).

    ``"classroom"`` is the grid of the chapter *Comparing the methods* (bundled digits),
    ``"lab"`` its larger grid (Fashion-MNIST, 100 clients, 100 rounds), ``"robust"`` that of the
    chapter *When clients misbehave* (:data:`ROBUST_METHODS` x :data:`ROBUST_FEDERATIONS`).
    $FEDLEARN_BENCHMARK_RECORDS and $FEDLEARN_BENCHMARK_URL name the classroom grid's folder and
    base address; another grid's is the sibling folder (address) of that name.

    Looked for, in order (for the classroom grid): the folder ``$FEDLEARN_BENCHMARK_RECORDS``;
    the repository this package sits in (``benchmarks/results/classroom``, an editable install
    or a clone); ``../benchmarks/results/classroom`` (a chapter run from ``book/``); a copy
    downloaded before. Otherwise (a package installed from the index, on Colab) the files
    :func:`load` reads (:data:`RECORD_FILES`) are downloaded from :data:`RECORDS_URL` (or
    ``$FEDLEARN_BENCHMARK_URL``) into ``download_root(root)/benchmark-classroom``: each is
    checked (a gzip CSV or CSV with the expected columns, JSON with the protocol) and then
    renamed into place, so a broken download never sits there.

    Args:
        grid: ``"classroom"``, ``"lab"`` or ``"robust"``.
        root: the data folder downloads go under (``None``: ``$FEDLEARN_DATA``, else ``./data``;
            see :func:`fedlearn_edu.data.sources.download_root`).
        download: fetch the files when no folder holds them (ignored when
            ``$FEDLEARN_OFFLINE=1``).

    Returns:
        The folder, holding at least :data:`RECORD_FILES`; pass it to :func:`load`.

    Raises:
        FileNotFoundError: no folder holds the records and downloading is off.
        ConnectionError: a download failed (the URL is named).
        TypeError: ``grid`` not a string, ``root`` not a path, ``download`` not a bool.
        ValueError: a downloaded file is not what it should be (the URL is named), or an
            unknown grid.
    """
    import urllib.error
    import urllib.request

    from ..data.sources import OFFLINE_VAR, download_root, downloads_allowed

    check_instance(grid, "grid", str, f"one of {list(GRIDS)}")
    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {', '.join(map(repr, GRIDS))}; got {grid!r}.")
    if root is not None:
        check_path(root, "root", "the data folder's path or None")
    check_bool(download, "download")

    def sibling(path: Path) -> Path:
        return path if grid == "classroom" else path.parent / grid

    places = [sibling(Path(os.environ[RECORDS_DIR_VAR]).expanduser())] if os.environ.get(RECORDS_DIR_VAR) else []
    places += [sibling(REPO_RECORDS), Path("..") / "benchmarks" / "results" / grid]
    cache = download_root(root) / f"benchmark-{grid}"
    for place in [*places, cache]:
        if all((place / name).is_file() for name in RECORD_FILES):
            return place
    where = ", ".join(str(p) for p in [*places, cache])
    if not download or not downloads_allowed():
        why = f"${OFFLINE_VAR} is set" if download else "download=False"
        raise FileNotFoundError(
            f"The benchmark records ({', '.join(RECORD_FILES)}) are in none of: {where}; and {why}, so they "
            f"were not downloaded from {os.environ.get(RECORDS_URL_VAR) or RECORDS_URL}. Clone the repository "
            f"(github.com/fedlearn-edu/fedlearn-edu), set ${RECORDS_DIR_VAR} to a folder written by "
            f"`python -m fedlearn_edu benchmark --out FOLDER`, or allow the download."
        )
    base = (os.environ.get(RECORDS_URL_VAR) or RECORDS_URL).rstrip("/")
    if grid != "classroom":
        base = f"{base.rsplit('/', 1)[0]}/{grid}"
    cache.mkdir(parents=True, exist_ok=True)
    for name in RECORD_FILES:
        if (cache / name).is_file():
            continue
        url = f"{base}/{name}"
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                data = response.read()
        except (urllib.error.URLError, OSError) as err:
            raise ConnectionError(
                f"Could not download {url} ({err}). Without a network: clone the repository "
                f"(github.com/fedlearn-edu/fedlearn-edu) and set ${RECORDS_DIR_VAR} to its "
                f"benchmarks/results/{grid}, or copy {', '.join(RECORD_FILES)} into {cache}."
            ) from err
        try:
            _check_record_file(name, data)
        except Exception as err:
            raise ValueError(
                f"{url} is not a benchmark {name} ({type(err).__name__}: {err}); nothing was written to {cache}. "
                f"Check ${RECORDS_URL_VAR} or copy the file from a clone of the repository."
            ) from err
        _atomic_write(cache / name, data)
    return cache
