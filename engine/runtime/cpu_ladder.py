"""The GPU study's ladder on the CPU (preset `cpu-ladder`; docs/gpu-study.md, "The ladder on the CPU"), in
pieces that survive a lost machine: one seed a group, a checkpoint every CHECKPOINT_EVERY steps under
<results>/cpu-ladder/jobs/ckpt/, resumed bit for bit by running the same command again on the same machine. Every
step is cached: a second run of a finished stage computes nothing.

  probe   the recipe probe on the 19M rung (the preset's own model), candidates R1, R2, R3 in order
          (engine.core.presets.GPU_RECIPES), seeds 0-3 one after another. Each seed is trained, then evaluated as
          every rung is (n = 1..3T as trained, `norm->none`, `norm->rescale`). After each seed the rule is applied to
          the seeds so far (engine.experiments.ladder.recipe_outcome): a candidate is adopted once its mean held-out
          accuracy at n = T over seeds 0-3 is certain to reach 0.95, rejected once it cannot, and the next starts.
          If every candidate is rejected, the seeds their early stops skipped are trained until the best of them is
          certain, and the best is adopted as "recipe below the bar" (below_bar). The outcome is written to
          <results>/cpu-ladder/recipe-probe.json.
  rungs   the other rungs (1.6M, 5.3M; first the `cpu` ladder's to 412k if the recipe is not the `cpu` study's:
          e5.continues) under the adopted recipe, seeds 0-3, then the e5-cpu-ladder table (E5's
          `loopscope run e5 --preset cpu-ladder --seeds 0-3`). Refused until the probe has adopted the recipe the
          preset trains with (presets.CPU_LADDER_RECIPE). With --share I/N, seeds s % N == I alone, each trained and
          evaluated whole in turn, on cores/N threads, no table: N such processes side by side (on 2 cores two
          single-thread ones can do 1.4-1.8x the work of one with two threads: gpu-study.md), then `rungs` for the
          table.
  ship    the finished runs of a results folder the pieces ran in (--source, outside the repository) into
          --results: each run folder copied without its weights (76 MB a seed at 19M; `loopscope restore KEY`
          retrains one bit for bit on a machine of the kind that made it), the probe's record (with the seeds that
          finished after it was written: caught_up), and the e5-cpu-ladder table rebuilt from what is stored
          (nothing computed). Runs not yet trained and evaluated stay behind.

    python -m engine.runtime.cpu_ladder probe|rungs [--results cached_results] [--candidates R1,R2,R3]
    python -m engine.runtime.cpu_ladder rungs --share 0/2 & python -m engine.runtime.cpu_ladder rungs --share 1/2
    python -m engine.runtime.cpu_ladder ship --source DIR [--results cached_results]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from engine.core.presets import GPU_RECIPES, RunConfig, cpu_ladder, study_root
from engine.core.store import Store, atomic_write, git_state, is_weights, utc_now
from engine.errors import UsageError, explain
from engine.experiments import e5
from engine.experiments.ladder import RECIPE_RULE, best_candidate, mean_range, recipe_outcome, recipe_score
from engine.experiments.runs import RECIPE_PROBE_FILE as PROBE_FILE
from engine.experiments.runs import Live, check_recipe_adopted, check_study_precision, live

PRESET = "cpu-ladder"
SEEDS = tuple(range(e5.LADDER_SEEDS))
CHECKPOINT_EVERY = 100  # steps: about 3 minutes of the 19M rung on two cores


def say(text: str) -> None:
    print(f"[cpu-ladder {time.strftime('%H:%M:%S')}] {text}", flush=True)


def candidate(name: str) -> RunConfig:
    """The 19M rung trained with recipe `name`, one seed a group (the preset's own config is CPU_LADDER_RECIPE's)."""
    return cpu_ladder(recipe=name)


def piece(cfg: RunConfig, seed: int, store: Store) -> None:
    """One seed of one config: trained (checkpointed, resumed), evaluated as trained, cut and rescaled; cached."""
    with live(Live(checkpoint_every=CHECKPOINT_EVERY)):
        e5.ensure(PRESET, cfg, "e2", [seed], store)


def scored(name: str, seed: int, store: Store, why: str) -> tuple[float, float]:
    """One seed of candidate `name`, announced (`why`: what the line says of it), computed or read from the cache
    (piece): its probe score (held-out accuracy at n = T, recipe_score) and the seconds it took."""
    cfg = candidate(name)
    key = cfg.run_key(seed)
    say(f"{name} seed {seed} ({why}run {key}): {'cached' if store.status(key) == 'ok' else 'training'}")
    t0 = time.monotonic()
    piece(cfg, seed, store)
    return recipe_score(store.load_rows(key)), time.monotonic() - t0


def entry(name: str, scores: list[float]) -> dict:
    """A candidate's seeds so far in the probe's record: their scores, run keys, and the range its mean over the
    probe's seeds can still take (engine.experiments.ladder.mean_range: what the rule's early stops and its best of
    three read; the dashboard shows it as written)."""
    return dict(scores=[round(s, 4) for s in scores], runs=[candidate(name).run_key(s) for s in SEEDS[: len(scores)]],
                mean_range=[round(x, 4) for x in mean_range(scores, len(SEEDS))])  # fmt: skip


def caught_up(store: Store, record: dict) -> dict:
    """The record with the seeds that finished after it was written (the skipped seeds' driver,
    dev/studies/cpu-ladder/skipped_seeds.py, trains them outside the probe) read back from `store`, each candidate's
    in seed order while the next seed is cached; nothing computed, the outcomes and the adoption left as they are. A
    candidate with no new seed keeps its entry as written: its range is the probe's, from unrounded scores (from the
    record's rounded ones R1's mean read 0.6927 against the probe's 0.6928, seen 2026-12-06)."""
    record["seeds"] = len(SEEDS)
    for name, c in record["candidates"].items():
        scores = list(c["scores"])
        while len(scores) < len(SEEDS) and store.status(key := candidate(name).run_key(len(scores))) == "ok":
            scores.append(recipe_score(store.load_rows(key)))
        if len(scores) > len(c["scores"]):
            c |= entry(name, scores)
    return record


