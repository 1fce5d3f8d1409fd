"""The book cannot state a number its code did not produce.

Every decimal number in a chapter's prose (its Markdown cells, exercise and solution
text included) must be one of:

* **glued** -- written as ``{glue:text}`key:.3f``` so the build pastes the value the cell
  computed (myst-nb ``glue``);
* **inside maths** -- ``$...$``, ``$$...$$`` or a ``{math}`` block: a definition, a setting
  or a derivation, not a measurement;
* **quoted from a paper** -- listed in ``QUOTED`` below, with the reason.

Code (fences, inline code, code cells) is not prose and is not scanned. A second test checks
that every glued key a chapter pastes is glued by one of its own code cells, so a renamed or
deleted ``glue(...)`` is caught without building the book.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import pytest

BOOK = Path(__file__).resolve().parents[2] / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb"))  # every notebook page: the chapters and the closing page

# Numbers quoted from the papers the chapters discuss (not computed by the book).
# Keep this short: a number the book computes is glued, not listed here.
QUOTED: dict[str, dict[str, str]] = {
    "ch04_craft": {
        "0.806": "CRAFT paper: CIFAR-10 ResNet-20 mean accuracy, round 500",
        "0.164": "CRAFT paper: its standard deviation across clients",
        "0.45": "CRAFT paper: best baselines' accuracy range, lower end",
        "0.52": "CRAFT paper: best baselines' accuracy range, upper end",
        "53.5": "CRAFT paper: relative gain over ConFIG (%)",
        "7.8": "CRAFT paper: gain over FedAvgM on FEMNIST (%)",
        "221.5": "CRAFT paper: worst-10% gain over FedLF (%)",
    },
    "ch06_fedoui": {
        "23.4": "FedOUI paper: FedOUI final accuracy, Dirichlet 0.1 (%)",
        "6.3": "FedOUI paper: its standard deviation over three seeds (points)",
        "21.6": "FedOUI paper: FedAvg final accuracy, Dirichlet 0.1 (%)",
        "28.2": "FedOUI paper: FedOUI best accuracy, Dirichlet 0.1 (%)",
        "28.0": "FedOUI paper: FedAvg best accuracy, Dirichlet 0.1 (%)",
        "31.8": "FedOUI paper: FedOUI best accuracy, noisy clients (%)",
        "31.0": "FedOUI paper: FedAvg best accuracy, noisy clients (%)",
        "23.1": "FedOUI paper: FedOUI final accuracy, noisy clients (%)",
        "27.3": "FedOUI paper: FedAvg final accuracy, noisy clients (%)",
        "6.10": "FedOUI authors' report: fitted Beta alpha of the worked example (asserted in the cell)",
        "15.94": "FedOUI authors' report: fitted Beta beta of the worked example (asserted in the cell)",
        "0.277": "FedOUI authors' report: mean OUI of the worked example",
        "0.257": "FedOUI authors' report: OUI of client 9 in the worked example",
    },
    "ch09_compare": {
        "80.6": "CRAFT authors' log: CIFAR-10 ResNet-20 mean accuracy, round 500 (%)",
        "23.1": "FedOUI paper: FedOUI final accuracy, noisy clients (%)",
        "27.3": "FedOUI paper: FedAvg final accuracy, noisy clients (%)",
        "23.4": "FedOUI paper: FedOUI final accuracy, Dirichlet 0.1 (%)",
        "21.6": "FedOUI paper: FedAvg final accuracy, Dirichlet 0.1 (%)",
        "79.75": "FL-Simulator's table: FedAvg, CIFAR-10, Dirichlet 0.3 (%)",
        "82.75": "FL-Simulator's table: SCAFFOLD, CIFAR-10, Dirichlet 0.3 (%)",
        "83.22": "FL-Simulator's table: FedDyn, CIFAR-10, Dirichlet 0.3 (%)",
    },
    "ch07_conditional": {
        "25.9": "client-conditional paper: IFCA's accuracy loss under sparsity (%)",
        "39.9": "client-conditional paper: Ditto's accuracy loss under sparsity (%)",
        "38.8": "client-conditional paper: FedAvg's accuracy loss under sparsity (%)",
    },
    "appendix_conditional": {
        "34.6": "client-conditional paper: DAC's accuracy loss under sparsity (%)",
        "72.0": "client-conditional paper: Gossip's accuracy loss under sparsity (%)",
    },
}

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")


def _cells(path: Path, kind: str) -> list[str]:
    """The sources of a notebook's cells of one kind (``"markdown"`` or ``"code"``)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        for c in nb["cells"]
        if c["cell_type"] == kind
    ]


