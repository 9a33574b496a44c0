"""Compare two runs: what got worse, what got better, and whether the comparison is complete.

Per row: status changes, accuracy (max abs error or ``tol_ratio`` grown ``error_factor`` times, more NaN) and a
latency verdict (:mod:`harness.review.stats`); per run: one-sided rows, a device or version mismatch (docs/review.md).
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.cases.vocab import GRADED
from harness.results.report import ENV, Regressions, write_page
from harness.results.storage import RunFolderError, load_run
from harness.review import stats
from harness.run.runner import NOT_TIMED

EXIT_OK, EXIT_WORSE, EXIT_INCOMPLETE, EXIT_UNCONFIRMED = 0, 1, 4, 5  # 2 bad input, 3 internal (harness.cli.options)
UNCONFIRMED = "unconfirmed"  # a latency row the unpaired rule called slower, not re-timed in paired rounds
_RANK = {"pass": 0, "fail": 1, "error": 2}
KEY = ["case", "backend"]
_FIELDS = ["device", "status", "reason", "max_abs_err", "atol", "tol_ratio", "nan_count", "latency_us",
           "latency_p10_us", "latency_p90_us", "latency_samples_us", "call_us", "worst_location", "note"]  # fmt: skip
META_KEYS = ("device", "device_name", "torch", "triton")
RETIMED = "interleaved re-run"  # how a re-timed row's verdict_reason begins (harness.review.confirm)
DRIFT = "latency drift"  # how the note of runs that moved as wholes begins (drift_warning)


class DuplicateRowsError(ValueError):
    """A run holds one (case, backend) twice: which one to compare would be a guess."""


@dataclass(frozen=True)
class CompareOptions:
    """Thresholds of a comparison; ``min_effect`` None means per device (10% CPU, 3% CUDA)."""

    min_effect: float | None = None
    alpha: float = 0.05
    correction: str = "bh"
    error_factor: float = 2.0
    allow_mismatch: bool = False
    normalize_by: str | None = None  # an unchanged backend whose per-case median rescales the new run


@dataclass
class Comparison:
    rows: pd.DataFrame  # every (case, backend) of either run: sides, verdicts, 'worse'/'better'/'why'
    problems: list[str] = field(default_factory=list)  # run-level: mismatches, one-sided rows
    incomplete: bool = False

    @property
    def regressions(self) -> pd.DataFrame:
        return self.rows[self.rows["why"] != ""].reset_index(drop=True)

    @property
    def improvements(self) -> pd.DataFrame:
        return self.rows[self.rows["better"] != ""].reset_index(drop=True)

    @property
    def unconfirmed(self) -> pd.DataFrame:
        return self.rows[self.rows["verdict"] == UNCONFIRMED].reset_index(drop=True)

    @property
    def exit_code(self) -> int:
        if not self.regressions.empty:
            return EXIT_WORSE
        if not self.unconfirmed.empty:  # a possible slowdown nobody could check says more than a missing row
            return EXIT_UNCONFIRMED
        return EXIT_INCOMPLETE if self.incomplete else EXIT_OK

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


def load_runs(*run_dirs: Path) -> list[tuple[pd.DataFrame, dict]]:
    """Each run folder's (rows, meta); a RunFolderError names every folder that is not a run, one a line."""
    loaded, errors = [], []
    for run_dir in run_dirs:
        try:
            loaded.append(load_run(run_dir))
        except RunFolderError as error:
            errors.append(str(error))
    if errors:
        raise RunFolderError("\n".join(errors))
    return loaded


