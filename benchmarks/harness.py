"""The one benchmark harness: warm-up, repeated rounds, median + spread, JSON + PNG.

Every benchmark (`runfold bench <name>`) is a *round function*: given a `RoundContext`
(a unique topic prefix, the round number, whether it is a warm-up), it runs one full
measurement against the broker and returns ``{case: {metric: number, ...}, ...}``
(e.g. ``{"runfold": {"records_per_s": 41000.0, "correct": 1}, "quix": {...}}``).
A case that fails returns ``{"error": "..."}`` for that round; the others still count.

    bench = Bench("keyed_fold", params={"records": 200_000}, rounds=3, warmup=1)
    result = bench.run(round_fn)                # warm-up rounds are run and discarded
    bench.ratio("runfold_vs_quix", "runfold", "quix", "records_per_s")
    bench.save(plot=[("records/s", "records_per_s")])  # benchmarks/results/keyed_fold.{json,png}

Summaries per (case, metric): median, min, max, spread (max-min as % of the median) and n.
Results go to `benchmarks/results/` (git-ignored); the directory can be moved with
RUNFOLD_BENCH_RESULTS. Broker: `KAFKA_BOOTSTRAP_SERVERS` (else the local broker's address).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from topology.settings import KafkaSettings, admin_config

ROOT = Path(__file__).resolve().parent.parent
Metrics = dict[str, Any]
RoundResult = dict[str, Metrics]


def results_dir() -> Path:
    d = Path(os.environ.get("RUNFOLD_BENCH_RESULTS", ROOT / "benchmarks" / "results"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def bootstrap() -> str:
    return KafkaSettings().bootstrap_servers


def unique_prefix(tag: str) -> str:
    """A topic prefix no other round, test or helper uses (letters and digits only)."""
    clean = "".join(c for c in tag.lower() if c.isalnum())[:8]
    return f"b{clean}{uuid.uuid4().hex[:8]}"


def delete_topics_containing(prefix: str, bootstrap_servers: str | None = None) -> int:
    """Delete every topic whose name contains `prefix` (runfold's and the peers' own topics)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(admin_config(KafkaSettings(bootstrap_servers=bootstrap_servers or bootstrap())))
    names = [t for t in admin.list_topics(timeout=15).topics if prefix in t]
    if not names:
        return 0
    for fut in admin.delete_topics(names, operation_timeout=30).values():
        try:
            fut.result()
        except Exception as e:  # cleanup must not hide the measurement
            print(f"cleanup: {e}", file=sys.stderr)
    return len(names)


def host_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "loadavg_1m_at_start": round(load[0], 2),
        "bootstrap": bootstrap(),
    }


def error_text(e: BaseException) -> str:
    """The error and the innermost frame it came from: enough to say what broke, short."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}"[:2000]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..1)."""
    if not sorted_values:
        return float("nan")
    idx = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[idx]


