"""Write book/ch09_robust.ipynb from the cells below (run once; the notebook is the source afterwards)."""

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
setup = json.loads((REPO / "book" / "ch08_compare.ipynb").read_text(encoding="utf-8"))["cells"][1]

cells = []


def md(text):
    cells.append({"cell_type": "markdown", "metadata": {}, "source": text.strip("\n")})


def code(text, metadata=None):
    cells.append(
        {
            "cell_type": "code",
            "execution_count": None,
            "metadata": metadata or {},
            "outputs": [],
            "source": text.strip("\n"),
        }
    )


md(r"""
# When clients misbehave, and when they must stay private

FedAvg trusts its clients twice: it averages whatever they send, and it sees what each of them
sends. This chapter takes both away. Some clients now **attack** — they flip their labels, send
the opposite of their update, noise, or a carefully small lie — and the server must aggregate
without knowing who they are. And every client must stay **private**: the server may learn only
a noisy sum (differential privacy) or only a sum at all (secure aggregation). Each of the two
constraints rules out some of the book's methods, and the robust rules have a cost of their own
that an honest but unusual client pays.

**What you will learn**

- the robust aggregation rules — coordinate-wise median and trimmed mean
  {cite}`yin2018byzantine`, Krum and Multi-Krum {cite}`blanchard2017krum`, Bulyan
  {cite}`elmhamdi2018bulyan`, the geometric median (RFA) {cite}`pillutla2022rfa`, centered
  clipping {cite}`karimireddy2021centeredclipping` and norm clipping {cite}`sun2019backdoor` —
  with their breakdown points and the assumption behind Krum's guarantee;
- what they buy under five kinds of attack, with intervals, and what they cost when nobody
  attacks but the clients differ — *does a robust rule mistake a rare but honest client for an
  attacker?*;
- client-level differential privacy with DP-FedAvg {cite}`mcmahan2018dpfedavg`: the sensitivity
  of a clipped sum, why data-dependent weights (FedVG's, FedOUI's) break it, and the privacy
  accountant (Rényi DP {cite}`mironov2017renyi`); the accuracy–$\varepsilon$ curve of the
  classroom setting;
- secure aggregation {cite}`bonawitz2017secagg`: why pairwise masks cancel, and which of the
  package's strategies can run when the server sees only sums.

**Prerequisites.** Chapter 1 (FedAvg, the partitions, the worst-10 % accuracy), the fair
comparison of {doc}`ch08_compare` (paired differences, t-intervals, ties), and
{doc}`ch07_flower` for the clients-and-server picture.
""")

code(setup["source"] if isinstance(setup["source"], str) else "".join(setup["source"]), setup["metadata"])

md(r"""
## The threat model

A round of FedAvg receives the updates $\Delta_1, \dots, \Delta_m$ of the $m$ selected clients
and moves the model by their weighted mean. In this chapter $f$ of the $m$ updates may be
*Byzantine*: arbitrary vectors, chosen by an adversary who may know the honest updates and the
rule. The attackers of the experiments ({mod}`fedlearn_edu.attacks`; a fixed share of the
$N$ clients, drawn by the run's seed, attack in every round they are selected):

- **label flipping** — the attackers train honestly on labels $y \mapsto C - 1 - y$ (a data
  attack: their updates look like updates);
- **sign flipping** — they send $-\Delta_i$;
- **Gaussian** — they send $\mathcal N(0, I)$ noise, whatever the model;
- **ALIE**, "a little is enough" {cite}`baruch2019alie` — every attacker sends
  $\mu_j - z\,\sigma_j$ per coordinate, with $\mu$ and $\sigma$ the mean and standard deviation
  of the round's honest updates: a lie small enough to hide inside the honest spread;
- and, not in the grid but in the package, scaling and model replacement
  {cite}`bagdasaryan2020backdoor` (an update scaled so that FedAvg's step lands on the
  attacker's model) and free riders.

FedAvg's mean has no defence at all: one client that sends $\Delta = m\,(X - \theta) - \sum_{i
\neq 1} \Delta_i$ sets the next model to any $X$ it likes.
""")

code(r"""
import json
import os

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import HTML, display
from scipy import stats

import fedlearn_edu as fl
from fedlearn_edu import benchmark, privacy, secagg
from fedlearn_edu.aggregators import coordinate_median, krum, krum_scores, norm_clip, trimmed_mean
from fedlearn_edu.book import glue   # binds the text to the numbers this notebook computes
from fedlearn_edu.strategies import STRATEGIES, ClientUpdates, DPFedAvg, FedAvg, FedVG, Krum

torch.set_num_threads(1)
# The grid is read from committed records (classroom scale, the bundled digits). FEDLEARN_FULL=1
# scales up the live studies of this chapter: more re-runs of the records, rounds and seeds.
FULL = os.environ.get("FEDLEARN_FULL") == "1"


def show_table(header, rows):
    pad = 'style="padding: 0.2em 0.5em; text-align: right"'
    html = '<table style="border-collapse: collapse; font-size: 85%"><thead><tr>'
    html += "".join(f"<th {pad}>{h}</th>" for h in header) + "</tr></thead><tbody>"
    html += "".join("<tr>" + "".join(f"<td {pad}>{c}</td>" for c in r) + "</tr>" for r in rows)
    display(HTML(html + "</tbody></table>"))


RECORDS = benchmark.records_folder("robust")  # the repository's benchmarks/results/robust, else downloaded once
result = benchmark.load(RECORDS)
runs, records, protocol = result.runs, result.records, result.protocol
configs = {k: json.loads(c) for k, c in zip(runs.run_key, runs.config)}
first = next(iter(configs.values()))
FEDS = list(dict.fromkeys(runs.federation))
METHODS = list(dict.fromkeys(runs.method))
BASE = FEDS[0]                                  # the federation without attackers
ATTACKED = [f for f in FEDS if "+" in f]        # the same federation with attackers
HETERO = [BASE] + [f for f in FEDS if "+" not in f and f != BASE]   # no attacker, more and more heterogeneous
KINDS = list(dict.fromkeys(f.split("+")[1].split(":")[0] for f in ATTACKED))
FRACTIONS = sorted({float(f.split(":")[-1]) for f in ATTACKED})
ROBUST = ["median", "trimmedmean", "krum", "multikrum", "bulyan", "geometricmedian", "centeredclipping", "normclipping"]
DP = [m for m in METHODS if m.startswith("dp")]
assert set(ROBUST + DP + ["fedavg", "fedvg", "fedoui"]) == set(METHODS)
assert (runs.status == "ok").all() and set(runs.phase) == {"eval"}
assert all(c["settings"]["server_lr"] == 1.0 for c in configs.values())  # no method is tuned
assert len(protocol.eval_seeds) >= 3
glue("rb-runs", len(runs))
glue("rb-methods", len(METHODS))
glue("rb-feds", len(FEDS))
glue("rb-clients", first["federation"]["num_clients"])
glue("rb-m", protocol.clients_per_round)
glue("rb-rounds", protocol.rounds)
glue("rb-lr", protocol.lr)
glue("rb-lastk", protocol.last_k)
glue("rb-n-seeds", len(protocol.eval_seeds))
glue("rb-kinds", len(KINDS))
glue("rb-frac-lo", 100 * FRACTIONS[0])
glue("rb-frac-hi", 100 * FRACTIONS[-1])
print(f"{len(runs)} evaluation runs: {len(METHODS)} methods x {len(FEDS)} federations x {len(protocol.eval_seeds)} seeds; "
      f"{first['federation']['dataset']}, {first['federation']['model']}, {first['federation']['num_clients']} clients, "
      f"{protocol.clients_per_round} per round, {protocol.rounds} rounds; package {runs.package_version.iloc[0]}")
""")

