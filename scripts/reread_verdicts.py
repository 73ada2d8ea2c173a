"""Re-read the committed verdicts (analysis/results/*/stats.csv, percentile bootstrap) with
the t-interval that replaced it (replay_exp.analysis.stats, method "t").

The committed studies' run directories are not in the repository, so the exact t-interval
cannot be recomputed; this reconstructs it from what each stats.csv keeps:

- **final, paired seeds** (``final_per_seed`` present): the seed component is exact, s^2 / S
  from the per-seed differences (df S - 1); the problem component is what the committed
  percentile interval holds beyond the seeds' share: (half-width / 1.96)^2 - (S - 1) / S *
  s^2 / S, floored at 0. Then ``t_interval`` (Welch df).
- **every other statistic** (peak, saving, stability, unpaired finals): the point +- the
  committed interval's half-width times the factor the row's final got (new / old
  half-width), widened to contain the old interval, or, where the row has none, the
  seed-dominated factor sqrt(S / (S - 1)) * t_{S-1} / 1.96 (1.58 at 5 seeds); a side at
  -inf (saving: never) stays. Checked against
  the exact t-interval on fig4's on-policy lr 6e-5 vs 1.2e-4, whose runs the budget study
  re-ran bit for bit (docs/findings.md): final [-0.038, +0.029] (exact [-0.039, +0.029]),
  peak [-0.029, +0.020] (exact [-0.027, +0.019]), stability [+0.016, +0.058] (exact [+0.021,
  +0.053]): close for final and peak, conservative for stability.

The final pass@k differences (passk_stats.csv) have no per-seed values: the seed-dominated
factor. Prints the verdicts that change; writes analysis/results/reread_verdicts.csv (every
row, old and re-read intervals).

    python scripts/reread_verdicts.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from replay_exp.analysis.stats import STATS, t_interval, verdict

ROOT = Path(__file__).resolve().parents[1] / "analysis" / "results"


def seed_factor(S: int) -> float:
    return math.sqrt(S / (S - 1)) * float(student_t.ppf(0.975, S - 1)) / 1.959964


def reread_row(r: pd.Series) -> dict:
    S = int(r["seeds"])
    out = {"label": r["label"], "baseline": r["baseline"], "seeds": S}
    factor = seed_factor(S)
    per_seed = r.get("final_per_seed")
    if isinstance(per_seed, str) and S > 1:
        d = np.array([float(v) for v in per_seed.split()])
        s2 = float(d.var(ddof=1))
        half = (r["final_hi"] - r["final_lo"]) / 2
        v_prob = max(0.0, (half / 1.959964) ** 2 - (S - 1) / S * s2 / S)
        t = t_interval(float(r["final"]), [(s2 / S, S - 1), (v_prob, math.inf)])
        out.update(final_new_lo=t["lo"], final_new_hi=t["hi"], final_mde=t["mde"])
        if half > 0:
            factor = (t["hi"] - t["lo"]) / 2 / half
    out["factor"] = factor
    for name in STATS:
        if name not in r:  # an older report without this statistic
            out[f"{name}_changed"] = False
            continue
        point, lo, hi = r[name], r[f"{name}_lo"], r[f"{name}_hi"]
        out[f"{name}"] = point
        out[f"{name}_old"] = f"[{lo:+.3f}, {hi:+.3f}]"
        out[f"{name}_old_verdict"] = r[f"{name}_verdict"]
        if f"{name}_new_lo" not in out:
            if math.isfinite(point) and math.isfinite(lo) and math.isfinite(hi):
                # The t-interval is symmetric about the point; never narrower than the old
                # one on either side (a skewed percentile interval, e.g. of a saving, would
                # otherwise lose a side to the symmetrisation).
                half = factor * (hi - lo) / 2
                new_lo, new_hi = min(point - half, lo), max(point + half, hi)
            elif math.isfinite(point):  # a "never" side stays; the other widens
                new_lo = point - factor * (point - lo) if math.isfinite(lo) else lo
                new_hi = point + factor * (hi - point) if math.isfinite(hi) else hi
            else:
                new_lo, new_hi = lo, hi
            out[f"{name}_new_lo"], out[f"{name}_new_hi"] = new_lo, new_hi
        nlo, nhi = out[f"{name}_new_lo"], out[f"{name}_new_hi"]
        out[f"{name}_new"] = f"[{nlo:+.3f}, {nhi:+.3f}]"
        out[f"{name}_new_verdict"] = verdict(nlo, nhi)
        out[f"{name}_changed"] = out[f"{name}_new_verdict"] != r[f"{name}_verdict"]
    return out


def main() -> None:
    rows = []
    for path in sorted(ROOT.rglob("stats.csv")):
        study = str(path.parent.relative_to(ROOT))
        stats = pd.read_csv(path)
        for _, r in stats.iterrows():
            rows.append({"study": study, "metric": "pass@1", **reread_row(r)})
        passk = path.parent / "passk_stats.csv"
        if passk.is_file():  # final pass@k differences: the seed-dominated factor
            seeds = dict(zip(stats["label"], stats["seeds"], strict=True))
            for _, r in pd.read_csv(passk).iterrows():
                r = r.copy()
                r["seeds"], r["baseline"] = seeds[r["label"]], stats["baseline"].iloc[0]
                rows.append({"study": study, "metric": f"pass@{r['k']}_sampled", **reread_row(r)})
    table = pd.DataFrame(rows)
    table.to_csv(ROOT / "reread_verdicts.csv", index=False)
    changed = table[[f"{n}_changed" for n in STATS]].any(axis=1)
    print(f"{len(table)} comparisons in {table['study'].nunique()} studies; "
          f"{int(changed.sum())} with a verdict that changes")  # fmt: skip
    for _, r in table.iterrows():
        for n in STATS:
            if r.get(f"{n}_changed") is True:
                print(f"- {r['study']}: {r['label']} vs {r['baseline']}, {r['metric']} {n} "
                      f"{r[n]:+.3f}: {r[f'{n}_old']} {r[f'{n}_old_verdict']} -> {r[f'{n}_new']} "
                      f"{r[f'{n}_new_verdict']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
