"""The GPU study's pieces (docs/gpu-study.md; docs/design.md §9) and the way back of what they compute.

A piece is one command on the GPU machine (`bash dev/studies/gpu-study/gpu-study.sh PIECE`). It computes into
the study's own store,
<results>/gpu/ (engine.core.presets.study_root; the repository's cached_results travels with the tree, so what
earlier pieces brought back and was committed is cached there and skipped), then `pack` puts what may come back
into OUT: gpu-study-PIECE.tar.gz (the store without the weights that stay on the GPU machine), a JSON summary and
the log (engine.runtime.gpu_pack). `loopscope merge PACK` puts a pack into a results folder and rebuilds its tables.

Pieces, at the `gpu` preset (`gpu-smoke` runs the same on the CPU in seconds):
  ladder    E5's rungs below 19M (412,288 / 1,627,392 / 5,342,592 parameters), seeds 0-3 as one group each,
            norm-trained; the surgery (norm->none) and the rescale surgery (norm->rescale) at n = 1..3T
  norm      E2's 19M model norm-trained, 16 seeds as one group, and everything that needs its weights, in the same
            command: the surgery, the rescale surgery on seeds 0-3 (the ladder's 19M rung), E3's refits
  none      E2's 19M model trained without the norm, 16 seeds, and its evaluation
  e3        E3's refits of the norm-trained group when the `norm` piece could not fit them, once that group is
            stored: the group trained again on this machine (no bet on retraining bit for bit), refit from those
            weights, each refit's manifest naming the retraining and how many of its E2 values equal the stored ones
  chain-c1, chain-c2
            the retrieval-chain search, one candidate a command, as docs/gpu-study.md fixed them

No new group (a training group, a refit group, a chain candidate) starts once `--budget` seconds have passed, nor
one that its prediction (engine.runtime.gpu_rates: the session's calibration, or the last measured rates; the
process's compilation charged to its first training) says would end after `--limit`. What finished is stored
(every write is atomic: a group killed midway leaves nothing). A run whose weights stay on the GPU machine comes
back with its rows even when the study still needs its weights (unfinished(): the pack names what).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from engine.core import flops, memory, tasks
from engine.core.presets import OWN_FOLDER, RunConfig, TrainConfig, paper, preset, study_root, tasks_of
from engine.core.store import Store, git_state, utc_now
from engine.runtime.gpu_rates import Budget, Rates

STUDY = "gpu-study"  # what a pack's gpu-study.json says it is
PIECES = ("ladder", "norm", "none", "e3", "chain-c1", "chain-c2")
LIMIT_S = 450  # the hard limit (dev/studies/gpu-study/gpu-study.sh's timeout): 7.5 of the GPU machine's 8 minutes
BUDGET_S = 300  # no group starts after this
CHAIN_RULE, CHAIN_SCORED, CHAIN_SEEDS = 0.90, (1, 2, 3, 4), (0, 1, 2, 3)
# C1's "as many steps as fit": a probe of PROBE_STEPS steps measures the rate, then C1_SHARE of what is left after
# C1_RESERVE_S (its evaluation and a margin) is trained, in whole quanta of C1_QUANTUM steps (at least one)
PROBE_STEPS, C1_SHARE, C1_RESERVE_S, C1_QUANTUM = 40, 0.8, 90, 100


def process_age() -> float:
    """Seconds since this process started (Linux's /proc; 0 elsewhere): a piece's budget counts its start-up, as the
    session's timeout around it does."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return max(0.0, float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def say(text: str) -> None:
    print(f"[gpu-study {time.strftime('%H:%M:%S')}] {text}", flush=True)


@dataclass
class Piece:
    """One command's state: where it stores, its budget, and its summary (written after every unit)."""

    name: str
    preset: str
    store: Store
    device: str
    budget: Budget
    out: Path
    summary: dict = field(default_factory=dict)
    rates: Rates | None = None
    compiled: bool = False  # whether a unit of this process has paid Rates.compile_s (once per process)

    def __post_init__(self):
        self.rates = self.rates or Rates.h200(self.preset)
        self.ref = preset(self.preset, "parity", "norm")

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{STUDY}-{self.name}.json").write_text(json.dumps(self.summary, indent=1, default=str))

    def unit(self, what: str, cfg: RunConfig, members: int, work_flops: float, needed: bool, work: Callable,
             seconds: float = 0.0, trains: bool = False) -> bool:  # fmt: skip
        """Run one group of work unless it is cached (`needed` False) or the budget refuses it (`seconds`: its
        prediction from Rates, plus the process's compile seconds if it `trains` and no unit has paid them yet);
        print its memory estimate, FLOPs and prediction first; record it in the summary. Returns whether it is
        done (now or before)."""
        compile_s = self.rates.compile_s if trains and not self.compiled else 0.0
        seconds += compile_s
        record = dict(what=what, params=cfg.model.n_params, members=members, pflop=round(work_flops / 1e15, 4),
                      predicted_s=round(seconds, 1), compile_s=round(compile_s, 1))  # fmt: skip
        self.summary.setdefault("units", []).append(record)
        if not needed:
            record["status"] = "cached"
            say(f"{what}: cached")
            self.save()
            return True
        est = memory.estimate(cfg, members, self.device)
        record["memory_gib"] = round(est.peak_bytes / memory.GIB, 2)
        say(f"{what}: {est.sentence(self.device)}; {work_flops / 1e15:.3f} PFLOP, predicted {seconds:.0f} s")
        why = self.budget.refusal(seconds)
        if why:
            record["status"] = why
            say(f"{what}: {why}")
            self.save()
            return False
        t0 = time.monotonic()
        record["started_s"] = round(self.budget.elapsed(), 1)
        try:
            work()
        except BaseException as e:  # the summary says where it stopped; the error goes on to the log
            record["status"] = f"failed after {time.monotonic() - t0:.0f} s: {type(e).__name__}: {e}"[:400]
            self.save()
            raise
        wall = time.monotonic() - t0
        self.compiled = self.compiled or trains
        record |= dict(status="done", wall_s=round(wall, 1), tflops_per_s=round(work_flops / wall / 1e12, 3))
        if seconds:
            record["wall_over_predicted"] = round(wall / seconds, 2)
        say(f"{what}: done in {wall:.0f} s ({work_flops / wall / 1e12:.2f} TFLOP/s)")
        self.save()
        return True


def heartbeat() -> Callable[[str, int, int, float], None]:
    """A training's progress every 30 s (runs.Live.report): step, loss, seconds a step, time left."""
    state = {"t0": time.monotonic(), "last": 0.0}

    def report(what: str, done: int, total: int, loss: float) -> None:
        now = time.monotonic() - state["t0"]
        if done == 1:  # a new group (the first step holds its compilation)
            state["t0"], state["last"], now = time.monotonic(), 0.0, 0.0
        if now - state["last"] >= 30 or done == total:
            state["last"] = now
            per = now / max(1, done - 1)
            say(f"  {what}: step {done}/{total}, loss {loss:.4f}, {per:.3f} s a step, about {per * (total - done):.0f} "
                "s left")  # fmt: skip

    return report


# ---------------------------------------------------------------- what a run still needs its weights for


STEPS = {"surgery": "the surgery (norm->none)", "rescale": "the rescale surgery", "refits": "E3's refits"}


def unfinished(store: Store, key: str, preset_name: str) -> list[str]:
    """What the study still computes from a stored run's weights, as STEPS names it (empty when nothing): the
    surgery on a norm-trained run, the rescale surgery where E5 runs it on this seed, E3's refits of E2's
    norm-trained models."""
    from engine.experiments import e3, e5

    m = store.manifest(key)
    cfg, seed = RunConfig.from_dict(m["config"]), m["seed"]
    reached = store.load_rows(key).groupby("boundary")["eval_loops"].max()
    n, todo = cfg.max_eval_loops, []
    if cfg.model.boundary == "norm" and reached.get("norm->none", 0) < n:
        todo.append("surgery")
    rescaled = e5.rescaled(preset_name, cfg) and seed in e5.seeds_for(preset_name, cfg, cfg.group(seed))
    if rescaled and reached.get("norm->rescale", 0) < n:
        todo.append("rescale")
    if any(cfg == c for c, _ in e3.trainings(preset_name, tasks_of(preset_name))):
        if e3.missing_refits([key], e3.refit_config(preset_name), store):
            todo.append("refits")
    return todo


def needs(store: Store, cfg: RunConfig, seeds, preset_name: str, steps=tuple(STEPS)) -> bool:
    """Whether a seed of cfg is not stored, or stored and still lacking one of `steps` (STEPS' names)."""
    keys = [cfg.run_key(s) for s in seeds]
    return any(store.status(k) != "ok" or set(unfinished(store, k, preset_name)) & set(steps) for k in keys)


# ---------------------------------------------------------------- the pieces


def eval_work(cfg: RunConfig, members: int, passes: int) -> float:
    return passes * flops.eval_flops(cfg, members)


def ladder_piece(piece: Piece) -> None:
    """E5's rungs below the preset's own model: train, the surgery and the rescale surgery, per rung."""
    from engine.experiments import e5

    p = piece.preset
    for cfg in e5.rungs(p):
        seeds = e5.seeds_for(p, cfg, range(e5.LADDER_SEEDS))
        work = flops.training_flops(cfg, len(seeds)) + eval_work(cfg, len(seeds), 3)
        r, ref = piece.rates, piece.ref  # each rung from seconds a step (its FLOPs, never under the launch floor)
        seconds = r.trained_s(cfg, len(seeds), ref, surgery=True) + r.rescale_s(cfg, len(seeds), ref)
        what = f"ladder rung of {cfg.model.n_params:,} parameters, seeds {seeds[0]}-{seeds[-1]}"
        compute = lambda cfg=cfg, seeds=seeds: e5.ensure(p, cfg, "e5", seeds, piece.store, piece.device, False)  # noqa: E731
        piece.unit(what, cfg, len(seeds), work, needs(piece.store, cfg, seeds, p), compute, seconds, trains=True)


def weightless(store: Store, keys: list[str]) -> list[str]:
    """The stored runs among keys whose weights are not here (they stayed on an earlier GPU machine)."""
    from engine.core.store import weights_not_kept

    return [k for k in keys if store.status(k) == "ok" and weights_not_kept(store.manifest(k)) is not None]


def regain_weights(piece: Piece, cfg: RunConfig, seeds: list[int], why: str) -> bool:
    """Retrain a group whose weights stayed on an earlier GPU machine (runs.restore: kept only where every retrained
    row equals the stored one bit for bit), as one unit; whether every seed has its weights now."""
    from engine.experiments.runs import restore

    keys = [cfg.run_key(s) for s in seeds]
    if not weightless(piece.store, keys):
        return True
    outcome: dict = {}
    done = piece.unit(f"E2 {cfg.model.boundary}-trained, seeds {seeds[0]}-{seeds[-1]}, retrained for {why}", cfg,
                      len(seeds), flops.training_flops(cfg, len(seeds)), True,
                      lambda: outcome.update(restore(piece.store, keys, piece.device, False)),
                      piece.rates.trained_s(cfg, len(seeds), piece.ref), trains=True)  # fmt: skip
    if outcome:
        piece.summary.setdefault("restored", {}).update(outcome)
        piece.save()
    return done and not weightless(piece.store, keys)


def mode_piece(piece: Piece, boundary: str) -> None:
    """E2's own model trained in one mode, one group; with the norm, then everything that needs its weights (E3's
    refits only when they fit what is left: otherwise the `e3` piece computes them)."""
    from engine.experiments import e5
    from engine.experiments.runs import ensure_runs, ensure_surgery

    p, store, device, r = piece.preset, piece.store, piece.device, piece.rates
    cfg = preset(p, "parity", boundary)
    seeds = cfg.group(0)
    surgery = boundary == "norm"
    work = flops.training_flops(cfg, len(seeds)) + eval_work(cfg, len(seeds), 1 + surgery)

    def train() -> None:
        keys = ensure_runs(cfg, seeds, store, "e2", device, progress=False)
        if surgery:
            ensure_surgery(store, keys, cfg.max_eval_loops, "e2", device, False)

    what = f"E2 {boundary}-trained, seeds {seeds[0]}-{seeds[-1]}"
    trained = piece.unit(what, cfg, len(seeds), work, needs(store, cfg, seeds, p, ["surgery"]), train,
                         r.trained_s(cfg, len(seeds), piece.ref, surgery), trains=True)  # fmt: skip
    if not surgery or not trained:
        return
    ladder = e5.seeds_for(p, cfg, seeds)
    if needs(store, cfg, ladder, p, ["rescale"]) and not regain_weights(piece, cfg, seeds, "the rescale surgery"):
        return
    piece.unit(f"the rescale surgery on seeds {ladder[0]}-{ladder[-1]} (the ladder's rung)", cfg, len(ladder),
               eval_work(cfg, len(ladder), 2), needs(store, cfg, ladder, p, ["rescale"]),
               lambda: e5.ensure(p, cfg, "e2", ladder, store, device, False),
               r.rescale_s(cfg, len(ladder), piece.ref))  # fmt: skip
    refit_piece(piece, cfg, seeds, retrain=False)


def refit_piece(piece: Piece, cfg: RunConfig, seeds: list[int], retrain: bool) -> None:
    """E3's refits of the norm-trained group. Where its weights stayed on an earlier machine, the group is trained
    again here first (retrained_refits), or with `retrain` False the refits are left to the `e3` piece."""
    from engine.experiments import e3

    p, store, r = piece.preset, piece.store, piece.rates
    refit = e3.refit_config(p)
    keys = [cfg.run_key(s) for s in seeds]
    missing = bool(e3.missing_refits(keys, refit, store))
    seconds = r.refits_s(cfg, len(seeds), refit.targets, refit.schedule, piece.ref)
    what = f"E3's refits ({', '.join(refit.targets)}; {refit.schedule[-1]} steps)"
    work = flops.refit_flops(cfg, refit.targets, refit.schedule, len(seeds))
    if missing and weightless(store, keys):
        if not retrain:
            piece.summary.setdefault("units", []).append(dict(what="E3's refits", status="left to the e3 piece"))
            piece.save()
            return
        piece.unit(f"E2 norm-trained, seeds {seeds[0]}-{seeds[-1]}, trained again on this machine, then {what}", cfg,
                   len(seeds), flops.training_flops(cfg, len(seeds)) + eval_work(cfg, len(seeds), 1) + work, True,
                   lambda: retrained_refits(piece, cfg, seeds), r.trained_s(cfg, len(seeds), piece.ref) + seconds,
                   trains=True)  # fmt: skip
        return
    piece.unit(what, cfg, len(seeds), work, missing, lambda: e3.refit_runs(cfg, seeds, store, refit, piece.device,
                                                                           False), seconds)  # fmt: skip


def retrained_refits(piece: Piece, cfg: RunConfig, seeds: list[int]) -> None:
    """E3 without a bet on retraining bit for bit: the group, whose weights stayed on an earlier machine, trained and
    evaluated again into a scratch store, refit from those weights, and the refits stored here. Each refit's rows
    measure recovery against the model that was refit (their `original` and `removed` accuracies are the retrained
    group's own), and its manifest names that (`retrained_group`: how many of the retrained group's E2 values equal
    the stored run's); the stored runs are left as they are."""
    from engine.core.store import ROW_KEY, ROWS
    from engine.experiments import e3
    from engine.experiments.runs import ensure_runs, refit_store

    refit, keys = e3.refit_config(piece.preset), [cfg.run_key(s) for s in seeds]
    here = refit_store(piece.store)
    with tempfile.TemporaryDirectory(prefix="gpu-study-e3-") as tmp:
        scratch = Store(Path(tmp))
        ensure_runs(cfg, seeds, scratch, "e2", piece.device, progress=False)
        e3.refit_and_store(scratch, keys, refit, piece.device, progress=False)
        made = refit_store(scratch)
        for key in keys:
            on = [c for c in ROW_KEY if c != "experiment"]
            both = scratch.load_rows(key).merge(piece.store.load_rows(key), on=on, how="left", suffixes=("", "_stored"))
            equal = int((both["value"] == both["value_stored"]).sum())
            sentence = (f"refit from the norm-trained group trained again on {piece.device} by the e3 piece (the "
                        f"stored run's weights stayed on an earlier GPU machine): {equal} of {len(both)} of its E2 "
                        "values equal the stored run's; recovery is measured against the model refit")  # fmt: skip
            rk = e3.refit_key(key, refit)
            manifest = {k: v for k, v in made.manifest(rk).items() if k != "files"}
            manifest["retrained_group"] = dict(sentence=sentence, e2_values_equal=equal, e2_values=len(both),
                                               bit_for_bit=equal == len(both))  # fmt: skip
            here.commit(rk, manifest, {role: made.read(rk, role) for role in (e3.STATE, ROWS)})
            piece.summary.setdefault("retrained", {})[key] = sentence
    piece.save()


def e3_piece(piece: Piece) -> None:
    """E3's refits of E2's norm-trained group, when the `norm` piece stored its runs and could not fit them."""
    cfg = preset(piece.preset, "parity", "norm")
    seeds = cfg.group(0)
    if any(piece.store.status(cfg.run_key(s)) != "ok" for s in seeds):
        piece.summary["e3"] = "not started: E2's norm-trained group is not stored yet (run the norm piece first)"
        say(piece.summary["e3"])
        piece.save()
        return
    refit_piece(piece, cfg, seeds, retrain=True)


def chain_candidates(preset_name: str, c1_steps: int) -> dict[str, RunConfig]:
    """C1 and C2 as gpu-study.md fixed them: the `paper` chain (3 layered chains, 32 names, k 1-6 trained, half held
    out) on the 19M model, norm-trained, seeds 0-3 as one group, batch 256, lr 5e-4, C1 as many steps as fit, C2
    k 1-4 trained and 2,000 steps; the rest is TrainConfig's default (warmup 100). `gpu-smoke`: the same logic at a
    size the CPU runs in seconds."""
    task, base = paper("chain").task, preset(preset_name, "parity", "norm").model
    train = TrainConfig(steps=c1_steps, batch_size=256, lr=5e-4, group_size=len(CHAIN_SEEDS))
    c2_steps = 2000
    if preset_name == "gpu-smoke":
        task = replace(task, eval_examples=32)
        train, c2_steps = replace(train, batch_size=16, warmup_steps=5), 20
    model = replace(base, boundary="norm")
    return {
        "C1": RunConfig(model, task, train, max_eval_loops=3 * model.trained_loops),
        "C2": RunConfig(model, replace(task, train_difficulties=(1, 2, 3, 4)), replace(train, steps=c2_steps),
                        max_eval_loops=3 * model.trained_loops),
    }  # fmt: skip


def probe_rate(cfg: RunConfig, device: str) -> dict:
    """C1's rate, for "as many steps as fit": a training of PROBE_STEPS steps on the candidate, its first 10
    (compilation included) left out, scaled to the candidate's own difficulty mix (the same sequences)."""
    from engine.core.train import train_group

    probe_steps, stamps = PROBE_STEPS, []
    probe = replace(cfg, train=replace(cfg.train, steps=probe_steps, warmup_steps=5))
    t0 = time.monotonic()
    train_group(probe, list(CHAIN_SEEDS), device, progress=False, on_step=lambda *_: stamps.append(time.monotonic()))
    schedule = tasks.difficulty_schedule(probe.task, probe_steps)
    members = len(CHAIN_SEEDS)
    step_flops = [members * flops.train_step_flops(probe, flops.seq_len(probe.task, d)) for d in schedule]
    per_probe_step = (stamps[-1] - stamps[9]) / (len(stamps) - 10)
    per_step = per_probe_step * (flops.training_flops(cfg, members, 1000) / 1000) / (sum(step_flops[10:]) / (
        probe_steps - 10))  # fmt: skip
    return dict(probe_s=round(time.monotonic() - t0, 1), seconds_a_step=per_step,
                tflops_per_s=round(sum(step_flops[10:]) / (stamps[-1] - stamps[9]) / 1e12, 3))  # fmt: skip


def chain_results(store: Store) -> dict[str, dict]:
    folder = store.root / "chain-search"
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("C*.json"))} if folder.is_dir() else {}