md(r"""
## Breakdown points: the median and the trimmed mean

The **breakdown point** of an aggregation rule is the smallest fraction of its inputs that,
chosen adversarially, can move its output arbitrarily far. The mean's is $1/m$: one input
suffices. Work coordinate by coordinate. The **median** of $m$ values stays between the
smallest and the largest *honest* value as long as fewer than half the values are Byzantine:
with $f < m/2$, at least one honest value lies on each side of the median, so the attackers can
push it to the edge of the honest range and no further. Its breakdown point is $1/2$.

The **trimmed mean** {cite}`yin2018byzantine` with parameter $\beta$ sorts the $m$ values of a
coordinate, drops the $b = \lfloor \beta m \rfloor$ smallest and the $b$ largest and averages the
rest:

$$
\mathrm{TM}_\beta(x_1, \dots, x_m) = \frac{1}{m - 2b} \sum_{k=b+1}^{m-b} x_{(k)},
\qquad b = \lfloor \beta m \rfloor .
$$ (rb-eq-tm)

If $f \le b$, every value kept is either honest or lies between two honest values (an attacker
above the largest honest value is among the $b$ cut at the top, since at most $f \le b$ values
can be there), so the output stays inside the honest range: breakdown point $\lfloor \beta m
\rfloor / m \approx \beta$. With $f > b$, one attacker survives the cut at an arbitrary value
and drags the average with weight $1/(m-2b)$. Both rules are guarantees on *each coordinate*,
not on the vector: in $d$ dimensions the attackers can sit at the edge of the honest range in
every coordinate at once, at a distance of order $\sqrt d$ times the honest spread — which is
the room ALIE uses.

From scratch, checked against the package:
""")

code(r"""
def trimmed_mean_numpy(x, beta):
    x = np.sort(np.asarray(x, dtype=np.float64), axis=0)   # per coordinate, along the client axis
    b = int(np.floor(beta * x.shape[0]))
    return x[b : x.shape[0] - b].mean(axis=0)


rng = np.random.default_rng(0)
for m, beta in ((10, 0.1), (7, 0.2), (20, 0.3), (5, 0.0)):
    x = rng.normal(size=(m, 6))
    np.testing.assert_allclose(trimmed_mean(torch.tensor(x), beta).numpy(), trimmed_mean_numpy(x, beta), rtol=1e-12)
    np.testing.assert_allclose(coordinate_median(torch.tensor(x)).numpy(), np.median(x, axis=0), rtol=1e-12)
print("trimmed mean and median: from scratch == fedlearn_edu.aggregators")

# the breakdown point, measured: m = 20 honest-looking values in [-1, 1], f of them replaced by 1e6
m, beta = 20, 0.1
b = int(beta * m)
honest = rng.uniform(-1, 1, size=(m, 1))
rows = []
for f in range(0, 5):
    x = honest.copy()
    x[:f] = 1e6
    tm, med, mean = trimmed_mean_numpy(x, beta)[0], np.median(x[:, 0]), x.mean()
    inside = bool(honest[f:].min() <= tm <= honest[f:].max())
    assert inside == (f <= b)   # the derivation: the output stays in the honest range exactly while f <= b
    assert abs(med) <= 1        # the median holds while f < m / 2
    rows.append([f, f"{mean:.3g}", f"{tm:.3g}", f"{med:.3g}", "yes" if inside else "no"])
show_table(["attackers f", "mean", f"trimmed mean (b = {b})", "median", "trimmed mean in the honest range?"], rows)
glue("rb-tm-b", b)
""")

md(r"""
With $\beta$ = {glue:text}`rb-tm-b` / $m$ the trimmed mean holds up to {glue:text}`rb-tm-b`
attackers and breaks with one more; the median holds throughout. The package's `TrimmedMean`
uses $\beta = 0.1$ by default — so in the experiments below it is *out of its guarantee* at the
larger attacker share, on purpose: a defender does not know $f$.

## Krum: the update closest to its neighbours

Krum {cite}`blanchard2017krum` scores every client by how close it is to its nearest others,

$$
s(i) = \sum_{j \in \mathcal N_i} \lVert \Delta_i - \Delta_j \rVert^2,
\qquad \mathcal N_i = \text{the } m - f - 2 \text{ clients nearest to } i \ (j \neq i),
$$ (rb-eq-krum)

and returns the update with the lowest score (Multi-Krum averages the $k$ lowest). Why
$m - f - 2$: an honest client's $m - f - 2$ nearest neighbours can always be chosen among the
other $m - f - 1$ honest clients *minus one*, which leaves slack for the argument to bound the
score of whoever wins by honest distances.

**The guarantee and its assumption.** Blanchard et al. prove that if $2f + 2 < m$ and the honest
updates are **independent draws from one distribution** with mean $g$ (the true gradient) and
variance $\sigma^2$ per coordinate — IID honest clients — then Krum's output $K$ satisfies
$\langle \mathbb E K, g \rangle \ge (1 - \sin\alpha)\lVert g \rVert^2 > 0$ whenever
$\eta(m, f)\sqrt d\,\sigma < \lVert g \rVert$, with $\eta(m, f) = O(m)$ for large $f$: the
chosen update points, on average, within an angle $\alpha$ of the true gradient. Every step of
the proof uses that honest updates are *alike* — close to each other because they estimate the
same $g$. A federated client with unusual data is honest and *far* from the others: its score
is large, Krum never picks it, and the model never learns from it. Under heterogeneity the
assumption fails and so, in practice, does the guarantee: Krum then follows one typical client
per round. Bulyan {cite}`elmhamdi2018bulyan` (Krum selects $m - 2f$ clients, then a trimmed
mean of those per coordinate; $4f + 3 \le m$) rests on the same assumption.

From scratch, and the rare honest client:
""")

code(r"""
def krum_numpy(x, f):
    x = np.asarray(x, dtype=np.float64)
    m = x.shape[0]
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    scores = np.array([np.sort(np.delete(d2[i], i))[: m - f - 2].sum() for i in range(m)])
    return x[int(np.argmin(scores))], scores


for m, f in ((7, 2), (20, 8), (11, 4)):
    x = rng.normal(size=(m, 5))
    pick, scores = krum_numpy(x, f)
    np.testing.assert_allclose(krum_scores(torch.tensor(x), f).numpy(), scores, rtol=1e-12)
    np.testing.assert_array_equal(krum(torch.tensor(x), f).numpy(), pick)
print("Krum: from scratch == fedlearn_edu.aggregators.krum (scores and pick)")

# nine typical honest clients and one honest client with unusual data (its update points elsewhere)
typical = rng.normal(size=(9, 5)) * 0.3 + np.array([1.0, 0, 0, 0, 0])
rare = np.array([[0.0, 2.0, 0, 0, 0]])
x = np.vstack([typical, rare])
_, scores = krum_numpy(x, f=3)
rank_of_rare = int((scores < scores[-1]).sum())
assert rank_of_rare == len(x) - 1   # the rare honest client has the worst score of all
print(f"scores of the typical clients {np.round(scores[:-1], 1)}; of the rare one {scores[-1]:.1f} (the largest)")
""")