def prose(markdown: str) -> str:
    """The prose of a MyST Markdown cell: code, maths, roles, directive options and labels removed.

    Directive bodies (``{exercise}``, ``{prf:proof}``, ``{admonition}`` ...) are prose and kept;
    fences without a directive (code) and ``{math}`` / ``{code-cell}`` blocks are dropped.
    """
    kept, stack = [], []  # stack of (fence, drop?)
    for line in markdown.splitlines():
        m = _FENCE.match(line)
        if m:
            fence, info = m.group(2), m.group(3).strip()
            if stack and fence[0] == stack[-1][0][0] and len(fence) >= len(stack[-1][0]) and not info:
                stack.pop()  # closes the innermost open fence
                continue
            drop = not info.startswith("{") or info.startswith(("{math}", "{code", "{glue"))
            stack.append((fence, drop))
            continue
        if any(drop for _, drop in stack):
            continue
        if re.match(r"^\s*:[\w-]+:", line) or re.match(r"^\s*\([\w-]+\)=\s*$", line):
            continue  # directive option (:label:, :class: ...) or a target label
        kept.append(line)
    text = "\n".join(kept)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)  # display maths
    text = re.sub(r"(?<!\\)\$[^$\n]+?(?<!\\)\$", " ", text)  # inline maths
    text = re.sub(r"\\\((.*?)\\\)", " ", text, flags=re.S)
    text = re.sub(r"\{[\w:.-]+\}`[^`]*`", " ", text)  # roles: {glue:text}`k:.3f`, {cite}`...`, {math}`...`
    text = re.sub(r"`[^`]*`", " ", text)  # inline code
    text = re.sub(r"<[^>]+>", " ", text)  # HTML
    text = re.sub(r"https?://\S+", " ", text)
    return text


def bare_numbers(markdown: str) -> list[str]:
    """The decimal numbers written in the prose of a Markdown cell."""
    return _DECIMAL.findall(prose(markdown))


def test_the_scanner_finds_bare_numbers_and_ignores_the_rest():
    md = (
        "FedAvg reaches 0.906 here and $\\alpha = 0.1$ there, {glue:text}`acc:.3f` glued,\n"
        "`lr=0.05` in code, $$x = 1.5$$ in maths, version 1.2.3, {cite}`a2020`.\n"
        "```python\nprint(0.75)\n```\n"
        "```{exercise} Title\n:label: ex-1\nThe paper reports 53.5 %.\n```\n"
        "```{math}\ny = 2.5\n```\n"
    )
    assert bare_numbers(md) == ["0.906", "53.5"]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_bare_numbers_in_chapter_prose(path: Path):
    allowed = QUOTED.get(path.stem, {})
    found = [(i, n) for i, md in enumerate(_cells(path, "markdown")) for n in bare_numbers(md)]
    bare = [(i, n) for i, n in found if n not in allowed]
    assert not bare, (
        f"{path.name}: numbers in the prose that are neither glued from the cell that computes them, "
        f"nor inside maths, nor listed in QUOTED as quoted from a paper (markdown cell, number): {bare}"
    )
    stale = sorted(set(allowed) - {n for _, n in found})
    assert not stale, f"{path.name}: QUOTED lists numbers the prose no longer contains: {stale}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_pasted_value_is_glued_in_the_chapter(path: Path):
    pasted = {
        m.group(1).rsplit(":", 1)[0] if m.group(0).startswith("{glue:text}") else m.group(1)
        for md in _cells(path, "markdown")
        for m in re.finditer(r"\{glue(?::\w+)?\}`([^`]+)`", md)
    }
    glued = {m.group(1) for code in _cells(path, "code") for m in re.finditer(r"""glue\(\s*f?["']([^"']+)["']""", code)}
    missing = sorted(k for k in pasted if k not in glued and not any(_matches(k, g) for g in glued))
    assert not missing, f"{path.name}: the prose pastes keys no code cell glues: {missing}"