def save(store: Store, record: dict) -> None:
    """The probe's record, rewritten whole (atomically) with the time of this write."""
    record["updated"] = utc_now()
    atomic_write(store.root / PROBE_FILE, json.dumps(record, indent=1).encode())


def probe(store: Store, names: list[str]) -> dict:
    """The rule applied candidate by candidate and seed by seed; the record is rewritten after every seed."""
    commit, dirty = git_state()
    record = dict(rule=f"mean held-out accuracy at n = T over seeds 0-{SEEDS[-1]} >= {RECIPE_RULE}", commit=commit,
                  dirty=dirty, seeds=len(SEEDS), candidates={}, adopted=None)  # fmt: skip
    for name in names:
        scores: list[float] = []
        outcome = "open"
        for seed in SEEDS:
            score, took = scored(name, seed, store, f"{candidate(name).model.n_params:,} parameters, ")
            scores.append(score)
            outcome = recipe_outcome(scores)
            say(f"{name} seed {seed}: held-out accuracy at T {score:.4f} ({took:.0f} s); "
                f"mean so far {sum(scores) / len(scores):.4f} over {len(scores)} seeds: {outcome}")  # fmt: skip
            record["candidates"][name] = entry(name, scores) | dict(outcome=outcome)
            save(store, record)
            if outcome != "open":
                break
        if outcome == "adopted":
            record["adopted"] = name
            save(store, record)
            say(f"adopted {name}")
            return record
    say(
        "no candidate reached the bar: the study is 'recipe below the bar' (gpu-study.md's rule); the best of them "
        "is adopted, once the seeds the early stop skipped make it certain"
    )
    return below_bar(store, names, record)


