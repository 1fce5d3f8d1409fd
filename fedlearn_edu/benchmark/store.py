"""The results folder's runs: ``<out>/runs/<key>.csv`` + ``<key>.json``, checked and written under a lock."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from pathlib import Path

from .execution import _code_sha256

# 2: several tuning seeds, the edge rule (each pick's final grid and edge flags in protocol.json),
# corrected tests in summary.csv. load() converts records of version 1 (no grids, no edge flags).
RECORD_VERSION = 2


def exact_floats() -> dict:
    """``read_csv`` options that read every float back exactly as it was written.

    Before pandas 3, ``read_csv``'s default float parser loses the last bit of about one value in
    seven (pandas 1.5-2.2: ``2.2587077753508797`` comes back as ``2.25870777535088``), so records
    read from disk would differ from the runs that wrote them; ``float_precision="round_trip"``
    parses exactly. pandas 3 parses exactly by default and deprecates the option.
    """
    import pandas as pd

    return {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest_sha(record: dict) -> str:
    """The checksum of a run's manifest: every field but this checksum, as canonical JSON."""
    body = {k: v for k, v in record.items() if k != "manifest_sha256"}
    return _sha(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _flat(config: dict, key: str) -> dict:
    """The run's settings as columns."""
    fed = config["federation"]
    out = {
        "run_key": key,
        "phase": config["phase"],
        "method": config["method"],
        "builder": config["builder"],
        "settings": json.dumps(config["settings"], sort_keys=True),
        "federation": fed["name"],
        "dataset": fed["dataset"],
        "partition": fed["partition"],
        "partition_params": json.dumps(fed["partition_params"], sort_keys=True),
        "num_clients": fed["num_clients"],
        "model": fed["model"],
        "noisy_clients": fed["noisy_clients"],
        "noise_fraction": fed["noise_fraction"],
        "num_samples": fed["num_samples"],
        "attack": fed.get("attack", ""),
        "attack_fraction": fed.get("attack_fraction", 0.0),
        "server_validation": config["server_validation"],
        "seed": config["seed"],
        **{k: config[k] for k in ("rounds", "clients_per_round", "local_epochs", "batch_size", "lr", "engine")},
    }
    for name, value in config["settings"].items():
        out[f"param_{name}"] = value
    return out


def _csv_bytes(config: dict, key: str, result: dict, meta: dict) -> bytes:
    import pandas as pd

    flat = _flat(config, key)
    rounds = config["rounds"]
    rows = [
        {**flat, **row, "evaluated": result["evaluated"], "sec_per_round": result["seconds"] / rounds, **meta}
        for row in result["rows"]
    ]
    buf = io.StringIO()
    pd.DataFrame(rows).to_csv(buf, index=False)
    return buf.getvalue().encode()


class _Store:
    """``<out>/runs/<key>.csv`` + ``<key>.json`` (written last, holding the csv's SHA-256).

    Checking a run (:meth:`status`) and writing one (:meth:`write`) hold an exclusive lock on
    ``runs/.lock``, so a sweep never takes another sweep's run, half written, for a damaged
    one; a lock held by a killed process is released with it.
    """

    STATUSES = ("ok", "failed")  # a manifest's status

    def __init__(self, out):
        self.out = Path(out)
        self.runs = self.out / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.redone: list[str] = []

    @contextlib.contextmanager
    def _locked(self):
        try:
            import fcntl
        except ImportError:  # not on POSIX: no lock (one sweep per folder)
            yield
            return
        fd = os.open(self.runs / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def status(self, key: str) -> str:
        """``"done"``, ``"failed"``, ``"missing"``, ``"corrupt"`` or ``"stale"`` (then the files are removed).

        ``"corrupt"``: a ``.csv`` without its ``.json``, or a ``.json`` that is not an object
        with this key, a status of :attr:`STATUSES`, the ``.csv``'s checksum and its own
        (``manifest_sha256``: a status or any other field changed after writing, the ``.csv``
        intact, is caught too). ``"stale"``: a run computed by other code than this package's
        (its ``code_sha256`` differs from :func:`_code_sha256`, or is missing: written before the
        check), or written in another ``record_version`` than :data:`RECORD_VERSION`.
        """
        with self._locked():
            return self._status(key)

    def _status(self, key: str) -> str:
        meta_path, csv_path = self.runs / f"{key}.json", self.runs / f"{key}.csv"
        if not meta_path.exists():
            if csv_path.exists():  # killed between the two writes
                self._drop(key)
                return "corrupt"
            return "missing"
        try:
            meta = json.loads(meta_path.read_text())
            if not isinstance(meta, dict) or meta.get("key") != key:
                raise ValueError("key")
            if meta.get("manifest_sha256") != _manifest_sha(meta):
                raise ValueError("manifest checksum")
            if meta["status"] not in self.STATUSES:
                raise ValueError("status")
            if meta["status"] == "failed":
                return "failed"
            if _sha(csv_path.read_bytes()) != meta["csv_sha256"]:
                raise ValueError("checksum")
        except (OSError, ValueError, KeyError, TypeError):
            self._drop(key)
            return "corrupt"
        if meta.get("code_sha256") != _code_sha256() or meta.get("record_version") != RECORD_VERSION:
            self._drop(key)
            return "stale"
        return "done"

    def _drop(self, key):
        self.redone.append(key)
        for suffix in (".json", ".csv"):
            (self.runs / f"{key}{suffix}").unlink(missing_ok=True)

    def write(self, key: str, config: dict, result: dict, meta: dict) -> None:
        record = {"key": key, "record_version": RECORD_VERSION, "config": config, **meta, "status": result["status"]}
        record["code_sha256"] = _code_sha256()
        if result["status"] == "ok":
            data = _csv_bytes(config, key, result, meta)
            record.update(csv_sha256=_sha(data), num_rows=len(result["rows"]), seconds=result["seconds"])
        else:
            record.update(error=result["error"], traceback=result["traceback"])
        record["manifest_sha256"] = _manifest_sha(record)
        manifest = json.dumps(record, indent=1, sort_keys=True).encode()
        with self._locked():  # the .csv and its .json: one step for every sweep that takes the lock
            if result["status"] == "ok":
                _atomic_write(self.runs / f"{key}.csv", data)
            else:
                (self.runs / f"{key}.csv").unlink(missing_ok=True)
            _atomic_write(self.runs / f"{key}.json", manifest)

    def meta(self, key: str) -> dict:
        return json.loads((self.runs / f"{key}.json").read_text())

    def frame(self, keys):
        import pandas as pd

        frames = [pd.read_csv(self.runs / f"{k}.csv", **exact_floats()) for k in keys]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
