"""Mutation score of the modules whose numbers make geospec's claim (``nox -s mutation``).

    python scripts/mutation_score.py               # the score of the last `mutmut run`
    python scripts/mutation_score.py --run         # run mutmut first (timed), then the score
    python scripts/mutation_score.py --survivors   # also print every unexplained survivor's diff
    python scripts/mutation_score.py --run --only 'geospec.measure.demand_fit.*'  # one module's

The modules are pyproject.toml's ``[tool.mutmut] only_mutate``: the paired statistics and the
report's results and fairness checks, the budget check on every schedule's output, rounding,
the solvers and the work statistics. mutmut (3.x) copies the tree into ``mutants/``, runs the
tests of ``pytest_add_cli_args_test_selection`` once to record which tests reach which
function, then runs every mutant against only the tests that reach its function: a mutant of
``geospec/rounding.py`` never waits for the statistics tests, and a mutant of
``plugins/statistics.py`` runs only the statistics tests that call the mutated method.

Printed per module and in total: ``mutation score: K/N killed``. N counts every mutant, K those
a test failed on (mutmut's "killed", or a timeout: a mutant that loops forever). A mutant that
no test reaches is not killed. Survivors that are *equivalent* (no input can tell them from
the original, so no test can kill them) are listed in :data:`EQUIVALENT` with the reason and
counted apart; every other survivor is a missing test.

Measured on 2 shared CPU cores: see docs/testing.md for the figures and the run time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]

#: mutmut's exit codes per mutant (the meta files in mutants/), as this script reads them.
KILLED = {1, 3, 24, -24, 36, 152, 255}  # a test failed; or the mutant timed out (SIGXCPU)
SURVIVED = {0}
NO_TESTS = {5, 33}  # no test reaches the mutated function
SKIPPED = {34}

# the start of a mutated line too long to spell out in each entry
_ZIP = "work if sensitivities is None else [w * s for w, s in zip(work, sensitivities, "

#: Survivors that no test can kill: (module, line before, line after) -> why. The lines are the
#: mutated line as ``mutmut show`` prints it, stripped; they identify a mutant across runs
#: (mutmut's numbers change whenever a function does).
EQUIVALENT: dict[tuple[str, str, str], str] = {
    (
        "geospec/stats.py",
        "array = np.asarray(values, dtype=np.float64)",
        "array = np.asarray(values, dtype=None)",
    ): "losses are Python floats (JSON) or ints: asarray gives float64 or int64 and the mean "
    "and sd are float64 either way",
    (
        "geospec/stats.py",
        "array = np.asarray(values, dtype=np.float64)",
        "array = np.asarray(values, )",
    ): "the same: the default dtype of Python floats is float64",
    (
        "geospec/stats.py",
        "diffs = np.asarray([arm[s] - baseline[s] for s in seeds], dtype=np.float64)",
        "diffs = np.asarray([arm[s] - baseline[s] for s in seeds], dtype=None)",
    ): "differences of Python floats are float64 without asking",
    (
        "geospec/stats.py",
        "diffs = np.asarray([arm[s] - baseline[s] for s in seeds], dtype=np.float64)",
        "diffs = np.asarray([arm[s] - baseline[s] for s in seeds], )",
    ): "the same",
    (
        "geospec/stats.py",
        "means = diffs[rng.integers(0, n, size=(bootstrap, n))].mean(axis=1)",
        "means = diffs[rng.integers(n, size=(bootstrap, n))].mean(axis=1)",
    ): "Generator.integers(n) is integers(0, n): the same draws from the same generator",
    ("geospec/stats.py", "sums = np.zeros(1)", "sums = np.zeros(2)"): (
        "every sign pattern counted twice: the fraction is the same"
    ),
    (
        "geospec/stats.py",
        "d = np.asarray(differences, dtype=np.float64)",
        "d = np.asarray(differences, dtype=None)",
    ): "differences of losses are Python floats: float64 without asking",
    (
        "geospec/stats.py",
        "d = np.asarray(differences, dtype=np.float64)",
        "d = np.asarray(differences, )",
    ): "the same",
    (
        "geospec/stats.py",
        "return 2.0 / 2.0**n if n > 0 else 1.0",
        "return 2.0 / 2.0**n if n > 1 else 1.0",
    ): "for n = 1, 2 / 2^1 is 1.0, the value of the other branch",
    (
        "geospec/stats.py",
        "sd: float, effect: float, alpha: float, power: float = 0.8, most: int = 1_000_000",
        "sd: float, effect: float, alpha: float, power: float = 0.8, most: int = 1000001",
    ): "a search bound a million seeds out: no study reaches either",
    (
        "geospec/stats.py",
        "if not math.isfinite(sd) or effect == 0:",
        "if not math.isfinite(sd) and effect == 0:",
    ): "without the shortcut the search finds no n with enough power (power stays at alpha or "
    "is NaN) and still returns None, after more steps",
    (
        "geospec/stats.py",
        "return paired_t_power(n, sd, effect, alpha) >= power",
        "return paired_t_power(n, sd, effect, alpha) > power",
    ): "the power of a whole number of seeds equals the target exactly only by accident",
    (
        "geospec/stats.py",
        "low, high = 1, 2  # power grows with n: double until enough, then bisect (low: not "
        "enough)",
        "low, high = 2, 2  # power grows with n: double until enough, then bisect (low: not "
        "enough)",
    ): "low is only ever read as 'not enough'; when 2 is not enough low becomes 2 anyway, and "
    "when it is, 2 is returned before low is read",
    (
        "geospec/stats.py",
        "low, high = 1, 2  # power grows with n: double until enough, then bisect (low: not "
        "enough)",
        "low, high = 1, 3  # power grows with n: double until enough, then bisect (low: not "
        "enough)",
    ): "starting the doubling at 3: the bisection between 1 and 3 still tries 2 first",
    (
        "geospec/stats.py",
        "low, high = high, min(2 * high, most)",
        "low, high = high, min(3 * high, most)",
    ): "tripling instead of doubling: the bisection that follows finds the same smallest n",
    (
        "geospec/stats.py",
        "values = np.asarray(replicates, dtype=np.float64)",
        "values = np.asarray(replicates, dtype=None)",
    ): "replicated profiles are lists of floats: float64 without asking",
    (
        "geospec/stats.py",
        "values = np.asarray(replicates, dtype=np.float64)",
        "values = np.asarray(replicates, )",
    ): "the same",
    (
        "geospec/rounding.py",
        "if lo > hi or n * lo > target or n * hi < target:",
        "if lo > hi and n * lo > target or n * hi < target:",
    ): "lo > hi alone never decides: then n * lo > n * hi, so the target is either below the "
    "first or above the second",
    ("geospec/rounding.py", "target = budget // multiple", "target = budget / multiple"): (
        "the budget was just checked to be a multiple: the quotient is whole either way"
    ),
    (
        "geospec/rounding.py",
        "rank = list(priority) if priority is not None else [0.0] * n",
        "rank = list(priority) if priority is not None else [1.0] * n",
    ): "a constant priority orders nothing: any constant is the same",
    (
        "geospec/report/results.py",
        "families = comparison_families(arms, comparisons, baseline)",
        "families = comparison_families(arms, comparisons, None)",
    ): "the baseline only names what each comparison is against (geospec plan prints it); the "
    "Holm adjustment and the notes read the p-values and the family labels",
    (
        "geospec/report/results.py",
        'widths_file = read_json_or_none(run_dir / WIDTHS_FILE) or {"arms": {}}',
        'widths_file = read_json_or_none(run_dir / WIDTHS_FILE) or {"XXarmsXX": {}}',
    ): "the stand-in is read with .get('arms') or {}: any stand-in without arms is the same",
    (
        "geospec/report/results.py",
        'widths_file = read_json_or_none(run_dir / WIDTHS_FILE) or {"arms": {}}',
        'widths_file = read_json_or_none(run_dir / WIDTHS_FILE) or {"ARMS": {}}',
    ): "the same",
    (
        "geospec/report/results.py",
        'int(s): v for s, v in arms.get(baseline, {}).get("val_loss", {}).get("seeds", {}).items()',
        'int(s): v for s, v in arms.get(baseline, {}).get("val_loss", {})'
        '.get("seeds", None).items()',
    ): "every arm entry has val_loss.seeds: only a missing baseline arm uses a default (tested)",
    (
        "geospec/report/results.py",
        'int(s): v for s, v in arms.get(baseline, {}).get("val_loss", {}).get("seeds", {}).items()',
        'int(s): v for s, v in arms.get(baseline, {}).get("val_loss", {}).get("seeds", ).items()',
    ): "every arm entry has val_loss.seeds: only a missing baseline arm uses a default (tested)",
    (
        "geospec/report/results.py",
        'int(s): v for s, v in arms.get(baseline, {}).get("val_loss", {}).get("seeds", {}).items()',
        'int(s): v for s, v in arms.get(baseline, {}).get("val_loss", None)'
        '.get("seeds", {}).items()',
    ): "every arm entry has val_loss.seeds: only a missing baseline arm uses a default (tested)",
    (
        "geospec/report/results.py",
        'int(s): v for s, v in arms.get(baseline, {}).get("val_loss", {}).get("seeds", {}).items()',
        'int(s): v for s, v in arms.get(baseline, {}).get("val_loss", ).get("seeds", {}).items()',
    ): "every arm entry has val_loss.seeds: only a missing baseline arm uses a default (tested)",
    (
        "geospec/report/results.py",
        "return SeedRun(seed, directory, loss, curve, config, fingerprint)",
        "return SeedRun(seed, None, loss, curve, config, fingerprint)",
    ): "SeedRun.directory is read nowhere in the report",
    (
        "geospec/solve/widths.py",
        'f"arm {name!r}: {params[name]} FFN parameters, uniform has {uniform_params}"',
        "None",
    ): "unreachable: the FFN parameter count is linear in the sum of the widths, which "
    "width_problems has just checked; the check stays as a guard",
    (
        "geospec/solve/widths.py",
        "for source in sources.get(name, ()):",
        "for source in sources.get(name, None):",
    ): "visit() is only called with names in sources: the default is never used",
    (
        "geospec/solve/widths.py",
        "for source in sources.get(name, ()):",
        "for source in sources.get(name, ):",
    ): "the same",
    (
        "geospec/solve/widths.py",
        "if source in sources and source not in state:",
        "if source in sources or source not in state:",
    ): "it also visits unknown names (no sources: nothing found) and explored arms again (no "
    "cycle reachable from them, or it would have been returned): the same answer, more work",
    (
        "geospec/solve/widths.py",
        'state[name] = "done"',
        "state[name] = None",
    ): "only 'open' and membership are ever read: any other marker means done",
    (
        "geospec/solve/widths.py",
        'state[name] = "done"',
        'state[name] = "XXdoneXX"',
    ): "the same",
    (
        "geospec/solve/widths.py",
        'state[name] = "done"',
        'state[name] = "DONE"',
    ): "the same",
    (
        "plugins/solvers.py",
        "self.bounds(dims.width_problem([1.0] * dims.n_layers))",
        "self.bounds(dims.width_problem([2.0] * dims.n_layers))",
    ): "bounds() reads the problem's size and limits, never its work values",
    (
        "plugins/solvers.py",
        "if len(positive) * upper + len(zero) * lower <= budget:",
        "if len(positive) * upper + len(zero) * lower < budget:",
    ): "at exact saturation the bisection converges to every working layer at the upper bound: "
    "the same widths to the last bits that rounding sees",
    (
        "plugins/solvers.py",
        "w = math.exp(min((logs[i] - s) / (exponents[i] + 1.0), 700.0))",
        "w = math.exp(min((logs[i] - s) / (exponents[i] + 1.0), 701.0))",
    ): "the cap only keeps exp() finite (overflow at 709.8); either cap is clipped to the upper "
    "bound next",
    (
        "plugins/solvers.py",
        "s_low = min(logs[i] - (exponents[i] + 1.0) * math.log(upper) for i in positive)",
        "s_low = min(logs[i] - (exponents[i] + 2.0) * math.log(upper) for i in positive)",
    ): "a wider bracket (upper > 1 in units of the uniform width): bisection to machine precision "
    "finds the same root",
    (
        "plugins/solvers.py",
        "s_high = max(logs[i] - (exponents[i] + 1.0) * math.log(lower) for i in positive)",
        "s_high = max(logs[i] - (exponents[i] + 2.0) * math.log(lower) for i in positive)",
    ): "a wider bracket (lower < 1): the same root",
    (
        "plugins/solvers.py",
        "values, problem.budget, problem.multiple, lo, hi, priority=_costs(problem)",
        "values, problem.budget, problem.multiple, None, hi, priority=_costs(problem)",
    ): "the continuous widths already lie in [lo, hi] and lo, hi are multiples: flooring never "
    "goes below lo and adding one multiple never passes hi, so rounding never meets the bounds",
    (
        "plugins/solvers.py",
        "values, problem.budget, problem.multiple, lo, hi, priority=_costs(problem)",
        "values, problem.budget, problem.multiple, lo, None, priority=_costs(problem)",
    ): "the same",
    (
        "plugins/solvers.py",
        "values, problem.budget, problem.multiple, lo, hi, priority=_costs(problem)",
        "values, problem.budget, problem.multiple, lo, priority=_costs(problem)",
    ): "the same (hi dropped)",
    (
        "plugins/solvers.py",
        "if hard_lo > hard_hi or n * hard_lo > target or n * hard_hi < target:",
        "if hard_lo > hard_hi and n * hard_lo > target or n * hard_hi < target:",
    ): "hard_lo > hard_hi alone never decides: then n * hard_lo > n * hard_hi, so the budget is "
    "either below the first or above the second",
    (
        "plugins/solvers.py",
        'work = _per_layer(problem.work, n, "work values", positive=False)',
        'work = _per_layer(problem.work, n, "work values", positive=None)',
    ): "None is as false as False",
    (
        "plugins/solvers.py",
        'sensitivities = _per_layer(problem.sensitivities, n, "sensitivities", positive=False)',
        'sensitivities = _per_layer(problem.sensitivities, n, "sensitivities", positive=None)',
    ): "None is as false as False",
    (
        "plugins/solvers.py",
        _ZIP + "strict=True)]",
        _ZIP + "strict=None)]",
    ): "_per_layer has checked both lengths: zip never meets lists of unequal length",
    (
        "plugins/solvers.py",
        _ZIP + "strict=True)]",
        _ZIP + ")]",
    ): "_per_layer has checked both lengths: zip never meets lists of unequal length",
    (
        "plugins/solvers.py",
        _ZIP + "strict=True)]",
        _ZIP + "strict=False)]",
    ): "_per_layer has checked both lengths: zip never meets lists of unequal length",
    (
        "plugins/solvers.py",
        "for i, w in zip(positive, levels, strict=True):",
        "for i, w in zip(positive, levels, strict=None):",
    ): "levels has one entry per positive layer by construction: the lengths always agree",
    (
        "plugins/solvers.py",
        "for i, w in zip(positive, levels, strict=True):",
        "for i, w in zip(positive, levels, ):",
    ): "levels has one entry per positive layer by construction: the lengths always agree",
    (
        "plugins/solvers.py",
        "for i, w in zip(positive, levels, strict=True):",
        "for i, w in zip(positive, levels, strict=False):",
    ): "levels has one entry per positive layer by construction: the lengths always agree",
    ("plugins/solvers.py", "target = budget // m", "target = budget / m"): (
        "the budget was just checked to be a multiple of m: the quotient is whole either way"
    ),
    (
        "plugins/solvers.py",
        "closed = [w * remaining / sum(k) for w in k]",
        "closed = [w / remaining / sum(k) for w in k]",
    ): "the closed form is a shortcut: a wrong one falls outside the bounds and the exact "
    "water level is found instead (20,000 random cases agree)",
    (
        "plugins/solvers.py",
        "if all(lower <= w <= upper for w in closed):  # no bound binds: the closed form",
        "if all(lower < w <= upper for w in closed):  # no bound binds: the closed form",
    ): "a closed-form width exactly on a bound: the water level found instead is the same",
    (
        "plugins/solvers.py",
        "if all(lower <= w <= upper for w in closed):  # no bound binds: the closed form",
        "if all(lower <= w < upper for w in closed):  # no bound binds: the closed form",
    ): "the same",
    (
        "plugins/solvers.py",
        "lo_index, hi_index = 0, len(breakpoints) - 1",
        "lo_index, hi_index = 0, len(breakpoints) - 2",
    ): "water_fill calls _clipped_level only below saturation, where the total at the last "
    "breakpoint (every layer at upper) exceeds the budget: the search never ends there",
    (
        "plugins/solvers.py",
        "if total(breakpoints[0]) >= budget:",
        "if total(breakpoints[1]) >= budget:",
    ): "when the total reaches the budget exactly at the second breakpoint, solving the first "
    "linear piece gives that breakpoint: the same level (20,000 random cases agree)",
    (
        "plugins/solvers.py",
        "if total(breakpoints[0]) >= budget:",
        "if total(breakpoints[0]) > budget:",
    ): "a total equal to the budget at the first breakpoint: the search then lands on a "
    "breakpoint of the same total, where every layer is clipped alike",
    ("plugins/solvers.py", "hi_index = 0", "hi_index = 1"): (
        "the search over [0, 1] tests breakpoint 1, whose total is at least the budget: it stays "
        "at 0 (or at an equal total: the same widths)"
    ),
    (
        "plugins/solvers.py",
        "mid = (lo_index + hi_index + 1) // 2",
        "mid = (lo_index + hi_index + 2) // 2",
    ): "a less balanced split of the same binary search: the midpoint stays in (lo, hi]",
    (
        "plugins/solvers.py",
        "if total(breakpoints[mid]) <= budget:",
        "if total(breakpoints[mid]) < budget:",
    ): "a breakpoint whose total equals the budget is then found as the end of the piece "
    "before it, whose linear solution is that breakpoint",
    (
        "plugins/solvers.py",
        "end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 2 * start + 1.0",
        "end = breakpoints[lo_index + 1] if (lo_index + 1 < len(breakpoints)) or True else 2 * "
        "start + 1.0",
    ): "lo_index is never the last breakpoint (see above): the else branch is unreachable",
    (
        "plugins/solvers.py",
        "end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 2 * start + 1.0",
        "end = breakpoints[lo_index + 1] if lo_index - 1 < len(breakpoints) else 2 * start + 1.0",
    ): "the same: the condition is always true",
    (
        "plugins/solvers.py",
        "end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 2 * start + 1.0",
        "end = breakpoints[lo_index + 1] if lo_index + 1 <= len(breakpoints) else 2 * start + 1.0",
    ): "the same: the condition is always true",
    (
        "plugins/solvers.py",
        "end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 2 * start + 1.0",
        "end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 2 * start - 1.0",
    ): "the unreachable else branch",
    (
        "plugins/solvers.py",
        "end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 2 * start + 1.0",
        "end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 2 / start + 1.0",
    ): "the unreachable else branch",
    (
        "plugins/solvers.py",
        "end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 2 * start + 1.0",
        "end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 3 * start + 1.0",
    ): "the unreachable else branch",
    (
        "plugins/solvers.py",
        "end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 2 * start + 1.0",
        "end = breakpoints[lo_index + 1] if lo_index + 1 < len(breakpoints) else 2 * start + 2.0",
    ): "the unreachable else branch",
    ("plugins/solvers.py", "if w * probe <= lower:", "if w * probe < lower:"): (
        "the probe is strictly inside a piece between breakpoints, so w * probe never equals a "
        "bound"
    ),
    ("plugins/solvers.py", "elif w * probe >= upper:", "elif w * probe > upper:"): "the same",
    (
        "plugins/solvers.py",
        "t = start if slope == 0 else (budget - fixed) / slope",
        "t = start if (slope == 0) and False else (budget - fixed) / slope",
    ): "a piece with every layer clipped has a constant total, so the search would have moved "
    "past it: the slope is never 0 here",
    (
        "plugins/solvers.py",
        "for _ in range(200):",
        "for _ in range(201):",
    ): "the loop ends when the midpoint equals an end (machine precision), long before 200",
    (
        "plugins/solvers.py",
        "if sum(widths_at(mid).values()) > remaining:",
        "if sum(widths_at(mid).values()) >= remaining:",
    ): "the two differ only where the sum equals the budget exactly: the root, bracketed either "
    "way to machine precision",
    # geospec/measure/demand_fit.py
    (
        "geospec/measure/demand_fit.py",
        "left, right = float(grid[max(best - 1, 0)]), float(grid[min(best + 1, GRID - 1)])",
        "left, right = float(grid[max(best - 2, 0)]), float(grid[min(best + 1, GRID - 1)])",
    ): "a bracket one grid step wider holds the same minimum of the SSE (the grid's best point "
    "is its lowest): bounded Brent converges to it within xatol 1e-12 of log a either way",
    (
        "geospec/measure/demand_fit.py",
        "left, right = float(grid[max(best - 1, 0)]), float(grid[min(best + 1, GRID - 1)])",
        "left, right = float(grid[max(best - 1, 0)]), float(grid[min(best + 2, GRID - 1)])",
    ): "the same, one step wider on the right",
    (
        "geospec/measure/demand_fit.py",
        'sse, bounds=(left, right), method="bounded", options={"xatol": 1e-12, "maxiter": 500}',
        'sse, bounds=(left, right), method=None, options={"xatol": 1e-12, "maxiter": 500}',
    ): "scipy's minimize_scalar takes method 'bounded' whenever bounds are given",
    (
        "geospec/measure/demand_fit.py",
        'sse, bounds=(left, right), method="bounded", options={"xatol": 1e-12, "maxiter": 500}',
        'sse, bounds=(left, right), options={"xatol": 1e-12, "maxiter": 500}',
    ): "the same: bounds given, so 'bounded'",
    (
        "geospec/measure/demand_fit.py",
        'sse, bounds=(left, right), method="bounded", options={"xatol": 1e-12, "maxiter": 500}',
        'sse, bounds=(left, right), method="BOUNDED", options={"xatol": 1e-12, "maxiter": 500}',
    ): "minimize_scalar lower-cases the method's name",
    (
        "geospec/measure/demand_fit.py",
        'sse, bounds=(left, right), method="bounded", options={"xatol": 1e-12, "maxiter": 500}',
        'sse, bounds=(left, right), method="bounded", options={"xatol": 1e-12, "maxiter": 501}',
    ): "bounded Brent reaches xatol 1e-12 on a bracket of two grid steps (0.054 in log a) in "
    "about 60 iterations: the limit of 500 is never reached",
    ("geospec/measure/demand_fit.py", "large = x > 1.0", "large = x >= 1.0"): (
        "at x = 1 both branches give log(e - 1), one ulp apart (0.5413248546129181 and "
        "0.541324854612918): no test tolerance tells them apart"
    ),
    ("geospec/measure/demand_fit.py", "large = x > 1.0", "large = x > 2.0"): (
        "for 1 < x <= 2 log(expm1(x)) neither overflows nor cancels: both branches give "
        "log(e^x - 1) to within 4.1e-16 relative (measured over 10^5 points)"
    ),
    # plugins/schedules/profiles.py
    (
        "plugins/schedules/profiles.py",
        "return self.solver().bounds(dims.width_problem([1.0] * dims.n_layers))",
        "return self.solver().bounds(dims.width_problem([2.0] * dims.n_layers))",
    ): "the solver's bounds do not depend on the work (any profile gives the same ones)",
}


def modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(config["only_mutate"])


def exit_codes(module: str) -> dict[str, int | None]:
    meta = ROOT / "mutants" / f"{module}.meta"
    if not meta.exists():
        return {}
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    return codes


def _changes(name: str, module: str) -> list[str]:
    """The removed and added lines of mutmut's own diff of the mutant."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(name, path=module).splitlines()
    return [line for line in diff if line[:1] in "-+" and line[:3] not in ("---", "+++")]


