"""The student build: the book with its exercises' solutions hidden.

    FEDLEARN_HIDE_SOLUTIONS=1 jupyter-book build . --path-output _build/student

(or ``hide_solutions: true`` under ``sphinx.config`` in a copy of ``_config.yml``) writes the
site to ``_build/student/_build/html``: every exercise without its solution, its prose and its
code cells, and none of the ways to them the reader's build offers: no reader's copies (their
solutions are collapsed, not gone), no Colab/Binder buttons (they open those copies), no
download button and no ``_sources/`` (they hold the chapters as written).

sphinx-exercise's own ``hide_solutions`` drops a gated solution's ``{solution-start}`` but not
its ``{solution-end}`` (the HTML writer then fails on that node) nor the cells between them, the
book's solutions being gated; so this extension turns that setting off again and removes each
solution after sphinx-exercise has merged it, whole (:class:`RemoveSolutions`).
"""

from __future__ import annotations

import os

from sphinx.transforms import SphinxTransform

ENV = "FEDLEARN_HIDE_SOLUTIONS"


def _configure(app, config) -> None:
    hide = bool(config.hide_solutions) or os.environ.get(ENV, "").strip() not in ("", "0")
    config.fedlearn_hide_solutions = hide
    if not hide:
        return
    config.hide_solutions = False  # see the module's docstring: RemoveSolutions hides them whole
    config.html_copy_source = False
    options = dict(config.html_theme_options or {})
    options["use_download_button"] = False
    options["launch_buttons"] = {}
    config.html_theme_options = options


class RemoveSolutions(SphinxTransform):
    """Remove every (merged) solution of a page in the student build."""

    default_priority = 11  # after sphinx-exercise's MergeGatedSolutions (10)

    def apply(self, **kwargs) -> None:
        if not self.config.fedlearn_hide_solutions:
            return
        from sphinx_exercise.nodes import solution_node

        for node in list(self.document.findall(solution_node)):
            node.parent.remove(node)


def setup(app):
    app.setup_extension("sphinx_exercise")
    app.add_config_value("fedlearn_hide_solutions", False, "env")
    app.connect("config-inited", _configure, priority=400)
    app.add_transform(RemoveSolutions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