md(r"""
## The experiments

One grid, run once with the benchmark's command line (the exact command is in the records'
README, `benchmarks/results/robust/`) and committed with the book, like the comparison of
{doc}`ch08_compare`: {glue:text}`rb-methods` methods on {glue:text}`rb-feds` federations, each
on {glue:text}`rb-n-seeds` seeds — {glue:text}`rb-runs` runs. The setting is the classroom's:
the bundled digits, an MLP, {glue:text}`rb-clients` clients of which {glue:text}`rb-m` take part
in every round (so the $f$ attackers are in every round), {glue:text}`rb-rounds` rounds of one
local epoch at client learning rate {glue:text}`rb-lr:.2f`.

- **Federations.** `dirichlet:0.5` (label skew, Dirichlet $\alpha = 0.5$) without attackers, and
  the same with {glue:text}`rb-frac-lo:.0f` % and {glue:text}`rb-frac-hi:.0f` % of the clients
  attacking, for each of {glue:text}`rb-kinds` kinds (label flipping, sign flipping, Gaussian,
  ALIE); then, without attackers, two federations of stronger heterogeneity (`dirichlet:0.1`
  and `shards:2`, two label shards per client).
- **Methods.** FedAvg; the re-weighting rules of the book, FedVG and FedOUI; the eight robust
  rules at the package's defaults (Krum's, Multi-Krum's and Bulyan's $f$ the largest their rule
  tolerates with $m$ clients, the trimmed mean's $\beta = 0.1$, clipping norms and $\tau = 1$);
  and DP-FedAvg with clipping norm $C = 0.5$ at noise multipliers $z \in \{0, 0.1, 0.3, 1\}$
  ($z = 0$: clipping only) — names `dp0`, `dp0.1`, `dp0.3`, `dp1`.
- **The server step.** Every method takes $\eta_s = 1$, *untuned*: each of these rules returns
  an aggregate in the units of one client's update (a mean, a median, a selected update), so
  $\eta_s = 1$ means "move by the aggregate" for all of them, and a step tuned on attacked runs
  would be tuned to the attack. This is a difference from {doc}`ch08_compare`, where every step
  was tuned; a rule that would gain from a larger step is disadvantaged alike here, and FedAvg
  with it.

A seed fixes the partition, the model's initialisation, the batch orders *and which clients
attack*: all methods face the same attackers on a seed, so differences on one seed are paired.
The cell below re-runs a sample of the records live and checks that every number comes out
the same, bit for bit (the test suite re-runs another sample).
""")

code(r"""
rng_live = np.random.default_rng(2027)
light = runs[runs.method.isin(["fedavg", "median", "geometricmedian", "dp1", "fedoui", "multikrum"])]
sample = light.iloc[np.sort(rng_live.choice(len(light), size=6 if FULL else 2, replace=False))]
for _, run in sample.iterrows():
    live = benchmark.execute(configs[run.run_key])
    assert live["status"] == "ok", live.get("error")
    rec = records[records.run_key == run.run_key].sort_values("round")
    for column in ("mean", "std", "worst10", "best10", "loss", "train_loss"):
        again = np.array([row[column] for row in live["rows"]])
        assert np.array_equal(again, rec[column].to_numpy(), equal_nan=True), (run.run_key, column)
    print(f"{run.method} on {run.federation}, seed {run.seed}: {len(rec)} rounds, identical to the records")
glue("rb-live", len(sample))
""")

md(r"""
All {glue:text}`rb-live` sampled runs came out identical to the records.

### Under attack

Mean client accuracy over the last {glue:text}`rb-lastk` rounds, mean over the seeds ± the
half-width of the 95 % t-interval; below it the paired difference to FedAvg on the same seeds,
**better** or **worse** when its interval excludes zero, *tie* when it does not. The first
column has no attacker. Rules keep the chapter's order: the table is not a ranking.
""")

code(r"""
summary = result.summary()
cell = {(r.federation, r.method): r for r in summary.itertuples()}


def label(f):
    if "+" not in f:
        return f if f != BASE else "no attack"
    kind, frac = f.split("+")[1].split(":")
    return f"{kind.replace('_', ' ')} {100 * float(frac):.0f} %"


def cell_text(f, m, metric="lastk"):
    r = cell[(f, m)]
    text = f"{100 * getattr(r, metric):.1f} ± {100 * getattr(r, metric + '_ci'):.1f}"
    verdict = getattr(r, "vs_" + metric)
    if verdict != "baseline":
        d, h = 100 * getattr(r, "d_" + metric), 100 * getattr(r, "d_" + metric + "_ci")
        word = f"<b>{verdict}</b>" if verdict != "tie" else "<i>tie</i>"
        text += f"<br><span style='font-size: 85%'>{d:+.1f} ± {h:.1f} {word}</span>"
    return text


def show(feds, metric, title):
    print(title)
    show_table(["method"] + [label(f) for f in feds], [[m] + [cell_text(f, m, metric) for f in feds] for m in METHODS])


show([BASE] + ATTACKED, "lastk", f"mean client accuracy, last {protocol.last_k} rounds (%), under attack")
""")

code(r"""
def names(f, verdict, metric="lastk", among=None):
    return [m for m in (among or METHODS) if m != "fedavg" and getattr(cell[(f, m)], "vs_" + metric) == verdict]


def listing(f, verdict, metric="lastk", among=None):
    found = names(f, verdict, metric, among)
    if not found:
        return "none"
    return ", ".join(f"{m} ({100 * getattr(cell[(f, m)], 'd_' + metric):+.1f} ± "
                     f"{100 * getattr(cell[(f, m)], 'd_' + metric + '_ci'):.1f})" for m in found)


for f in ATTACKED:
    kind, frac = f.split("+")[1].split(":")
    key = f"{kind}-{100 * float(frac):.0f}"
    glue(f"rb-fedavg-{key}", 100 * cell[(f, "fedavg")].lastk)
    glue(f"rb-fedavg-{key}-ci", 100 * cell[(f, "fedavg")].lastk_ci)
    glue(f"rb-better-{key}", listing(f, "better", among=ROBUST))
glue("rb-fedavg-none", 100 * cell[(BASE, "fedavg")].lastk)
glue("rb-fedavg-none-ci", 100 * cell[(BASE, "fedavg")].lastk_ci)

# per rule, over the attacked federations: how often better, tied, worse than FedAvg
tally = {m: {v: sum(getattr(cell[(f, m)], "vs_lastk") == v for f in ATTACKED) for v in ("better", "tie", "worse")}
         for m in METHODS if m != "fedavg"}
show_table(["method", "better than FedAvg", "tie", "worse"],
           [[m, t["better"], t["tie"], t["worse"]] for m, t in tally.items()])
n_cells = len(ATTACKED) * len(ROBUST)
n_better = sum(tally[m]["better"] for m in ROBUST)
n_worse = sum(tally[m]["worse"] for m in ROBUST)
glue("rb-attacked", len(ATTACKED))
glue("rb-robust-cells", n_cells)
glue("rb-robust-better", n_better)
glue("rb-robust-worse", n_worse)
best_rule = max(ROBUST, key=lambda m: (tally[m]["better"] - tally[m]["worse"], -ROBUST.index(m)))
glue("rb-best-rule", best_rule)
glue("rb-best-rule-better", tally[best_rule]["better"])
glue("rb-best-rule-worse", tally[best_rule]["worse"])
never = [m for m in ROBUST if tally[m]["better"] == 0]
glue("rb-never-better", ", ".join(never) if never else "none")
print(f"robust rules better than FedAvg in {n_better} and worse in {n_worse} of {n_cells} (rule, attack) cells; "
      f"most often better, net of worse: {best_rule}")
""")