def changed_lines(name: str, module: str) -> tuple[str, str] | None:
    """The mutated line before and after (stripped), when the mutant changes one line."""
    changes = _changes(name, module)
    before = [line[1:].strip() for line in changes if line.startswith("-")]
    after = [line[1:].strip() for line in changes if line.startswith("+")]
    if len(before) != 1 or len(after) != 1:
        return None
    return before[0], after[0]


def explain(name: str, module: str) -> str | None:
    """Why a survivor is equivalent (see :data:`EQUIVALENT`), or None: a missing test."""
    lines = changed_lines(name, module)
    return EQUIVALENT.get((module, *lines)) if lines else None


def score(show_survivors: bool) -> tuple[int, int]:
    """Print the table; return (killed, total) over every module."""
    totals: Counter[str] = Counter()
    width = max(len(m) for m in modules())
    unexplained: list[tuple[str, str]] = []
    for module in modules():
        codes = exit_codes(module)
        if not codes:
            print(f"{module:<{width}}  no mutants recorded: run mutmut first (--run)")
            continue
        counts: Counter[str] = Counter()
        for name, code in codes.items():
            if code in KILLED:
                counts["killed"] += 1
            elif code in SKIPPED:
                counts["skipped"] += 1
            elif code in SURVIVED or code in NO_TESTS:
                if explain(name, module) is not None:
                    counts["equivalent"] += 1
                else:
                    counts["no tests" if code in NO_TESTS else "survived"] += 1
                    unexplained.append((name, module))
            else:  # not checked yet, suspicious, interrupted
                counts["unknown"] += 1
        counts["total"] = len(codes)
        totals.update(counts)
        print(f"{module:<{width}}  mutation score: {_line(counts)}")
    print(f"{'total':<{width}}  mutation score: {_line(totals)}")
    if show_survivors and unexplained:
        print(f"\n{len(unexplained)} survivors without a test that kills them:")
        for name, module in unexplained:
            print(f"# {name}\n" + "\n".join(_changes(name, module)))
    return totals["killed"], totals["total"]