def compare_runs(base: pd.DataFrame, new: pd.DataFrame, base_meta: dict | None = None, new_meta: dict | None = None,
                 options: CompareOptions | None = None, **overrides) -> Comparison:  # fmt: skip
    opts = options or CompareOptions(**overrides)
    found = []  # every run with a (case, backend) row twice, and the first few of its pairs
    for frame, name in ((base, "base run"), (new, "new run")):
        if not (dup := frame[frame.duplicated(KEY, keep=False)]).empty:
            pairs = sorted({f"{b} on {c}" for c, b in zip(dup["case"], dup["backend"], strict=True)})
            found.append(f"{name}: duplicated (case, backend) rows: {', '.join(pairs[:5])}")
    if found:
        raise DuplicateRowsError("\n".join(found))
    base, new = base.reindex(columns=KEY + _FIELDS), new.reindex(columns=KEY + _FIELDS)
    rows = base.merge(new, on=KEY, how="outer", suffixes=("_base", "_new"), indicator="side")
    rows["side"] = rows["side"].map({"both": "both", "left_only": "base only", "right_only": "new only"})
    rows = rows.sort_values(KEY, kind="stable").reset_index(drop=True)
    unanchored = normalize_to_anchor(rows, opts.normalize_by) if opts.normalize_by else 0
    _latency_verdicts(rows, opts)
    if opts.normalize_by:
        anchor_rows = (rows["backend"] == opts.normalize_by) & rows["verdict"].isin(["same", "slower", "faster"])
        rows.loc[anchor_rows, "verdict"] = "anchor"
        rows.loc[anchor_rows, "verdict_reason"] = f"latencies normalized by {opts.normalize_by}: 1.0 by construction"
    changes = [_row_changes(r, opts) for _, r in rows.iterrows()]
    rows["why"], rows["better"] = [[c[side] for c in changes] for side in (0, 1)]
    one_sided = {what: int((rows["side"] == side).sum()) for side, what in
                 (("base only", "missing from the new run"), ("new only", "new, with no baseline"))}  # fmt: skip
    problems = [f"{count} row(s) {what}" for what, count in one_sided.items() if count]
    sides = [(key, (base_meta or {}).get(key), (new_meta or {}).get(key)) for key in META_KEYS]
    mismatches = [f"{key} {b} -> {n}" for key, b, n in sides if b is not None and n is not None and b != n]
    problems += [f"not like for like: {m}" + (" (allowed)" if opts.allow_mismatch else "") for m in mismatches]
    if unanchored:
        problems.append(f"{unanchored} timed row(s) not normalized: their case lacks a timed {opts.normalize_by} "
                        "row in one run")  # fmt: skip
    problems += drift_warning(rows)
    one_timed, over_budget = timed_on_one_side(rows)
    problems += [text for text in (one_timed, over_budget) if text]
    incomplete = (
        bool((rows["side"] != "both").any()) or (bool(mismatches) and not opts.allow_mismatch) or bool(one_timed)
    )
    return Comparison(rows=rows, problems=problems, incomplete=incomplete)


def timed_on_one_side(rows: pd.DataFrame) -> tuple[str, str]:
    """Problems ('' for none) of rows graded in both runs but timed in one only: (``--no-timing`` in one run,
    which makes the comparison incomplete; a call that outlasted the row's timing budget, said only)."""
    graded = rows[(rows["side"] == "both") & rows["status_base"].isin(GRADED) & rows["status_new"].isin(GRADED)]
    base_only = graded["latency_us_base"].notna() & graded["latency_us_new"].isna()
    new_only = graded["latency_us_new"].notna() & graded["latency_us_base"].isna()
    untimed_note = graded["note_new"].where(base_only, graded["note_base"]).astype("string").fillna("")
    over_budget = (base_only | new_only) & untimed_note.str.contains(NOT_TIMED, regex=False)
    base_only, new_only = base_only & ~over_budget, new_only & ~over_budget
    budget = (f"{int(over_budget.sum())} graded row(s) timed in one run only: in the other, one call outlasted the "
              "row's timing budget (a Python model on a GPU, or a slow one under load), so the row was graded, not "
              "timed; their latency is not compared" if over_budget.any() else "")  # fmt: skip
    if not base_only.any() and not new_only.any():
        return "", budget
    untimed = "the new run" if base_only.sum() >= new_only.sum() else "the base run"
    return (f"{int(base_only.sum() + new_only.sum())} graded row(s) timed in one run only ({untimed} was not timed: "
            "--no-timing?); their latency is not compared"), budget  # fmt: skip


def normalize_to_anchor(rows: pd.DataFrame, anchor: str) -> int:
    """Scale each case's new latencies by its anchor's median base/new, in place; the timed rows with no anchor."""
    both = rows[(rows["side"] == "both") & rows["latency_us_base"].notna() & rows["latency_us_new"].notna()]
    anchors = both[both["backend"] == anchor].set_index("case")
    factor = both["case"].map(anchors["latency_us_base"] / anchors["latency_us_new"])
    factor = factor[np.isfinite(factor)]  # NaN: the case has no timed anchor row
    scaled = ["latency_us_new", "latency_p10_us_new", "latency_p90_us_new"]
    rows.loc[factor.index, scaled] = rows.loc[factor.index, scaled].mul(factor, axis=0)
    for i, f in factor.items():  # the sample lists; None or NaN where a run kept none
        if (samples := rows.at[i, "latency_samples_us_new"]) is not None and not isinstance(samples, float):
            rows.at[i, "latency_samples_us_new"] = [s * f for s in samples]
    return len(both) - len(factor)