md(r"""
FedAvg without attackers reaches {glue:text}`rb-fedavg-none:.1f` ±
{glue:text}`rb-fedavg-none-ci:.1f` %. What the attacks do to it, and which robust rules are
**significantly better than FedAvg** under each (paired difference in points):

| attack | FedAvg, {glue:text}`rb-frac-lo:.0f` % attackers | robust rules better than FedAvg | FedAvg, {glue:text}`rb-frac-hi:.0f` % attackers | robust rules better than FedAvg |
|---|---|---|---|---|
| label flipping | {glue:text}`rb-fedavg-label_flip-10:.1f` ± {glue:text}`rb-fedavg-label_flip-10-ci:.1f` | {glue:text}`rb-better-label_flip-10` | {glue:text}`rb-fedavg-label_flip-30:.1f` ± {glue:text}`rb-fedavg-label_flip-30-ci:.1f` | {glue:text}`rb-better-label_flip-30` |
| sign flipping | {glue:text}`rb-fedavg-sign_flip-10:.1f` ± {glue:text}`rb-fedavg-sign_flip-10-ci:.1f` | {glue:text}`rb-better-sign_flip-10` | {glue:text}`rb-fedavg-sign_flip-30:.1f` ± {glue:text}`rb-fedavg-sign_flip-30-ci:.1f` | {glue:text}`rb-better-sign_flip-30` |
| Gaussian | {glue:text}`rb-fedavg-gaussian-10:.1f` ± {glue:text}`rb-fedavg-gaussian-10-ci:.1f` | {glue:text}`rb-better-gaussian-10` | {glue:text}`rb-fedavg-gaussian-30:.1f` ± {glue:text}`rb-fedavg-gaussian-30-ci:.1f` | {glue:text}`rb-better-gaussian-30` |
| ALIE | {glue:text}`rb-fedavg-alie-10:.1f` ± {glue:text}`rb-fedavg-alie-10-ci:.1f` | {glue:text}`rb-better-alie-10` | {glue:text}`rb-fedavg-alie-30:.1f` ± {glue:text}`rb-fedavg-alie-30-ci:.1f` | {glue:text}`rb-better-alie-30` |

Over the {glue:text}`rb-robust-cells` pairs of a robust rule and an attacked federation, the rule
is significantly better than FedAvg in {glue:text}`rb-robust-better` and significantly worse in
{glue:text}`rb-robust-worse`; the rest are ties at {glue:text}`rb-n-seeds` seeds. The rule with
the best record, better minus worse, is {glue:text}`rb-best-rule` (better in
{glue:text}`rb-best-rule-better`, worse in {glue:text}`rb-best-rule-worse` of the
{glue:text}`rb-attacked` attacked federations); never better than FedAvg under any of them:
{glue:text}`rb-never-better`. Read the table with the derivations in mind: label flipping and
ALIE produce updates that *look like* honest ones, which the distance- and order-based rules were
not built to spot; and read the first column too — there nobody attacks, so any difference there
is the rule's own cost.

### Without attackers: the cost of robustness

The same rules on federations where nobody attacks and the clients differ more and more. Here
the worst-10 % accuracy — the mean accuracy of the tenth of the clients served worst — asks the
chapter's question: *does a robust rule mistake a rare but honest client for an attacker?*
""")

code(r"""
show(HETERO, "lastk", f"no attacker: mean client accuracy, last {protocol.last_k} rounds (%)")
show(HETERO, "worst10", f"no attacker: worst 10 % of the clients, last {protocol.last_k} rounds (%)")
for f in HETERO:
    s = f.replace(":", "-").replace(".", "")
    glue(f"rb-cost-{s}", listing(f, "worse", "worst10", among=ROBUST))
    glue(f"rb-cost-{s}-n", len(names(f, "worse", "worst10", among=ROBUST)))
    glue(f"rb-fedavg-w-{s}", 100 * cell[(f, "fedavg")].worst10)
n_worse_het = sum(len(names(f, "worse", "worst10", among=ROBUST)) for f in HETERO)
n_better_het = sum(len(names(f, "better", "worst10", among=ROBUST)) for f in HETERO)
glue("rb-het-cells", len(HETERO) * len(ROBUST))
glue("rb-het-worse", n_worse_het)
glue("rb-het-better", n_better_het)
print(f"worst-10 %, no attacker: robust rules worse than FedAvg in {n_worse_het}, better in {n_better_het} "
      f"of {len(HETERO) * len(ROBUST)} cells")
""")

md(r"""
On the worst-served clients, without any attacker, the robust rules are significantly worse than
FedAvg in {glue:text}`rb-het-worse` and better in {glue:text}`rb-het-better` of
{glue:text}`rb-het-cells` (rule, federation) pairs. Significantly worse than FedAvg's worst-10 %
accuracy (paired difference in points):

- `dirichlet:0.5` (FedAvg's worst 10 %: {glue:text}`rb-fedavg-w-dirichlet-05:.1f` %):
  {glue:text}`rb-cost-dirichlet-05`;
- `dirichlet:0.1` ({glue:text}`rb-fedavg-w-dirichlet-01:.1f` %): {glue:text}`rb-cost-dirichlet-01`;
- `shards:2` ({glue:text}`rb-fedavg-w-shards-2:.1f` %): {glue:text}`rb-cost-shards-2`.

Why, in one run: with no attacker at all, which clients does Krum pick? The cell below runs Krum
on `dirichlet:0.1` on three seeds and relates how often each client is picked to how *rare* its
data is — the total-variation distance between its label mix and the federation's.
""")

code(r"""
STUDY_SEEDS = (1, 2, 3, 4, 5) if FULL else (1, 2, 3)
STUDY_ROUNDS = 60 if FULL else protocol.rounds
n_clients = first["federation"]["num_clients"]
rho, never_picked, gap = [], [], []
for seed in STUDY_SEEDS:
    fed = fl.data.federated_dataset("digits", "dirichlet", num_clients=n_clients, alpha=0.1, seed=seed)
    model = fl.make_model("mlp", fed.input_shape, fed.num_classes, seed=seed)
    hist = fl.simulate(fed, model, Krum(), rounds=STUDY_ROUNDS, clients_per_round=n_clients, batch_size=protocol.batch_size,
                       lr=protocol.lr, eval_every=STUDY_ROUNDS, seed=seed, device="cpu", progress=False)
    picked = np.zeros(n_clients)
    for d in hist.diagnostics:
        picked[np.asarray(d["selected"])] += 1
    counts = fed.label_counts().astype(float)
    mix = counts / counts.sum(1, keepdims=True)
    overall = counts.sum(0) / counts.sum()
    rarity = 0.5 * np.abs(mix - overall).sum(1)           # total variation distance to the federation's mix
    rho.append(stats.spearmanr(rarity, picked).statistic)
    never_picked.append(int((picked == 0).sum()))
    acc = np.asarray(hist.client_accuracy[-1])
    gap.append(acc[picked == 0].mean() - acc[picked > 0].mean())
rho_mean, rho_h = benchmark.t_interval(rho)
gap_mean, gap_h = benchmark.t_interval(gap)
never_mean, never_h = benchmark.t_interval(never_picked)
glue("rb-krum-rho", rho_mean)
glue("rb-krum-rho-ci", rho_h)
glue("rb-krum-never", never_mean)
glue("rb-krum-never-ci", never_h)
glue("rb-krum-gap", 100 * gap_mean)
glue("rb-krum-gap-ci", 100 * gap_h)
glue("rb-krum-seeds", len(STUDY_SEEDS))
glue("rb-krum-rounds", STUDY_ROUNDS)
glue("rb-krum-rho-reading", "rarer clients are picked less often" if rho_mean + rho_h < 0 else
     ("rarer clients are picked more often" if rho_mean - rho_h > 0 else "no significant relation"))
glue("rb-krum-gap-reading", "worse" if gap_mean + gap_h < 0 else ("better" if gap_mean - gap_h > 0 else "tied"))
print(f"Spearman(rarity, times picked) = {rho_mean:.2f} ± {rho_h:.2f}; clients never picked: {never_mean:.1f} ± {never_h:.1f} "
      f"of {n_clients}; their accuracy minus the picked clients': {100 * gap_mean:+.1f} ± {100 * gap_h:.1f} points")
""")

