"""A crafted CIFAR-10 folder whose pickles run a shell command if unpickled: for the tests that
CIFAR is read only where the user points, and never by a plain unpickler."""

import os
import pickle


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _write_malicious_cifar(folder, marker):
    folder.mkdir(parents=True)
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / f, "wb") as fh:
            pickle.dump({"data": _Exploit(marker), "labels": [0]}, fh, protocol=2)