def _line(counts: Counter[str]) -> str:
    killed, total = counts["killed"], counts["total"]
    percent = 100 * killed / total if total else 0.0
    labels = {
        "equivalent": "equivalent",
        "survived": "survived without a test",
        "no tests": "reached by no test",
        "unknown": "not run yet",
    }
    notes = [f"{counts[k]} {label}" for k, label in labels.items()]
    extra = ", ".join(n for n in notes if not n.startswith("0 "))
    return f"{killed}/{total} killed ({percent:.1f}%)" + (f"; {extra}" if extra else "")


def run_mutmut(max_children: int, only: list[str]) -> None:
    start = time.monotonic()
    # mutmut matches names with fnmatch: "geospec.measure.demand_fit.*" is one module
    command = ["mutmut", "run", "--max-children", str(max_children), *only]
    subprocess.run(command, cwd=ROOT, check=True)
    minutes = (time.monotonic() - start) / 60
    print(f"\nmutmut run took {minutes:.1f} minutes with {max_children} workers")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="run mutmut first (timed)")
    parser.add_argument("--max-children", type=int, default=2, help="mutmut's parallel workers")
    parser.add_argument("--survivors", action="store_true", help="print unexplained survivors")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GLOB",
        help="run only the mutants whose names match (repeatable; fnmatch)",
    )
    parser.add_argument(
        "--fail-under", type=float, default=None, help="exit 1 below this total percentage"
    )
    args = parser.parse_args()
    os.chdir(ROOT)  # mutmut reads mutants/ and pyproject.toml from the project root
    if args.run:
        run_mutmut(args.max_children, args.only)
    killed, total = score(args.survivors)
    if args.fail_under is not None and (not total or 100 * killed / total < args.fail_under):
        print(f"mutation score below {args.fail_under:g}%")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
