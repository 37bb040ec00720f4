"""Profiles that build themselves, end to end: recorded runs of models no shipped profile
covers, streamed through broker, detector worker and sink in fleet order.

``python -m benchmarks.fleet_profiles`` (``--quick``: the Llama group only; ``--group`` picks
the recorded groups, ``lab/runs/<group>/``). Each group's runs are sent one after the other —
five healthy runs, one fault, five healthy runs (the tenth healthy run completes what a profile
needs), then the rest, faults and healthy interleaved — each through a
:class:`~foreshock.delivery.kafka_sink.KafkaSink` to the embedded Tansu, a
:class:`~foreshock.detectors.worker.DetectorWorker` whose config is the store's (reloaded, and
its profile builder hooked in exactly as ``foreshock detect --store`` does) and a
:class:`~foreshock.storage.sink.StorageSink`. The store's policy is ``auto``: nobody types a
command. Nothing is trained: the runs are the recorded ones.

Per run: the profile that judged it (the profile in force when it started), its warnings read
back from the store, judged by :func:`~foreshock.detectors.judge.judge`; per fault run, its
lead beside its envelope lead (:mod:`foreshock.lab.envelope`, the ceiling: how early any series
read by a mechanism rule leaves the group's healthy runs for good). The acceptance figures:

* the profile is published with no command, once 10 healthy runs are stored;
* fault runs after it: lead ≥ 70 % of the envelope lead, with the right cause;
* healthy runs after it: the share that warned falsely, beside the stated rate (the sum over
  mechanism families of the profile's ``false_alarm``: a union bound).

A table, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from foreshock.catalogue import MECHANISMS
from foreshock.lab.recorded import RECORDED_DIR, load_run
from foreshock.transport.settings import KafkaSettings

from ._table import emit_json, format_table, median

GROUPS = ("llama", "deepseek-v3")
SHARE = 0.7  # of the envelope lead a fault run's lead must reach
# The rules a fleet-built profile is made by (detectors/, operate/profile_builder.py) were last
# changed before this time; runs that started after it were trained after the rules froze
# (``trained_after_freeze`` in the rows, and the ``…_frozen`` figures of the summary).
FROZEN = "2026-12-06T04:59:37+00:00"


def fleet_order(*folders: Path) -> list[Path]:
    """Five healthy runs, one fault, five healthy, then faults and healthy interleaved."""
    found = [p for folder in folders for p in folder.glob("*.jsonl.gz")]
    runs = sorted(found, key=lambda p: (_seed(p), p.name))
    healthy = [p for p in runs if "-healthy-" in p.name]
    faults = [p for p in runs if "-healthy-" not in p.name]
    order = healthy[:5] + faults[:1] + healthy[5:10]
    rest_h, rest_f = healthy[10:], faults[1:]
    while rest_h or rest_f:
        order += rest_f[:1] + rest_h[:1]
        rest_f, rest_h = rest_f[1:], rest_h[1:]
    return order


def _seed(path: Path) -> int:
    return int(path.name.split("-s")[-1].split(".")[0])


class Fleet:
    """Broker, worker and sink, each in a thread of its own, on one store."""

    def __init__(self, store: Path) -> None:
        from foreshock.detectors.profiles import merged, shipped_profiles
        from foreshock.detectors.registry import profiles_folder
        from foreshock.detectors.worker import DetectorWorker
        from foreshock.operate import profile_builder as pb
        from foreshock.storage.sink import StorageSink
        from foreshock.transport.broker import EmbeddedBroker
        from foreshock.transport.topics import ensure_topics

        self.store = store
        pb.set_policy(store, "auto", by="benchmark")
        self.broker = EmbeddedBroker().start()
        name = f"fleet-profiles.{uuid.uuid4().hex[:6]}"
        self.settings = KafkaSettings(
            bootstrap_servers=self.broker.bootstrap,
            metrics_topic=f"{name}.metrics",
            warnings_topic=f"{name}.warnings",
            deadletter_topic=f"{name}.dead",
            control_topic=f"{name}.control",
            partitions=3,
        )
        ensure_topics(self.settings)

        def configs() -> Any:
            from foreshock.detectors.profiles import load_profiles

            return merged(shipped_profiles(), load_profiles(profiles_folder(store)))

        self.worker = DetectorWorker(
            self.settings,
            configs(),
            reload=configs,
            reload_every=0.5,
            build_profiles=lambda: pb.build_profiles(store),
            on_switch=lambda event: pb.record_switch(store, event),
            build_after=0.5,
        )
        self.sink = StorageSink(self.settings, store, group_id="fleet-profiles-sink")
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=s.run, args=(self.stop,), daemon=True)
            for s in (self.worker, self.sink)
        ]
        for thread in self.threads:
            thread.start()

    def send(self, run: Any) -> str:
        """Send one recorded run; returns the profile the worker will judge it by."""
        from foreshock.app.harness import Replay
        from foreshock.delivery.kafka_sink import KafkaSink

        chosen = self.worker.detectors.choose(run.start).name
        sink = KafkaSink(self.settings)
        replay = Replay(run, run.run_id, interval=0)
        for j in range(len(replay)):
            sink.write(replay.message(j))
        sink.close()
        return chosen

    def wait_stored(self, run_id: str, timeout: float = 120.0) -> None:
        """Until the store holds the run as ended and its warnings came to rest."""
        from foreshock.operate.profile_groups import fleet_runs

        deadline = time.monotonic() + timeout
        while not any(r.run_id == run_id and r.ended for r in fleet_runs(self.store)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{run_id} not stored after {timeout} s")
            time.sleep(0.3)
        time.sleep(1.5)  # the warnings topic's last events, and the builder's turn

    def published(self) -> list[str]:
        """The profiles published into the store so far, oldest first."""
        from foreshock.operate import profile_builder as pb

        return [e["profile"] for e in pb.lineage(self.store) if e["action"] == "published"]

    def wait_profile(self, before: list[str], timeout: float = 60.0) -> str | None:
        """The newest profile published that is not in ``before`` (another group's), once
        the worker judges new runs by it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            new = [p for p in self.published() if p not in before]
            if new and new[-1] in self.worker.detectors.configs:
                return new[-1]
            time.sleep(0.3)
        return None

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        self.broker.stop()


def judged(store: Path, run: Any, profile: str) -> dict[str, Any]:
    """The run's stored warnings, judged."""
    from foreshock.detectors.judge import judge
    from foreshock.storage import queries
    from foreshock.storage.reader import open_history

    with open_history(store) as history:
        rows = queries.run_warnings(history, run.run_id)
    warnings = [SimpleNamespace(**{**r, "evidence": r["evidence"] or {}}) for r in rows]
    scenario = run.labels.get("scenario") or "unknown"
    v = judge(scenario, run.divergence_step, warnings)
    return {
        "run": run.run_id,
        "scenario": scenario,
        "profile": profile,
        "false": sum(v.false_warnings.values()),
        "lead": v.lead(),
        "attribution": v.attribution,
    }


def envelope_lead(run: Any, healthy: list[Any]) -> int | None:
    """The best lead of any series a mechanism rule reads (the ceiling)."""
    from foreshock.detectors.zero_shot import zero_shot_base
    from foreshock.lab.envelope import envelope_leads, healthy_envelope
    from foreshock.transport.records import parse_series_key

    base = zero_shot_base()

    def mechanism(key: str) -> bool:
        rule = base.rule_for(parse_series_key(key).metric)
        return rule is not None and rule.family in MECHANISMS

    leads = envelope_leads(run, healthy_envelope(healthy))
    return max((lead for key, lead in leads.items() if mechanism(key)), default=None)


def run_group(fleet: Fleet, group: str) -> dict[str, Any]:
    # the group's recorded runs, and those trained for this benchmark only (``<group>-fleet``:
    # kept apart so they calibrate no shipped or zero-shot profile)
    runs = [load_run(p) for p in fleet_order(RECORDED_DIR / group, RECORDED_DIR / f"{group}-fleet")]
    healthy = [r for r in runs if r.labels.get("scenario") == "healthy"]
    rows, profile, at = [], None, None
    before = fleet.published()  # other groups' profiles
    for i, run in enumerate(runs):
        chosen = fleet.send(run)
        fleet.wait_stored(run.run_id)
        row = judged(fleet.store, run, chosen)
        if row["scenario"] != "healthy":
            ceiling = envelope_lead(run, healthy)
            row["envelope"] = ceiling
            row["share"] = None if not ceiling or row["lead"] is None else row["lead"] / ceiling
        row["after_freeze"] = _started_after(run, FROZEN)
        rows.append(row)
        stored_healthy = sum(r["scenario"] == "healthy" for r in rows)
        if profile is None and stored_healthy >= 10:
            profile, at = fleet.wait_profile(before), i + 1
    return {"group": group, "rows": rows, "profile": profile, "published_after": at}


def _started_after(run: Any, frozen: str) -> bool:
    from datetime import datetime

    return float(run.start.get("time") or 0.0) > datetime.fromisoformat(frozen).timestamp()


def _faults(faults: list[dict[str, Any]], suffix: str = "") -> dict[str, Any]:
    """Fault runs judged: how many, named right, named right at ≥ SHARE of their envelope
    lead, and the median share (a run never warned before divergence counts as 0)."""
    shares = [r["share"] or 0.0 for r in faults if r.get("envelope")]
    return {
        f"faults_after{suffix}": len(faults),
        f"faults_after{suffix}_named_right": sum(r["attribution"] == "correct" for r in faults),
        f"faults_after{suffix}_right": sum(
            r["attribution"] == "correct" and (r["share"] or 0) >= SHARE for r in faults
        ),
        f"lead_share_median{suffix}": median(shares) if shares else None,
    }


def summary(result: dict[str, Any], store: Path) -> dict[str, Any]:
    from foreshock.operate import profile_builder as pb

    after = result["rows"][result["published_after"] or len(result["rows"]) :]
    faults = [r for r in after if r["scenario"] != "healthy"]
    healthy = [r for r in after if r["scenario"] == "healthy"]
    entry = next((e for e in pb.lineage(store) if e["profile"] == result["profile"]), None)
    stated = entry["judged"]["stated_false_warning_rate"] if entry else {}
    return {
        "group": result["group"],
        "runs": len(result["rows"]),
        "profile": result["profile"],
        "published_after_runs": result["published_after"],
        "published_by": entry["by"] if entry else None,
        "zero_shot_runs": sum(r["profile"] == "zero-shot" for r in result["rows"]),
        **_faults(faults),
        **_faults([r for r in faults if r["after_freeze"]], "_frozen"),
        "healthy_after": len(healthy),
        "healthy_after_warned": sum(r["false"] > 0 for r in healthy),
        "stated_rate": round(sum(stated.values()), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the Llama group only")
    parser.add_argument("--group", nargs="+", default=list(GROUPS), help="lab/runs/<group>")
    parser.add_argument("--store", type=Path, help="keep the store here (default: a temp dir)")
    args = parser.parse_args()
    import tempfile

    groups = ["llama"] if args.quick else args.group
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp) / "store"
        fleet = Fleet(store)
        try:
            results = [run_group(fleet, g) for g in groups]
        finally:
            fleet.close()
        summaries = [summary(r, store) for r in results]
    rows = []
    for result in results:
        for r in result["rows"]:
            share = r.get("share")
            rows.append([
                r["run"], r["profile"], r["false"], r["lead"], r.get("envelope"),
                "-" if share is None else f"{share:.0%}", r["attribution"],
                "yes" if r["after_freeze"] else "",
            ])  # fmt: skip
    headers = ["run", "profile", "false", "lead", "envelope", "share", "cause", "after freeze"]
    print(format_table(headers, rows))
    print()
    print(format_table(list(summaries[0]), [list(s.values()) for s in summaries]))
    emit_json({"benchmark": "fleet_profiles", "groups": summaries})


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows: per group, when the profile was published and by whom,
    and what the runs after it measured."""
    rows = []
    for g in result["groups"]:
        published = (
            f"{g['profile']} after run {g['published_after_runs']} of {g['runs']}, by "
            f"{g['published_by']}; {g['zero_shot_runs']} runs judged zero-shot before it"
            if g["profile"]
            else f"no profile after {g['runs']} runs"
        )
        after = (
            f"{_judged(g)}; {g['healthy_after_warned']}/{g['healthy_after']} healthy runs "
            f"warned (stated rate {g['stated_rate']})"
        )
        rows += [(f"{g['group']}: the profile", published), (f"{g['group']}: after it", after)]
        if g.get("faults_after_frozen"):
            rows.append((f"{g['group']}: trained after the rules froze", _judged(g, "_frozen")))
    return rows


def _judged(g: dict[str, Any], suffix: str = "") -> str:
    share = g[f"lead_share_median{suffix}"]
    n = g[f"faults_after{suffix}"]
    return (
        f"{g[f'faults_after{suffix}_named_right']}/{n} fault runs named right, "
        f"{g[f'faults_after{suffix}_right']}/{n} at ≥ {SHARE:.0%} of their envelope lead; "
        f"median share {'-' if share is None else f'{share:.1%}'}"
    )


if __name__ == "__main__":
    main()