def _matches(key: str, pattern: str) -> bool:
    """A key glued by an f-string, e.g. ``glue(f"acc-{name}", ...)`` covers ``acc-FedAvg``."""
    if "{" not in pattern:
        return False
    regex = re.escape(pattern)
    regex = re.sub(r"\\\{[^}]*\\\}", ".+", regex)
    return re.fullmatch(regex, key) is not None


# Comparative words. Next to a glued number, "better", "ahead" and the like must come with a verdict the
# chapter computed (fedlearn_edu.stats: a paired test, corrected where a table makes many comparisons),
# pasted in the same paragraph: a glued key naming a verdict, a count of verdicts or an adjusted p-value.
# "Tie" is never a verdict: a difference that is not significant is inconclusive (book/notation.md).
_COMPARATIVE = re.compile(r"\b(ties?|tied|ahead|behind|better|worse|beats?|outperforms?)\b", re.I)
_TIE = re.compile(r"\b(ties?|tied)\b", re.I)
_VERDICT_KEY = re.compile(r"verdict|better|worse|inconclusive|equiv|holm|(^|-)p($|-)")

# Paragraphs whose comparative words are not a claim about this chapter's runs, with the reason.
# A key is a phrase of the paragraph's prose that identifies it.
WORDING_OK: dict[str, dict[str, str]] = {
    "ch09_compare": {
        "might have done better still": "a hypothetical about the tuning grid, not a result",
        "better or worse after Holm": "shares of verdicts counted by benchmark.verdict_counts",
        "The guide reads the corrected verdicts": "defines how the guide reads its verdicts",
        "with Holm's step-down keeping the": "the multiplicity plan: defines the families, not a result",
        "each verdict is tested again with the exact sign-flip": "the multiplicity plan: the checks of a verdict",
        "Each point below is one method's paired difference": "the forest plot's legend: defines better/worse",
    },
    "ch10_robust": {
        "the paired difference to FedAvg on the same": "the table's legend: defines better/worse",
        "significantly better than FedAvg": "introduces the verdict table that follows",
        "Which robust rules are better than FedAvg under each attack is in": "points to the verdict figures",
    },
}


def paragraphs(markdown: str) -> list[str]:
    """A Markdown cell cut into paragraphs: blank lines, list items and table rows start a new one."""
    out, current = [], []
    for line in markdown.splitlines():
        if not line.strip() or re.match(r"^\s*([-*]|\d+\.) |^\|", line):
            if current:
                out.append("\n".join(current))
            current = [line] if line.strip() else []
        else:
            current.append(line)
    if current:
        out.append("\n".join(current))
    return out


def unbacked_comparisons(markdown: str, allowed: Mapping[str, str] = MappingProxyType({})) -> list[str]:
    """Paragraphs that say "tie", or put a comparative word next to a glued number without a glued verdict."""
    bad = []
    for para in paragraphs(markdown):
        text = re.sub(r"\s+", " ", prose(para))
        if any(phrase in text for phrase in allowed):
            continue
        keys = re.findall(r"\{glue(?::\w+)?\}`([^`:]+)", para)
        backed = any(_VERDICT_KEY.search(k) for k in keys)
        if _TIE.search(text) or (keys and _COMPARATIVE.search(text) and not backed):
            bad.append(text.strip()[:160])
    return bad