md(r"""
Over {glue:text}`rb-krum-seeds` seeds of {glue:text}`rb-krum-rounds` rounds,
{glue:text}`rb-krum-never:.1f` ± {glue:text}`rb-krum-never-ci:.1f` of the
{glue:text}`rb-clients` clients — all of them honest — were never picked at all, and their final
accuracy is {glue:text}`rb-krum-gap-reading` compared with the clients that were
({glue:text}`rb-krum-gap:+.1f` ± {glue:text}`rb-krum-gap-ci:.1f` points). Which clients are left
out is another matter: the rank correlation between a client's rarity and the number of rounds
it was picked is {glue:text}`rb-krum-rho:.2f` ± {glue:text}`rb-krum-rho-ci:.2f`
({glue:text}`rb-krum-rho-reading`). Under strong label skew *every* client is unusual, and
Krum, built for honest clients that are alike, follows whichever few sit nearest the others in a
round; the rest are treated as if they were the attackers it expects. Under non-IID data being
unlike the others is a property of honest clients, not a sign of an attack.

## Privacy: DP-FedAvg

Client-level differential privacy asks that the server's output be nearly as likely whether or
not any one client took part. DP-FedAvg {cite}`mcmahan2018dpfedavg` clips each update to norm
$C$, adds Gaussian noise to the sum and divides by a **fixed** denominator $D$:

$$
\tilde\Delta_i = \Delta_i \min\Bigl(1, \frac{C}{\lVert \Delta_i \rVert}\Bigr), \qquad
\hat\Delta = \frac{1}{D}\Bigl(\sum_{i} \tilde\Delta_i + \mathcal N(0, z^2 C^2 I)\Bigr).
$$ (rb-eq-dp)

**Sensitivity.** Remove client $j$ from the round: the sum changes by $\tilde\Delta_j$, of norm at
most $C$; the denominator does not change. So the noisy sum is the Gaussian mechanism with
$\ell_2$-sensitivity $C$ and noise $zC$ — noise multiplier $z$. Now take FedAvg's weights,
$S = \sum_i p_i \tilde\Delta_i$ with $p_i = n_i / \sum_k n_k$. Without client $j$ the others'
weights become $p_i / (1 - p_j)$, and

$$
S - S' = p_j \tilde\Delta_j - \frac{p_j}{1 - p_j} \sum_{i \neq j} p_i \tilde\Delta_i,
\qquad \lVert S - S' \rVert \le p_j C + \frac{p_j}{1-p_j}(1 - p_j) C = 2 p_j C .
$$ (rb-eq-sens)

The bound depends on $p_j$ — on client $j$'s private sample count, which can be as large as it
likes (then $2 p_j C \to 2C$, while the noise was calibrated to $C/D$). Data-dependent weights are
worse still: FedVG's weights are inverse validation-gradient norms and FedOUI's are activation
scores, functions of *every* client's data, so one client changes every other client's weight
and the sensitivity has no bound the noise could be calibrated to. Weights can be made safe only
by bounding them and fixing them in advance (McMahan et al.'s $w_i = \min(n_i/\hat w, 1)$ with
denominator $qW$). The package takes the simple road — every clipped update weighs the same —
and **refuses** a re-weighting strategy on top of DP-FedAvg:
""")

code(r"""
# the sensitivity of a weighted sum to one client, measured: m clipped updates, client 0 with many samples
m, d, C = 10, 50, 1.0
deltas = torch.tensor(rng.normal(size=(m, d)) * 3)
clipped, _ = norm_clip(deltas, C)
n = torch.tensor([500.0] + [10.0] * (m - 1))
p = n / n.sum()
with_j = (p[:, None] * clipped).sum(0)
without_j = (n[1:, None] * clipped[1:]).sum(0) / n[1:].sum()
fixed = (clipped.sum(0) - clipped[1:].sum(0)) / m                # the fixed denominator: exactly one clipped update / D
moved_weighted, moved_fixed = float((with_j - without_j).norm()), float(fixed.norm())
assert moved_fixed <= C / m + 1e-12 and moved_weighted <= 2 * float(p[0]) * C + 1e-12   # the two bounds of the text
assert moved_weighted > 3 * C / m                                   # far beyond what noise calibrated to C / D covers
print(f"removing the large client moves the size-weighted mean by {moved_weighted:.3f} (bound 2 p_j C = {2 * float(p[0]) * C:.3f}); "
      f"the fixed-denominator mean by {moved_fixed:.3f} (bound C / D = {C / m:.3f})")
glue("rb-sens-weighted", moved_weighted)
glue("rb-sens-fixed", moved_fixed)

fed_small = fl.data.federated_dataset("digits", "dirichlet", num_clients=10, alpha=0.5, seed=0, num_samples=400)
fed_small, val = fl.data.server_validation_split(fed_small, 0.1, seed=0)
try:
    FedVG(val_data=val, base=DPFedAvg(clip=C, noise_multiplier=1.0))
    raise AssertionError("FedVG over DP-FedAvg should be refused")
except ValueError as err:
    refusal = str(err)
print("FedVG(val_data=..., base=DPFedAvg(...)) ->", refusal)
assert "sensitivity" in refusal
""")

md(r"""
Removing one large client moves the size-weighted mean by {glue:text}`rb-sens-weighted:.3f`, the
fixed-denominator sum over $D$ by {glue:text}`rb-sens-fixed:.3f`: the noise of DP-FedAvg is
calibrated to the second. From scratch, the round of {eq}`rb-eq-dp` checked against the package's
`DPFedAvg` (the noise draw $\xi$ is the package's, seeded by the run and the round, so that the
two can be compared exactly):
""")

code(r"""
def clip_and_noise(deltas, clip, noise_multiplier, xi, denominator):
    x = np.asarray(deltas, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1)
    factors = np.where(norms > clip, clip / np.where(norms > 0, norms, 1.0), 1.0)   # a zero update stays zero
    return ((factors[:, None] * x).sum(0) + noise_multiplier * clip * np.asarray(xi)) / denominator


dp = DPFedAvg(clip=0.5, noise_multiplier=1.1, denominator=12)
x = torch.tensor(rng.normal(size=(8, 30)))
updates = ClientUpdates(round=3, client_ids=torch.arange(8), deltas={"w": x}, num_samples=torch.full((8,), 40.0),
                        train_loss=torch.zeros(8), model=None)
g, _, diag = dp.direction({"params": {"w": torch.zeros(30)}, "noise_seed": 7}, updates)
xi = dp.noise({"w": torch.zeros(30, dtype=torch.float64)}, seed=7, round=3)["w"] / (dp.noise_multiplier * dp.clip)
ours = clip_and_noise(x.numpy(), 0.5, 1.1, xi.numpy(), 12)
np.testing.assert_allclose(-g["w"].numpy(), ours, rtol=1e-12, atol=1e-15)   # the package descends along g = -update
print("DP-FedAvg's round: from scratch == fedlearn_edu.strategies.DPFedAvg.direction")
""")

