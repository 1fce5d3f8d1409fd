"""A user's strategy module, as the registry, CLI and benchmark tests write it: one registered class.

``write_user_module`` writes it to a folder on ``sys.path``; ``restored_registry`` puts the
registry back as it was after a test that registered classes.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

from fedlearn_edu.strategies.registry import _REGISTRY

USER_MODULE = '''
from fedlearn_edu.strategies import FedAvg, register


@register
class Halved(FedAvg):
    """FedAvg at half its server step (a user's strategy)."""

    name = "{name}"

    def __init__(self, server_lr: float = 1.0):
        super().__init__(server_lr=server_lr / 2)
'''


def write_user_module(tmp_path, monkeypatch, module: str, name: str) -> str:
    """Write the user's module (class ``Halved`` registered as ``name``) to ``tmp_path``, importable as ``module``."""
    (tmp_path / f"{module}.py").write_text(USER_MODULE.format(name=name))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    return module


@contextmanager
def restored_registry():
    """Restore the strategy registry on exit (a test's registrations do not leak into the next test)."""
    before = dict(_REGISTRY)
    try:
        yield
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(before)