def below_bar(store: Store, names: list[str], record: dict) -> dict:
    """No candidate reached the bar: the rule adopts the best of them by the mean over seeds 0-3. The seeds each
    candidate's early stop skipped are trained in the rule's order until the best is certain
    (engine.experiments.ladder.best_candidate; docs/gpu-study.md, 2026-12-06); the record says `below_bar`."""
    scores = {name: list(record["candidates"][name]["scores"]) for name in names}
    while (best := best_candidate(scores)) is None:
        name = next(n for n in names if len(scores[n]) < len(SEEDS))
        seed = len(scores[name])
        score, took = scored(name, seed, store, "for the best of three; ")
        scores[name].append(score)
        say(f"{name} seed {seed}: held-out accuracy at T {score:.4f} ({took:.0f} s); "
            f"mean so far {sum(scores[name]) / len(scores[name]):.4f} over {len(scores[name])} seeds")  # fmt: skip
        record["candidates"][name] |= entry(name, scores[name])
        save(store, record)
    record |= dict(adopted=best, below_bar=True)
    save(store, record)
    say(f"adopted {best}, the best of {', '.join(names)}: 'recipe below the bar'")
    return record


def rungs(store: Store, share: tuple[int, int] = (0, 1), threads: int | None = None) -> None:
    """The ladder's other rungs under the adopted recipe, then E5's table for the preset (everything cached). With
    share (i, n), n > 1: only the seeds s of each rung with s % n == i, each trained and evaluated whole before the
    next (e5.ensure one seed at a time), on cores/n threads (or `threads`), and no table: n such processes share the
    machine; one of them alone with all the threads trains a single seed of each rung whole (share 0/4, threads 2)."""
    check_recipe_adopted(store, PRESET)
    i, n = share
    if n > 1:
        import torch

        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // n))
        check_study_precision(store, PRESET, [cfg for cfg, _ in e5.trainings(PRESET, ("parity",))])
        with live(Live(checkpoint_every=CHECKPOINT_EVERY)):
            for cfg, label in e5.trainings(PRESET, ("parity",)):
                for seed in e5.seeds_for(PRESET, cfg, SEEDS)[i::n]:
                    done = store.status(cfg.run_key(seed)) == "ok"
                    say(f"{cfg.model.n_params:,} parameters seed {seed} (run {cfg.run_key(seed)}; share {i}/{n}, "
                        f"{torch.get_num_threads()} thread(s)): {'cached' if done else 'training'}")  # fmt: skip
                    e5.ensure(PRESET, cfg, label, [seed], store)
        say(f"share {i}/{n} done; `rungs` without --share writes the table once every share is done")
        return
    with live(Live(checkpoint_every=CHECKPOINT_EVERY)):
        rows = e5.run(PRESET, list(SEEDS), store, "cpu", ("parity",))
    print(e5.report(rows, PRESET))


def ship(source: Store, store: Store) -> list[str]:
    """Copy source's finished runs (trained and evaluated: e5.evaluated) that `store` lacks or holds unfinished,
    weightless, and the probe's record; rebuild the table from the stored runs without computing anything. Returns
    the run keys copied."""
    configs = {cfg.run_key(s): cfg for cfg, _ in e5.trainings(PRESET, ("parity",)) for s in SEEDS}
    configs |= {candidate(name).run_key(s): candidate(name) for name in GPU_RECIPES for s in SEEDS}
    copied = ship_runs(PRESET, configs, source, store, say)
    if (source.root / PROBE_FILE).is_file():  # with the seeds that finished since it was written, as shipped
        written = (source.root / PROBE_FILE).read_bytes()
        record = caught_up(store, json.loads(written))
        if record == json.loads(written):
            atomic_write(store.root / PROBE_FILE, written)
        else:
            save(store, record)
    e5.run(PRESET, list(SEEDS), store, "cpu", ("parity",), progress=False, compute=lambda cfg: False)
    return copied