def drift_warning(rows: pd.DataFrame) -> list[str]:
    """A note when many rows of every kind moved one way between the two runs alone (the machine's load,
    more likely than the code); :func:`restate_drift` replaces what follows its first '; '."""
    judged = rows[rows["verdict"].isin(["slower", "faster", "same", "cannot tell"])]
    moved = judged[judged["verdict"].isin(["slower", "faster"])]
    if len(judged) < 8 or len(moved) < max(4, 0.25 * len(judged)) or moved["backend"].nunique() < 3:
        return []
    return [f"{DRIFT}: {len(moved)} of {len(judged)} timed rows across {moved['backend'].nunique()} backends moved "
            f"(median ratio {judged['ratio'].median():.2f}) between the two runs; the machine's load likely changed "
            "between them: rows it left doubtful are re-timed in paired rounds unless --no-confirm"]  # fmt: skip


def restate_drift(problems: list[str], reading: str) -> list[str]:
    """``problems`` with the drift note (:func:`drift_warning`) read as ``reading``: what it saw stays."""
    return [f"{p.split('; ', 1)[0]}; {reading}" if p.startswith(DRIFT) else p for p in problems]


def retimed_reading(rows: pd.DataFrame) -> str:
    """What paired rounds made of a drift: each verdict's count among the re-timed rows (slower ones are the code)."""
    retimed = rows[rows["verdict_reason"].fillna("").astype(str).str.startswith(RETIMED)]
    counts = {v: int((retimed["verdict"] == v).sum()) for v in stats.VERDICTS}
    found = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    said = f"paired rounds (both builds timed under one load) re-timed {len(retimed)} row(s): {found or 'none'}"
    if counts["slower"]:
        return f"{said}; the {counts['slower']} confirmed slower are a change of the code, not of the machine's load"
    return f"{said}; none is confirmed slower"


def _effect(r: pd.Series, opts: CompareOptions) -> float:
    if opts.min_effect is not None:
        return opts.min_effect
    return stats.default_effect(r["device_new"] if pd.notna(r["device_new"]) else r["device_base"])


def _latency_verdicts(rows: pd.DataFrame, opts: CompareOptions) -> None:
    """Adds ratio, ci_low, ci_high, p_value, p_adjusted, verdict, verdict_reason, evidence."""
    n = len(rows)
    cols = {k: np.full(n, np.nan) for k in ("ratio", "ci_low", "ci_high", "p_value")}
    verdict, reason, evidence = [""] * n, [""] * n, [""] * n
    tests: dict[int, stats.LatencyTest] = {}
    for i, r in rows.iterrows():
        if r["side"] != "both" or pd.isna(r["latency_us_base"]) or pd.isna(r["latency_us_new"]):
            continue
        cols["ratio"][i] = r["latency_us_new"] / r["latency_us_base"]
        sb, sn = stats.clean(r["latency_samples_us_base"]), stats.clean(r["latency_samples_us_new"])
        if len(sb) and len(sn):
            tests[i] = t = stats.compare_samples(sb, sn, alpha=opts.alpha, seed=i)
            for column in cols:  # ratio, ci_low, ci_high, p_value
                cols[column][i] = getattr(t, column)
        else:
            v = stats.weak_verdict(r["latency_us_base"], r["latency_us_new"], r["latency_p10_us_base"],
                                   r["latency_p90_us_base"], r["latency_p10_us_new"], r["latency_p90_us_new"],
                                   min_effect=_effect(r, opts))  # fmt: skip
            verdict[i], reason[i], evidence[i] = v.verdict, v.reason, v.evidence
    p_adjusted = stats.adjust_p_values(cols["p_value"], opts.correction)
    for i, t in tests.items():
        v = stats.decide(t, p_adjusted[i], min_effect=_effect(rows.loc[i], opts), alpha=opts.alpha)
        verdict[i], reason[i], evidence[i] = v.verdict, v.reason, v.evidence
    for k, v in cols.items():
        rows[k] = v
    rows["p_adjusted"] = p_adjusted
    rows["verdict"], rows["verdict_reason"], rows["evidence"] = verdict, reason, evidence


def _grew(base: float, new: float, factor: float, floor: float) -> bool:
    return pd.notna(base) and pd.notna(new) and new > factor * base and new > floor