md(r"""
**The accountant.** One round is the Gaussian mechanism with noise multiplier $z$; its Rényi
divergence of order $\alpha > 1$ between neighbouring inputs is $\alpha / (2 z^2)$ {cite}`mironov2017renyi`.
Rényi DP **composes by addition**: $T$ rounds are $(\alpha, T\alpha/(2z^2))$-RDP, and an
$(\alpha, \varepsilon_\alpha)$-RDP mechanism is $(\varepsilon, \delta)$-DP with
$\varepsilon = \varepsilon_\alpha + \log(1/\delta)/(\alpha - 1)$; minimising over $\alpha$,

$$
\varepsilon(T, z, \delta) \le \min_{\alpha > 1} \Bigl( \frac{T \alpha}{2 z^2} + \frac{\log(1/\delta)}{\alpha - 1} \Bigr)
\approx \frac{T}{2z^2} + \frac{\sqrt{2 T \log(1/\delta)}}{z} .
$$ (rb-eq-rdp)

When each client takes part only with probability $q < 1$, *privacy amplification by sampling*
makes each round much cheaper (roughly $q^2$ times the divergence for small $q$) — the *sampled*
Gaussian mechanism that {func}`fedlearn_edu.privacy.epsilon` accounts with Google's
`dp-accounting`. That analysis assumes **Poisson sampling**: every client joins each round
independently with probability $q$, so the round's size varies. The simulator samples exactly
$m$ clients without replacement. For that sampler the amplified bound is a different theorem
(under the substitution relation; Wang, Balle and Kasiviswanathan, 2019), and the Poisson figure
is the one commonly reported, not a proof for our sampler. In this chapter's grid all
{glue:text}`rb-clients` clients take part in every round, $q = 1$: there is no sampling to
amplify, both samplers are the same, and the accountant's figure is exact for the runs — and as
large as {eq}`rb-eq-rdp` says.
""")

code(r"""
DELTA = 1e-3
T, q = protocol.rounds, protocol.clients_per_round / first["federation"]["num_clients"]
assert q == 1.0


def eps_rdp_numpy(T, z, delta):
    alphas = np.concatenate([1 + np.arange(1, 100) / 10.0, np.arange(12, 64)])
    return float(np.min(T * alphas / (2 * z**2) + np.log(1 / delta) / (alphas - 1)))


for z in (0.5, 1.0, 2.0, 4.0):
    lib = privacy.epsilon(T, q, z, DELTA)
    ours = eps_rdp_numpy(T, z, DELTA)
    assert lib <= ours + 1e-9 and lib > 0.5 * ours   # the library converts RDP to (eps, delta) a little more tightly
    print(f"z = {z}: epsilon {lib:.2f} (dp-accounting), {ours:.2f} (the textbook conversion, same RDP)")
""")

md(r"""
The library's figures are a little below the textbook conversion of {eq}`rb-eq-rdp` (it uses a
tighter conversion from RDP to $(\varepsilon, \delta)$), for the same composed Rényi divergence.

**Accuracy against $\varepsilon$.** The grid's DP-FedAvg runs on the federation without attackers
give three noise levels; the cell below adds larger multipliers, run live on the same seeds with
the same settings, to reach the $\varepsilon$ values practice asks for. Every point is the
last-{glue:text}`rb-lastk` mean accuracy over {glue:text}`rb-n-seeds` seeds with its interval;
$\delta = 10^{-3}$.
""")

code(r"""
Z_LIVE = (2.0, 4.0, 8.0)
curve = {}
for mname in DP:
    z = float(configs[runs[(runs.method == mname) & (runs.federation == BASE)].run_key.iloc[0]]["settings"]["noise_multiplier"])
    r = cell[(BASE, mname)]
    curve[z] = {"acc": r.lastk, "ci": r.lastk_ci, "per_seed": None}
template = configs[runs[(runs.method == "dp1") & (runs.federation == BASE)].run_key.iloc[0]]
for z in Z_LIVE:
    vals = []
    for seed in protocol.eval_seeds:
        cfg = {**template, "seed": seed, "method": f"dp{z:g}", "settings": {**template["settings"], "noise_multiplier": z}}
        out = benchmark.execute(cfg)
        assert out["status"] == "ok", out.get("error")
        vals.append(np.mean([row["mean"] for row in out["rows"]][-protocol.last_k:]))
    mu, h = benchmark.t_interval(vals)
    curve[z] = {"acc": mu, "ci": h}
zs = sorted(curve)
eps = {z: (privacy.epsilon(T, q, z, DELTA) if z > 0 else float("inf")) for z in zs}
show_table(["noise multiplier z", "epsilon (delta = 1e-3)", "accuracy, last rounds (%)"],
           [[f"{z:g}", f"{eps[z]:.1f}" if np.isfinite(eps[z]) else "∞ (clipping only)",
             f"{100 * curve[z]['acc']:.1f} ± {100 * curve[z]['ci']:.1f}"] for z in zs])

clip_only = curve[0.0]
fedavg_acc = cell[(BASE, "fedavg")]
# the largest noise whose accuracy interval still overlaps the clipping-only run's: "no measurable cost" at this scale
free = [z for z in zs if z > 0 and curve[z]["acc"] + curve[z]["ci"] >= clip_only["acc"] - clip_only["ci"]]
z_free = max(free) if free else None
z_max = max(zs)
glue("rb-dp-clip", 100 * clip_only["acc"])
glue("rb-dp-clip-ci", 100 * clip_only["ci"])
glue("rb-dp-zfree", f"{z_free:g}" if z_free else "none of the multipliers")
glue("rb-dp-epsfree", eps[z_free] if z_free else float("nan"))
glue("rb-dp-accfree", 100 * curve[z_free]["acc"] if z_free else float("nan"))
glue("rb-dp-accfree-ci", 100 * curve[z_free]["ci"] if z_free else float("nan"))
glue("rb-dp-zmax", f"{z_max:g}")
glue("rb-dp-epsmax", eps[z_max])
glue("rb-dp-accmax", 100 * curve[z_max]["acc"])
glue("rb-dp-accmax-ci", 100 * curve[z_max]["ci"])
glue("rb-dp-eps1", eps[1.0])
glue("rb-dp-delta-n", first["federation"]["num_clients"])
print(f"clipping only: {100 * clip_only['acc']:.1f} ± {100 * clip_only['ci']:.1f} %; largest z within its interval: {z_free} "
      f"(epsilon {eps[z_free]:.1f}); z = {z_max}: epsilon {eps[z_max]:.2f}, accuracy {100 * curve[z_max]['acc']:.1f} %")
""")

code(r"""
finite = [z for z in zs if z > 0]
fig, ax = plt.subplots(figsize=(5.2, 3.2))
ax.errorbar([eps[z] for z in finite], [100 * curve[z]["acc"] for z in finite], yerr=[100 * curve[z]["ci"] for z in finite],
            fmt="o-", capsize=3, label="DP-FedAvg (z marked)")
for z in finite:
    ax.annotate(f"z={z:g}", (eps[z], 100 * curve[z]["acc"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
ax.axhspan(100 * (clip_only["acc"] - clip_only["ci"]), 100 * (clip_only["acc"] + clip_only["ci"]), color="0.85",
           label="clipping only (no privacy)")
ax.set_xscale("log")
ax.set_xlabel(r"$\varepsilon$ at $\delta = 10^{-3}$ (all clients every round, q = 1)")
ax.set_ylabel("mean client accuracy, last rounds (%)")
ax.grid(alpha=0.3)
ax.legend(fontsize=7)
plt.show()
""", {"mystnb": {"figure": {"name": "rb-fig-eps", "caption": "Accuracy against the privacy budget of DP-FedAvg on the classroom federation without attackers: mean over the seeds with 95 % t-intervals; the grey band is the clipping-only run's interval."}}})