@dataclass
class RoundContext:
    bench: str
    index: int  # 0-based among measured rounds; -1, -2, ... for warm-ups
    warmup: bool
    prefix: str
    params: dict[str, Any]

    def log(self, msg: str) -> None:
        tag = "warm-up" if self.warmup else f"round {self.index + 1}"
        print(f"[{self.bench} {tag}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Summary:
    median: float
    min: float
    max: float
    spread_pct: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Summary:
        med = statistics.median(values)
        lo, hi = min(values), max(values)
        spread = 100.0 * (hi - lo) / abs(med) if med else 0.0
        return cls(round(med, 3), round(lo, 3), round(hi, 3), round(spread, 1), len(values))

    def to_dict(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "spread_pct": self.spread_pct,
            "n": self.n,
        }


@dataclass
class Bench:
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    rounds: int = 3
    warmup: int = 1
    rounds_data: list[RoundResult] = field(default_factory=list)
    summary: dict[str, dict[str, Summary]] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    ratios: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    host: dict[str, Any] = field(default_factory=host_info)

    def run(self, round_fn: Callable[[RoundContext], RoundResult]) -> Bench:
        for w in range(self.warmup):
            ctx = RoundContext(self.name, -(w + 1), True, unique_prefix(self.name), self.params)
            try:
                round_fn(ctx)
            except Exception as e:  # a failed warm-up is reported, the rounds still run
                ctx.log(f"warm-up failed: {error_text(e)}")
        for i in range(self.rounds):
            ctx = RoundContext(self.name, i, False, unique_prefix(self.name), self.params)
            try:
                result = round_fn(ctx)
            except Exception as e:
                ctx.log(f"round failed: {error_text(e)}")
                result = {"_round": {"error": error_text(e)}}
            ctx.log(orjson.dumps(result).decode()[:1500])
            self.rounds_data.append(result)
        self._summarise()
        return self

    def _summarise(self) -> None:
        values: dict[str, dict[str, list[float]]] = {}
        for rnd in self.rounds_data:
            for case, metrics in rnd.items():
                if "error" in metrics:
                    self.errors.setdefault(case, []).append(str(metrics["error"]))
                for k, v in metrics.items():
                    if isinstance(v, bool):
                        v = int(v)
                    if isinstance(v, int | float) and v == v:  # skip NaN
                        values.setdefault(case, {}).setdefault(k, []).append(float(v))
        self.summary = {c: {k: Summary.of(v) for k, v in ms.items()} for c, ms in values.items()}

    def median(self, case: str, metric: str) -> float | None:
        s = self.summary.get(case, {}).get(metric)
        return s.median if s is not None else None

    def ratio(
        self, name: str, case: str, baseline: str, metric: str, target: float | None = None
    ) -> float | None:
        """median(case) / median(baseline) for `metric`; None when either is missing."""
        a, b = self.median(case, metric), self.median(baseline, metric)
        value = round(a / b, 3) if a is not None and b else None
        self.ratios[name] = {
            "value": value,
            "case": case,
            "baseline": baseline,
            "metric": metric,
            "target": target,
            "met": (value >= target) if (value is not None and target) else None,
        }
        return value

    def to_dict(self) -> dict[str, Any]:
        return {
            "bench": self.name,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.started)),
            "seconds": round(time.time() - self.started, 1),
            "host": self.host,
            "params": self.params,
            "rounds": self.rounds,
            "warmup": self.warmup,
            "summary": {c: {k: s.to_dict() for k, s in ms.items()} for c, ms in self.summary.items()},
            "ratios": self.ratios,
            "errors": self.errors,
            "notes": self.notes,
            "raw_rounds": self.rounds_data,
        }

    def save(self, plot: Iterable[tuple[str, str]] = (), title: str | None = None) -> Path:
        """Write `<name>.json` and, when `plot` names metrics, `<name>.png`; returns the JSON path."""
        out = results_dir()
        path = out / f"{self.name}.json"
        path.write_bytes(orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2))
        panels = list(plot)
        if panels:
            try:
                bar_plot(self, panels, out / f"{self.name}.png", title or self.name)
            except Exception as e:  # a missing matplotlib must not lose the JSON
                print(f"plot skipped: {error_text(e)}", file=sys.stderr)
        return path

    def table(self, metrics: Iterable[str]) -> str:
        """A plain-text table of medians (and spread) per case for the console."""
        metrics = list(metrics)
        rows = [["case", *metrics]]
        for case, ms in self.summary.items():
            if case.startswith("_"):
                continue
            row = [case]
            for m in metrics:
                s = ms.get(m)
                row.append("-" if s is None else f"{s.median:,.1f} ±{s.spread_pct:.0f}%")
            if case in self.errors:
                row[0] += " (errors)"
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def bar_plot(bench: Bench, panels: list[tuple[str, str]], path: Path, title: str) -> None:
    """One panel per (label, metric): a bar per case at the median, whiskers at min..max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in bench.summary if not c.startswith("_")]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(max(5.0, 1.2 * len(cases) + 2) * len(panels), 4.2), squeeze=False
    )
    for ax, (label, metric) in zip(axes[0], panels, strict=True):
        shown = [c for c in cases if metric in bench.summary[c]]
        meds = [bench.summary[c][metric].median for c in shown]
        lo = [m - bench.summary[c][metric].min for c, m in zip(shown, meds, strict=True)]
        hi = [bench.summary[c][metric].max - m for c, m in zip(shown, meds, strict=True)]
        ax.bar(range(len(shown)), meds, yerr=[lo, hi], capsize=4, color="#4472c4")
        ax.set_xticks(range(len(shown)), shown, rotation=30, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
        for x, m in enumerate(meds):
            ax.annotate(
                f"{m:,.0f}" if abs(m) >= 100 else f"{m:,.2f}", (x, m), ha="center", va="bottom", fontsize=7
            )
    fig.suptitle(f"{title} — median of {bench.rounds} round(s), whiskers min..max", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def spawn_log(name: str) -> Path:
    """A log file for a benchmark's subprocesses (kept after the run for post-mortems)."""
    d = results_dir() / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{name}-{uuid.uuid4().hex[:6]}.log"