def ship_runs(preset_name: str, configs: dict[str, RunConfig], source: Store, store: Store, say) -> list[str]:
    """Copy the runs of `configs` (run key -> config) that `source` holds finished (trained and evaluated as the
    study evaluates them: e5.evaluated) and `store` lacks or holds unfinished, each without its weights (the
    manifest names their size), whole or not at all. Returns the run keys copied; says which stay behind."""
    import shutil

    from engine.runtime.gpu_pack import swap_into

    def finished(where: Store, key: str) -> bool:
        cfg = configs.get(key)
        return cfg is not None and where.status(key) == "ok" and e5.evaluated(preset_name, cfg, where.load_rows(key))

    copied, behind = [], []
    for key in source.run_keys():
        if finished(store, key):
            continue
        if not finished(source, key):
            behind.append(key)
            continue
        staged = Store(store.root / f".ship-{key}")  # weightless before it enters the results folder
        shutil.rmtree(staged.root, ignore_errors=True)
        try:
            shutil.copytree(source.run_dir(key), staged.run_dir(key))
            size = sum(f.stat().st_size for f in staged.run_dir(key).iterdir() if is_weights(f.name))
            staged.drop_weights(key, f"{size / 1e6:.1f} MB of weights ({configs[key].model.n_params:,} parameters): "
                                     "not kept in the repository")  # fmt: skip
            swap_into(staged.run_dir(key), store.run_dir(key))  # whole or not at all; a damaged copy swapped out
        finally:
            shutil.rmtree(staged.root, ignore_errors=True)
        copied.append(key)
    if behind:
        say(f"left behind, not finished (training, or the evaluation that follows it): {' '.join(behind)}")
    return copied


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.runtime.cpu_ladder", description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", choices=["probe", "rungs", "ship"])
    ap.add_argument("--source", help="ship: the results folder the pieces ran in")
    ap.add_argument("--results", default="cached_results", help="results folder (the study lives in its cpu-ladder/)")
    ap.add_argument(
        "--share",
        default="0/1",
        help="rungs: I/N, this process's share of the seeds (s %% N == I), "
        "cores/N threads; run N of them side by side (2 single-thread processes on 2 cores)",
    )
    ap.add_argument("--threads", type=int, help="rungs --share: threads of this process (default cores/N)")
    ap.add_argument("--candidates", default=",".join(GPU_RECIPES), help="the probe's candidates, in the rule's order")
    args = ap.parse_args(argv)
    try:
        names = [n.strip() for n in args.candidates.split(",")]
        unknown = [n for n in names if n not in GPU_RECIPES]
        if unknown or list(names) != [n for n in GPU_RECIPES if n in names]:
            raise UsageError(f"--candidates must name some of {', '.join(GPU_RECIPES)} in that order, "
                             f"got {args.candidates[:40]!r}.")  # fmt: skip
        i, _, n = args.share.partition("/")
        if not (i.isdigit() and n.isdigit() and 0 <= int(i) < int(n)):
            raise UsageError(f"--share must be I/N with 0 <= I < N (e.g. 0/2 and 1/2), got {args.share[:20]!r}.")
        store = Store(study_root(args.results, PRESET))
        store.check_writable()
        if args.stage == "probe":
            probe(store, names)
        elif args.stage == "rungs":
            if args.threads is not None and not 1 <= args.threads <= 4 * (os.cpu_count() or 1):
                raise UsageError(f"--threads must be between 1 and {4 * (os.cpu_count() or 1)}, got {args.threads}.")
            rungs(store, (int(i), int(n)), args.threads)
        else:
            if not args.source or not (study_root(args.source, PRESET) / "runs").is_dir():
                raise UsageError(f"ship needs --source, a results folder whose {PRESET}/runs/ holds the pieces' runs.")
            copied = ship(Store(study_root(args.source, PRESET)), store)
            say(f"shipped {len(copied)} run(s) into {store.root}: {' '.join(copied) or 'none new'}")
    except (UsageError, PermissionError) as e:
        print(f"loopscope: {e if isinstance(e, UsageError) else explain(e) or e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