md(r"""
Clipping alone (no noise, no privacy) reaches {glue:text}`rb-dp-clip:.1f` ±
{glue:text}`rb-dp-clip-ci:.1f` %. The largest noise multiplier whose interval still reaches that
band is {glue:text}`rb-dp-zfree` — at $\varepsilon$ = {glue:text}`rb-dp-epsfree:.1f`
({glue:text}`rb-dp-accfree:.1f` ± {glue:text}`rb-dp-accfree-ci:.1f` %). At
$z$ = {glue:text}`rb-dp-zmax` the budget is $\varepsilon$ = {glue:text}`rb-dp-epsmax:.2f`, at
{glue:text}`rb-dp-accmax:.1f` ± {glue:text}`rb-dp-accmax-ci:.1f` % accuracy
({numref}`rb-fig-eps`). With {glue:text}`rb-dp-delta-n` clients, every one of them in every round,
there is no sampling to amplify privacy and the noise is shared by very few updates: the
$\varepsilon$ that leaves accuracy intact is far from a meaningful guarantee. DP-FedAvg was
designed for millions of clients and $q \ll 1$, where the same $z$ costs orders of magnitude less
$\varepsilon$ per round; in a classroom federation its lesson is the bookkeeping, not the
privacy. (Adaptive clipping {cite}`andrew2021adaptiveclipping` replaces the fixed $C$ by a
private quantile of the update norms.) Note also the DP rows of the attack table: clipping bounds
what any one client can do to the sum, so DP-FedAvg doubles as a norm-bounding defence.

## Secure aggregation: when the server may see only sums

In secure aggregation {cite}`bonawitz2017secagg` every pair of clients $i < j$ agrees on a
seed $s_{ij}$ (by a key exchange) and client $i$ sends, in fixed point modulo $2^k$,

$$
y_i = x_i + \sum_{j > i} \mathrm{PRG}(s_{ij}) - \sum_{j < i} \mathrm{PRG}(s_{ji}) \pmod{2^k} .
$$ (rb-eq-mask)

Each mask $\mathrm{PRG}(s_{ij})$ appears exactly twice in $\sum_i y_i$, once with $+$ (in $y_i$)
and once with $-$ (in $y_j$), so $\sum_i y_i = \sum_i x_i \pmod{2^k}$: the server decodes the sum.
Any one $y_i$ (indeed any strict subset) is uniform modulo $2^k$ whatever $x_i$, since it
contains a mask the server does not know. Clients that drop out after the masks are fixed
leave masks uncancelled; the protocol recovers them from secret shares of the seeds, and
SecAgg+ {cite}`bell2020secaggplus` uses a sparse graph of pairs to make this cheaper. From
scratch in NumPy, checked against {mod}`fedlearn_edu.secagg`:
""")

code(r"""
K, S = 48, 16   # modulus 2^48, 16 fractional bits
MOD = 1 << K


def encode_numpy(x):
    return np.mod(np.round(np.asarray(x) * 2.0**S).astype(np.int64), MOD)


def decode_numpy(y):
    y = np.mod(y, MOD)
    return np.where(y >= MOD // 2, y - MOD, y).astype(np.float64) / 2.0**S


def masked_numpy(x, seed):
    m, d = x.shape
    y = encode_numpy(x)
    for i in range(m):
        for j in range(i + 1, m):
            r = np.random.default_rng([seed, i, j]).integers(0, MOD, size=d, dtype=np.int64)   # PRG(s_ij)
            y[i] = np.mod(y[i] + r, MOD)
            y[j] = np.mod(y[j] - r, MOD)
    return y


x = rng.normal(size=(6, 9))
y = masked_numpy(x, seed=5)
total = decode_numpy(np.mod(y.sum(0), MOD))            # int64 sums of six values < 2^48 do not overflow
rounded = decode_numpy(encode_numpy(x)).sum(0)
np.testing.assert_array_equal(total, rounded)           # the masks cancel: the exact sum of the rounded inputs
pkg_total, pkg_masked = secagg.secure_sum(torch.tensor(x), torch.arange(6), seed=5, scale_bits=S, modulus_bits=K)
np.testing.assert_array_equal(pkg_total.numpy(), total)  # the package's protocol decodes the same sum
masks = secagg.pairwise_masks(torch.arange(6), (9,), seed=5, modulus_bits=K)
assert bool((torch.remainder(masks.sum(0), MOD) == 0).all())
assert not np.allclose(decode_numpy(y[0]), x[0], atol=1)   # one client's message says nothing useful about its input
print(f"masked messages cancel: decoded sum == sum of the rounded inputs (max |error| vs the float sum "
      f"{np.abs(total - x.sum(0)).max():.1e}); the package agrees")
""")

md(r"""
What survives: a strategy can run under secure aggregation only if its server step needs nothing
but sums of vectors the clients compute. The table is executed — for every registered strategy
the package's own verdict, `secagg.secure_aggregation_problem`, and the reason it gives:
""")

code(r"""
rows, survive, refused = [], [], []
for name, cls in STRATEGIES.items():
    strategy = cls(val_data=val) if name == "fedvg" else cls()
    why = secagg.secure_aggregation_problem(strategy)
    (refused if why else survive).append(name)
    rows.append([name, "yes" if not why else "no", why or "sums of client-computed vectors only"])
show_table(["strategy", "sums only?", "what the server needs"], rows)
assert set(ROBUST) - {"normclipping"} <= set(refused) and {"fedavg", "dpfedavg", "normclipping"} <= set(survive)
assert {"fedvg", "fedoui"} <= set(refused)

model = fl.make_model("mlp", fed_small.input_shape, fed_small.num_classes, seed=0)
try:
    fl.simulate(fed_small, model, Krum(), rounds=1, clients_per_round=10, seed=0, device="cpu", progress=False,
                secure_aggregation=True)
    raise AssertionError("Krum under secure aggregation should be refused")
except ValueError as err:
    print("simulate(..., Krum(), secure_aggregation=True) ->", err)
ok = fl.simulate(fed_small, model, FedAvg(), rounds=1, clients_per_round=10, seed=0, device="cpu", progress=False,
                 secure_aggregation=True)
assert ok.config["secure_aggregation"] is True
glue("rb-sa-survive", len(survive))
glue("rb-sa-total", len(STRATEGIES))
glue("rb-sa-robust-refused", sum(m in refused for m in ROBUST))
glue("rb-sa-robust", len(ROBUST))
""")

md(r"""
Of the {glue:text}`rb-sa-total` registered strategies, {glue:text}`rb-sa-survive` run on sums
alone; {glue:text}`rb-sa-robust-refused` of the {glue:text}`rb-sa-robust` robust rules do not
(norm clipping survives: each client can clip its own update). Here is the tension of the
chapter in one table: the defences against attackers read every update, which is exactly what
secure aggregation hides, and the re-weighting rules of the book (FedVG, FedOUI) need per-client
signals that would have to be revealed or computed securely. Robustness under secure aggregation
is an active research question; what the package gives you is the honest answer — a refusal
that says why.

## Exercises

Difficulty: ★ routine, ★★ needs a derivation or some code, ★★★ a small project; times are rough.
Solutions are in the drop-downs, and their code runs with the book.

```{exercise} The trimmed mean and its breakdown point (★, 20 min)
:label: rb-ex-tm

(a) Write `my_trimmed_mean(deltas, beta)` for `deltas: Tensor[m, d]`, cutting
$b = \lfloor \beta m \rfloor$ values at each end of every coordinate, and check it with
`fedlearn_edu.exercises.check_trimmed_mean(my_trimmed_mean)`. (b) With $m = 20$ clients per
round and the package's default $\beta$, how many attackers does the trimmed mean tolerate, and
which column of the attack table is therefore outside its guarantee?
```

````{solution-start} rb-ex-tm
:class: dropdown
````
""")