def _row_changes(r: pd.Series, opts: CompareOptions) -> tuple[str, str]:
    """(what got worse, what got better) in one merged row, each change joined by "; "."""
    if r["side"] != "both":
        return "", ""
    worse, better = [], []
    sb, sn = r["status_base"], r["status_new"]
    rank_b, rank_n = _RANK.get(sb, 2), _RANK.get(sn, 2)
    if sn == "skip" != sb or (sb == "skip" and sn in ("fail", "error")) or (sb != "skip" and rank_n > rank_b):
        worse.append(f"status {sb} -> {sn}")
    elif sb != "skip" and rank_n < rank_b:
        better.append(f"fixed: {sb} -> {sn}")
    if sb in ("pass", "fail") and sn in ("pass", "fail"):
        eb, en, atol = r["max_abs_err_base"], r["max_abs_err_new"], r["atol_new"]
        if _grew(eb, en, opts.error_factor, atol / 10 if pd.notna(atol) else 0.0):
            worse.append(f"max abs err {eb:.2e} -> {en:.2e}")
        tb, tn = r["tol_ratio_base"], r["tol_ratio_new"]
        if _grew(tb, tn, opts.error_factor, 0.1):
            worse.append(f"tolerance margin shrunk: {tb:.2f} -> {tn:.2f} of the tolerance")
        nb, nn = r["nan_count_base"], r["nan_count_new"]
        if pd.notna(nb) and pd.notna(nn) and nn > nb:
            worse.append(f"NaN count {nb:.0f} -> {nn:.0f}")
    lb, ln, verdict = r["latency_us_base"], r["latency_us_new"], r["verdict"]
    if verdict in ("slower", "faster"):
        weak = ", weak evidence" if str(r["evidence"]).startswith("p10/p90") else ""
        text = f"latency {lb:.1f} -> {ln:.1f} us ({100 * (ln / lb - 1):+.0f}%; {r['verdict_reason']}{weak})"
        (worse if verdict == "slower" else better).append(text)  # the reason holds no "; "
    return "; ".join(worse), "; ".join(better)


def mark_unconfirmed(comparison: Comparison, why: str, options: CompareOptions | None = None) -> Comparison:
    """Rows whose latency verdict is "slower" from the two runs alone become "unconfirmed": ``why`` says
    what kept them from being re-timed in paired rounds. Their accuracy changes still count as worse."""
    opts = options or CompareOptions()
    rows = comparison.rows.copy()
    for i in rows.index[rows["verdict"] == "slower"]:
        lb, ln = rows.at[i, "latency_us_base"], rows.at[i, "latency_us_new"]
        rows.at[i, "verdict"] = UNCONFIRMED
        rows.at[i, "verdict_reason"] = (f"latency {lb:.1f} -> {ln:.1f} us ({100 * (ln / lb - 1):+.0f}%) in two "
                                        f"separate runs, not re-timed in paired rounds: {why}")  # fmt: skip
        rows.loc[i, ["why", "better"]] = _row_changes(rows.loc[i], opts)
    reading = f"the machine's load likely changed between them, and no row was re-timed in paired rounds: {why}"
    problems = restate_drift(comparison.problems, reading)
    return Comparison(rows=rows, problems=problems, incomplete=comparison.incomplete)


def verdict_counts(comparison: Comparison) -> dict[str, int]:
    """How many rows got each latency verdict (rows timed on both sides only)."""
    found = comparison.rows["verdict"].value_counts()
    counts = {v: int(found.get(v, 0)) for v in stats.VERDICTS}
    # --normalize-by's own rows; slower rows nobody re-timed
    return counts | {extra: int(found[extra]) for extra in ("anchor", UNCONFIRMED) if extra in found}