def test_the_wording_check_wants_a_verdict_next_to_a_comparison():
    assert unbacked_comparisons("FedVG is better than FedAvg ({glue:text}`gain:+.3f`).")
    assert unbacked_comparisons("The two methods tie.")
    assert not unbacked_comparisons("FedVG is better ({glue:text}`gain:+.3f`, {glue:text}`gain-verdict`).")
    assert not unbacked_comparisons("FedVG minus FedAvg is {glue:text}`gain:+.3f`: {glue:text}`n-inconclusive` of 3.")
    assert not unbacked_comparisons("A better optimiser needs no numbers here.")
    assert not unbacked_comparisons("Ours is better ({glue:text}`x`).", {"Ours is better": "a reason"})


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_comparisons_in_the_prose_are_backed_by_a_verdict(path: Path):
    allowed = WORDING_OK.get(path.stem, {})
    texts = [re.sub(r"\s+", " ", prose(md)) for md in _cells(path, "markdown")]
    bad = [p for md in _cells(path, "markdown") for p in unbacked_comparisons(md, allowed)]
    assert not bad, (
        f"{path.name}: 'tie', or a comparison next to a glued number without a glued verdict (paste the "
        f"verdict from fedlearn_edu.stats, or list the paragraph in WORDING_OK with the reason): {bad}"
    )
    stale = sorted(phrase for phrase in allowed if not any(phrase in t for t in texts))
    assert not stale, f"{path.name}: WORDING_OK lists phrases the prose no longer contains: {stale}"


# --------------------------------------------------------------------------- one meaning of ±

_GLUE_ROLE = re.compile(r"\{glue(:\w+)?\}`[^`]*`")  # a pasted value: its key may name the "std" metric
_PM_SPREAD = re.compile(r"±[^\n]{0,40}\b(std|sd|standard deviation)\b|\b(std|standard deviation)\b[^\n]{0,12}±", re.I)


def pm_as_spread(text: str) -> list[str]:
    """Lines that write a spread (a standard deviation) with "±", which the book keeps for its 95 % half-width."""
    return [line.strip() for line in text.splitlines() if _PM_SPREAD.search(_GLUE_ROLE.sub("x", line))]


def test_the_pm_check_finds_a_standard_deviation_written_with_pm():
    assert pm_as_spread('print(f"final round, mean ± std over {n} seeds")')
    assert pm_as_spread("Accuracy is in percent, mean ± standard deviation over the three seeds;")
    assert pm_as_spread('f"{mu:.3f} ± {sd:.3f}"  # std over seeds')
    assert not pm_as_spread("mean ± the half-width of its 95 % t-interval; the std column is the spread")
    assert not pm_as_spread('cols = [f"{mu:.3f} ± {h:.3f}" for mu, h in cells]')
    assert not pm_as_spread("spread {glue:text}`craft-final-std:.3f` ± {glue:text}`craft-final-std-half:.3f`")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_pm_means_the_95_percent_half_width_everywhere(path: Path):
    """notation.md: "±" after a mean or a difference is the 95 % half-width, in prose and printed tables."""
    bad = [line for kind in ("markdown", "code") for cell in _cells(path, kind) for line in pm_as_spread(cell)]
    assert not bad, f"{path.name}: a standard deviation written with '±' (print the half-width, or write 'sd'): {bad}"


# --------------------------------------------------------------------------- exploratory results

# Glued results outside the book's multiplicity plan (chapter 9: a comparison chosen after seeing the data,
# one outside the corrected families, an uncorrected test): the paragraph that pastes one says *exploratory*.
EXPLORATORY: dict[str, tuple[str, ...]] = {
    "ch10_robust": ("rb-dp1-gain", "rb-dp-zfree"),  # dp1 - dp0, direction read off the data; an overlap rule
    "evidence": ("ev-craft-avgm-verdict",),  # CRAFT - FedAvgM, outside the grid's families
}


@pytest.mark.parametrize("stem", sorted(EXPLORATORY))
def test_results_outside_the_multiplicity_plan_are_labelled_exploratory(stem):
    texts = [md for md in _cells(BOOK / f"{stem}.ipynb", "markdown")]
    for key in EXPLORATORY[stem]:
        found = [
            p for md in texts for p in paragraphs(md) if re.search(rf"\{{glue(?::\w+)?\}}`{re.escape(key)}[`:]", p)
        ]
        assert found, f"{stem}: no paragraph pastes {key!r}; update EXPLORATORY with the chapter"
        unlabelled = [p for p in found if "exploratory" not in p.lower()]
        assert not unlabelled, f"{stem}: {key} is pasted without the word 'exploratory': {unlabelled[0][:200]}"