code(r"""
from fedlearn_edu.exercises import check_trimmed_mean


def my_trimmed_mean(deltas, beta):
    m = deltas.shape[0]
    b = int(np.floor(beta * m))
    return deltas.sort(dim=0).values[b : m - b].mean(dim=0)


assert check_trimmed_mean(my_trimmed_mean)
m_round = protocol.clients_per_round
tolerated = int(np.floor(0.1 * m_round))
attackers_hi = round(FRACTIONS[-1] * first["federation"]["num_clients"])
attackers_lo = round(FRACTIONS[0] * first["federation"]["num_clients"])
print(f"(b) beta = 0.1, m = {m_round}: b = {tolerated} attackers tolerated; "
      f"the {100 * FRACTIONS[-1]:.0f} % columns have {attackers_hi} attackers in every round: outside the guarantee")
assert attackers_lo <= tolerated < attackers_hi
glue("rb-ex-m", m_round)
glue("rb-ex-b", tolerated)
glue("rb-ex-lo", attackers_lo)
glue("rb-ex-hi", attackers_hi)
""")

md(r"""
(b) With $m$ = {glue:text}`rb-ex-m` and $\beta = 0.1$, $b$ = {glue:text}`rb-ex-b`: up to
{glue:text}`rb-ex-b` attackers per round. The {glue:text}`rb-frac-lo:.0f` % columns
({glue:text}`rb-ex-lo` attackers in every round) are inside the guarantee, the
{glue:text}`rb-frac-hi:.0f` % columns ({glue:text}`rb-ex-hi`) outside it.

````{solution-end}
````

```{exercise} Krum, and a client unlike the others (★★, 30 min)
:label: rb-ex-krum

(a) Write `my_krum(deltas, f)` returning the update of the client with the smallest Krum score
{eq}`rb-eq-krum` (a tie: the lower index), and check it with
`fedlearn_edu.exercises.check_krum(my_krum)`. (b) Build ten honest updates, nine near one
direction and one in another, and find the smallest distance at which Krum with $f = 3$ never
picks the tenth. (c) Why does the neighbourhood hold $m - f - 2$ clients rather than $m - f$?
```

````{solution-start} rb-ex-krum
:class: dropdown
````
""")

code(r"""
from fedlearn_edu.exercises import check_krum


def my_krum(deltas, f):
    m = deltas.shape[0]
    d2 = torch.cdist(deltas.double(), deltas.double()) ** 2
    d2 = d2 + torch.diag(torch.full((m,), float("inf"), dtype=d2.dtype))   # not oneself
    scores = d2.sort(dim=1).values[:, : m - f - 2].sum(1)
    return deltas[int(torch.argmin(scores))]                                 # argmin: the first of tied minima


assert check_krum(my_krum)

# (b) the tenth client moves away from the nine typical ones: from which distance is it never Krum's pick?
typical = torch.tensor(rng.normal(size=(9, 5)) * 0.3) + torch.tensor([1.0, 0, 0, 0, 0])
picked_at = []
for dist in np.linspace(0.0, 3.0, 31):
    x = torch.cat([typical, (typical.mean(0) + torch.tensor([0.0, dist, 0, 0, 0]))[None]])
    picked_at.append(bool(torch.equal(my_krum(x, 3), x[-1])))
distances = np.linspace(0.0, 3.0, 31)
print("the tenth client is Krum's pick at distances", [round(float(d), 1) for d, p in zip(distances, picked_at) if p])
assert picked_at[0]                                         # at the centre of the others it is the pick
last = max(float(d) for d, p in zip(distances, picked_at) if p)
assert not any(p for d, p in zip(distances, picked_at) if d > last)
glue("rb-ex-krum-last", last)
glue("rb-ex-spread", float(((typical - typical.mean(0)) ** 2).sum(1).sqrt().mean()))
""")

md(r"""
(b) At distance zero the tenth client sits at the centre of the others and is the pick; beyond a
distance of {glue:text}`rb-ex-krum-last:.1f` it is never picked again (the typical clients lie
at {glue:text}`rb-ex-spread:.2f` from their own mean, on average) — although it is honest.
(c) Of client $i$'s $m - 1$ others, up to $f$ are Byzantine; the proof needs the neighbourhood of
an honest client to be fillable by honest clients alone with one to spare, $m - f - 2 \le
(m - f - 1) - 1$, so that the winning score can always be compared with honest distances.

````{solution-end}
````

```{exercise} Clip, add noise, divide by a fixed number (★★, 30 min)
:label: rb-ex-dp

(a) Write `my_clip_and_noise(deltas, clip, noise_multiplier, xi, denominator)` computing
{eq}`rb-eq-dp` with the given standard normal draw `xi`, and check it with
`fedlearn_edu.exercises.check_clip_and_noise(my_clip_and_noise)`. (b) Show with a small example
that dividing by the round's $\sum_i n_i$-weighted total instead of a fixed $D$ lets one client
move the result by more than $C/D$. (c) Given a target $\varepsilon = 4$ at $\delta = 10^{-3}$
for this chapter's {glue:text}`rb-rounds` rounds with every client in every round, what noise
multiplier does `fedlearn_edu.privacy.epsilon` require?
```

````{solution-start} rb-ex-dp
:class: dropdown
````
""")

code(r"""
from fedlearn_edu.exercises import check_clip_and_noise


def my_clip_and_noise(deltas, clip, noise_multiplier, xi, denominator):
    norms = deltas.norm(dim=1, keepdim=True)
    factors = torch.where(norms > clip, clip / torch.where(norms > 0, norms, torch.ones_like(norms)), torch.ones_like(norms))
    return ((factors * deltas).sum(0) + noise_multiplier * clip * xi) / denominator


assert check_clip_and_noise(my_clip_and_noise)

# (b) see the sensitivity cell above: moved_weighted vs moved_fixed
assert moved_weighted > moved_fixed
# (c) bisection on z for epsilon(T, q = 1, z, 1e-3) = 4
lo, hi = 0.5, 50.0
for _ in range(40):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if privacy.epsilon(protocol.rounds, 1.0, mid, 1e-3) > 4 else (lo, mid)
print(f"(c) z = {hi:.2f} gives epsilon {privacy.epsilon(protocol.rounds, 1.0, hi, 1e-3):.3f} after {protocol.rounds} rounds")
""")

md(r"""
(b) The sensitivity cell computes it: with one client holding most of the samples, the
size-weighted mean moves by close to $2 p_j C$, many times the fixed-denominator bound.

````{solution-end}
````

## Summary

- The median's breakdown point is one half, the trimmed mean's about $\beta$, coordinate by
  coordinate; Krum's guarantee assumes honest clients are alike (IID). Under attack, the
  robust rules beat FedAvg in {glue:text}`rb-robust-better` and lose to it in
  {glue:text}`rb-robust-worse` of {glue:text}`rb-robust-cells` (rule, attack) cells, with
  intervals over {glue:text}`rb-n-seeds` seeds.
- Without attackers, robustness has a price on the worst-served clients
  ({glue:text}`rb-het-worse` of {glue:text}`rb-het-cells` cells significantly worse than
  FedAvg): rules that distrust the unusual distrust honest rare clients too.
- DP-FedAvg's guarantee rests on a clipped sum over a fixed denominator; data-dependent weights
  break it, and the package refuses them. With every client in every round, the accountant's
  $\varepsilon$ at the noise that costs no accuracy here is {glue:text}`rb-dp-epsfree:.1f`.
- Secure aggregation reveals only sums; {glue:text}`rb-sa-survive` of the
  {glue:text}`rb-sa-total` strategies survive it, and the robust rules that read every update do
  not.
""")

nb = {
    "cells": cells,
    "metadata": {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    },
    "nbformat": 4,
    "nbformat_minor": 5,
}
for i, c in enumerate(nb["cells"]):
    c["id"] = f"rb-{i:02d}"
    src = c["source"]
    lines = src.split("\n")
    c["source"] = [line + "\n" for line in lines[:-1]] + [lines[-1]]
out = REPO / "book" / "ch09_robust.ipynb"
out.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
print("wrote", out)