def adopted(results: dict[str, dict]) -> str | None:
    """gpu-study.md's rule: the first candidate, in order, whose score (norm-trained held-out accuracy at n = T over
    k = 1..4) is >= 0.90."""
    return next((c for c in ("C1", "C2") if c in results and results[c]["qualifies"]), None)


def chain_piece(piece: Piece, candidate: str) -> None:
    from engine.experiments.search import run_candidate

    store, smoke = piece.store, piece.preset == "gpu-smoke"
    done = chain_results(store)
    summary = piece.summary.setdefault("chain", {})
    if candidate in done:
        summary |= dict(status=f"{candidate} was run before: cached", adopted=adopted(done))
        piece.save()
        return
    if candidate == "C2" and adopted(done) == "C1":
        summary |= dict(status="C2 not run: C1 was adopted, and the rule stops at the first", adopted="C1")
        piece.save()
        return
    c1_steps = 0
    if candidate == "C1":  # as many steps as fit what the probe leaves of the limit, less evaluation and a margin
        fit = probe_rate(chain_candidates(piece.preset, 100)["C1"], piece.device)
        piece.compiled = True  # the probe compiled what the candidate's training runs
        left = piece.budget.limit - piece.budget.elapsed() - (10 if smoke else C1_RESERVE_S)
        quantum, most = (10, 30) if smoke else (C1_QUANTUM, 20_000)
        c1_steps = max(quantum, min(most, int(left * C1_SHARE / fit["seconds_a_step"]) // quantum * quantum))
        summary["fit"] = fit | dict(seconds_for_training=round(left * C1_SHARE, 1), steps=c1_steps)
        say(f"C1: {c1_steps} steps fit (probe: {summary['fit']})")
    cfg = chain_candidates(piece.preset, c1_steps or 100)[candidate]  # C2's config does not read C1's steps
    work = flops.training_flops(cfg, len(CHAIN_SEEDS)) + eval_work(cfg, len(CHAIN_SEEDS), 1)

    def search() -> None:
        result = run_candidate(candidate, cfg, CHAIN_RULE, CHAIN_SEEDS, piece.device, scored=CHAIN_SCORED)
        folder = store.root / "chain-search"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{candidate}.json").write_text(json.dumps(result, indent=1))
        say(f"{candidate}: held-out accuracy at T over k = 1..4 {result['score']} (by k {result['acc_at_T_by_k']})")

    measured = summary.get("fit", {}).get("seconds_a_step") if candidate == "C1" else None
    r, members = piece.rates, len(CHAIN_SEEDS)
    if measured:  # its steps at the probe's rate, then its evaluation within the reserve its steps left
        seconds = measured * cfg.train.steps + (10 if smoke else C1_RESERVE_S)
    else:
        seconds = r.train_s(cfg, members, piece.ref) + r.evals_s(cfg, members, 1, piece.ref)
    what = f"chain search {candidate} ({cfg.train.steps} steps)"
    piece.unit(what, cfg, members, work, True, search, seconds, trains=True)
    summary |= dict(results=chain_results(store), adopted=adopted(chain_results(store)))
    piece.save()


# ---------------------------------------------------------------- tables, from what the store holds


def stored(store: Store, cfg: RunConfig, seeds) -> list[str]:
    return [k for k in (cfg.run_key(s) for s in seeds) if store.status(k) == "ok"]


def write_tables(preset_name: str, store: Store) -> dict[str, int]:
    """The study's tables e2-, e3- and e5-<preset> from the runs and refits the store holds (nothing is computed);
    a table without rows is not written. Returns the rows of each table written."""
    from engine.experiments import e2, e3, e5
    from engine.experiments.runs import PAPER_LABELS, collect

    tasks, written = tasks_of(preset_name), {}
    cfgs = [cfg for cfg, _ in e2.trainings(preset_name, tasks)]
    keys = [k for cfg in cfgs for k in stored(store, cfg, cfg.group(0))]
    if keys:
        rows = collect(store, keys, "e2", PAPER_LABELS)
        written[f"e2-{preset_name}"] = len(rows)
        store.write_table(f"e2-{preset_name}", rows)
    refit, cache = e3.refit_config(preset_name), e3.refit_store(store)
    refits = [e3.refit_key(cfg.run_key(s), refit) for cfg, _ in e3.trainings(preset_name, tasks) for s in cfg.group(0)]
    refits = [k for k in refits if cache.status(k) == "ok"]
    if refits:
        rows = pd.concat([cache.load_rows(k) for k in refits], ignore_index=True)
        written[f"e3-{preset_name}"] = len(rows)
        store.write_table(f"e3-{preset_name}", rows)
    seeds = range(e5.LADDER_SEEDS)
    if any(stored(store, cfg, e5.seeds_for(preset_name, cfg, seeds)) for cfg, _ in e5.trainings(preset_name, tasks)):
        rows = e5.run(preset_name, list(seeds), store, "cpu", tasks, progress=False, compute=lambda cfg: False)
        written[f"e5-{preset_name}"] = len(rows)
    return written


def reports(preset_name: str, store: Store) -> dict[str, str]:
    """Each table's report and verdicts (as `loopscope run` prints them), where the table holds what they read:
    E2 both modes, E3 and E5 any rows."""
    from engine.experiments import REGISTRY

    out = {}
    for name in ("e2", "e3", "e5"):
        rows = store.read_table(f"{name}-{preset_name}")
        if rows is None or (name == "e2" and not {"norm", "none"} <= set(rows["boundary"])):
            continue
        out[name] = REGISTRY[name].report(rows, preset_name)
    return out


def run(name: str, preset_name: str, results: Path, device: str, budget: float, limit: float, out: Path,
        rates: Rates | None = None, start_up: float = 0.0) -> int:  # fmt: skip
    """One piece on this machine: compute what is missing within the budget, write the tables and the summary.
    start_up: seconds already spent before this call that the budget counts (the command: its process's age)."""
    from engine.core.train import compile_wanted
    from engine.experiments.runs import Live, live

    store = Store(study_root(results, preset_name))
    piece = Piece(name, preset_name, store, device, Budget(budget, limit, time.monotonic() - start_up), out,
                  rates=rates)  # fmt: skip
    commit, dirty = git_state()
    piece.summary = dict(study=STUDY, piece=name, preset=preset_name, device=device, started=utc_now(),
                         git_commit=commit, git_dirty=dirty, budget_s=budget, limit_s=limit,
                         compiled=compile_wanted(device), rates=piece.rates.to_dict())  # fmt: skip
    if device == "cuda":
        from engine.core.store import gpu_info

        piece.summary["gpu"] = gpu_info()
    piece.save()
    say(f"{name} at {preset_name} on {device}, into {store.root} (budget {budget:.0f} s, limit {limit:.0f} s)")
    with live(Live(report=heartbeat())):
        if name == "ladder":
            ladder_piece(piece)
        elif name in ("norm", "none"):
            mode_piece(piece, name)
        elif name == "e3":
            e3_piece(piece)
        else:
            chain_piece(piece, name.split("-")[1].upper())
    if not name.startswith("chain"):  # the search writes no table
        piece.summary["tables"] = write_tables(preset_name, store)
        piece.summary["reports"] = reports(preset_name, store)
    piece.summary["finished"], piece.summary["wall_s"] = utc_now(), round(piece.budget.elapsed(), 1)
    piece.save()
    for text in piece.summary.get("reports", {}).values():
        print(text, flush=True)
    return 0


# ---------------------------------------------------------------- the command line (dev/studies/gpu-study/gpu-study.sh)


def main(argv: list[str] | None = None, start_up: float = 0.0) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.runtime.gpu_study", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["run"])  # packing: python -m engine.runtime.gpu_pack
    ap.add_argument("piece", choices=PIECES)
    ap.add_argument("--preset", default="gpu", choices=list(OWN_FOLDER))
    ap.add_argument("--results", default="cached_results", help="the results folder (the study stores in its gpu/)")
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds after which no group starts")
    ap.add_argument("--limit", type=float, default=LIMIT_S, help="the command's hard limit in seconds")
    ap.add_argument("--out", required=True, help="the folder that comes back ($OUT)")
    ap.add_argument("--rates", help="a session's calibration (Rates as JSON); default: the H200's of 2026-12-04")
    args = ap.parse_args(argv)
    rates = Rates.load(Path(args.rates) if args.rates else None, args.preset)
    return run(args.piece, args.preset, Path(args.results), args.device, args.budget, args.limit, Path(args.out),
               rates, start_up)  # fmt: skip


if __name__ == "__main__":  # the command: its budget counts the process's start-up, as the session's timeout does
    sys.exit(main(start_up=process_age()))