def format_comparison(comparison: Comparison, base_name: str, new_name: str, *, show_all: bool = False) -> str:
    """The terminal view: run-level problems, then the rows that changed (or all), then the tally."""
    rows = comparison.rows
    lines = [f"compared {len(rows)} (case, backend) rows: {base_name} -> {new_name}"]
    lines += [f"! {p}" for p in comparison.problems]
    # Rows the two runs alone call faster while the runs drifted: not a verdict to act on.
    unpaired_faster = (  # a row worse otherwise (less accurate) is shown WORSE, not better?
        (rows["verdict"] == "faster") & ~rows["verdict_reason"].fillna("").str.startswith(RETIMED)
        & rows["better"].astype(bool) & ~rows["why"].astype(bool)
        if any(p.startswith(DRIFT) for p in comparison.problems) else pd.Series(False, index=rows.index)
    )  # fmt: skip
    better = rows["better"].astype(bool)
    marks = np.select([rows["why"].astype(bool), better & unpaired_faster, better, rows["verdict"] == UNCONFIRMED,
                       rows["side"] != "both", rows["verdict"] == "cannot tell"],
                      ["WORSE", "better?", "better", "UNCONFIRMED", rows["side"], "?"],
                      "" if show_all else None)  # fmt: skip
    table = []
    for what, (_, r) in zip(marks, rows.iterrows(), strict=True):
        if what is None:
            continue
        detail = (
            r["why"] or r["better"] or (r["verdict_reason"] if r["verdict"] in ("cannot tell", UNCONFIRMED) else "")
        )
        status = f"{r['status_base']} -> {r['status_new']}" if r["side"] == "both" else ""
        ci = f" [{r['ci_low']:.2f}-{r['ci_high']:.2f}]" if pd.notna(r["ci_low"]) else ""
        ratio = f"{r['ratio']:.3f}{ci}" if pd.notna(r["ratio"]) else ""
        table.append((what, r["backend"], r["case"], status, ratio, r["verdict"], detail))
    if table:
        header = ("", "backend", "case", "status", "latency new/base [CI]", "latency", "why")
        widths = [max(len(str(t[k])) for t in [header, *table]) for k in range(6)]
        lines += ["  ".join(str(t[k]).ljust(widths[k]) for k in range(6)) + "  " + str(t[6]) for t in [header, *table]]
    counts = verdict_counts(comparison)
    weak = int((rows["evidence"] == "p10/p90 (weak)").sum())
    said = ", ".join(f"{v} {n}" for v, n in counts.items())
    if weak:
        said += f" ({weak} from p10/p90 only: weak evidence)"
    if unpaired_faster.any():
        said += (f" ({int(unpaired_faster.sum())} faster by the two runs alone while they drifted, marked 'better?': "
                 "`--confirm all` re-times them)")  # fmt: skip
    lines.append(f"latency verdicts: {said}")
    code = comparison.exit_code
    where = {EXIT_INCOMPLETE: " (see '!' above)", EXIT_UNCONFIRMED: " (UNCONFIRMED above says why)"}.get(code, "")
    lines.append(f"exit {code}: {exit_summary(comparison)}{where}")
    return "\n".join(lines)


def exit_summary(comparison: Comparison) -> str:
    """What the exit code says, in words (the terminal's last line and the page's verdict)."""
    return {
        EXIT_OK: "nothing got worse; the comparison is complete",
        EXIT_WORSE: f"{len(comparison.regressions)} row(s) got worse",
        EXIT_INCOMPLETE: "nothing got worse, but the comparison is incomplete",
        EXIT_UNCONFIRMED: f"nothing is confirmed worse, but {len(comparison.unconfirmed)} latency row(s) judged slower "
        "by the two runs alone could not be re-timed in paired rounds",
    }[comparison.exit_code]


def regressions_of(frame: pd.DataFrame, meta: dict, baseline: tuple[pd.DataFrame, dict]) -> Regressions:
    """What the run page marks against ``baseline`` = (frame, meta) of an earlier run."""
    comparison = compare_runs(baseline[0], frame, baseline[1], meta)
    worse = comparison.regressions
    marked = {(r["case"], r["backend"]): r["why"] for _, r in worse.iterrows()}
    return marked, worse[["case", "backend", "why"]].to_dict("records"), comparison.problems


def write_compare_html(comparison, path: Path, base: tuple, new: tuple) -> Path:
    """The comparison as a page: exit verdict, run-level problems, changed rows, then every row."""
    rows = comparison.rows.copy()
    unclear = rows["verdict"].isin(["cannot tell", UNCONFIRMED])
    kinds = [rows["why"].astype(bool), rows["better"].astype(bool), unclear, rows["side"] != "both"]
    rows["_kind"] = np.select(kinds, ["worse", "better", "unclear", "one side"], "same")
    rank = {"worse": 0, "one side": 1, "unclear": 2, "better": 3, "same": 4}
    rows = rows.assign(_rank=rows["_kind"].map(rank)).sort_values(["_rank", "case", "backend"], kind="stable")
    html = ENV.get_template("compare.html.j2").render(
        base_name=str(base[0]), base_meta=base[1] or {}, new_name=str(new[0]), new_meta=new[1] or {},
        comparison=comparison, rows=rows.to_dict("records"), counts=verdict_counts(comparison),
        summary=exit_summary(comparison),
    )  # fmt: skip
    return write_page(path, html)
