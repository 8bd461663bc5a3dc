"""The agreement-or-growth design at 1.6M (preset `cpu-agree`; docs/design.md §10), in pieces that survive a lost
machine: one seed of one arm a piece, a checkpoint every CHECKPOINT_EVERY steps under <results>/cpu-agree/jobs/ckpt/,
resumed bit for bit by running the same command again on the same machine; every finished piece is cached.

  pieces  the 32 runs as pieces, interleaved (`none` seed 0, `norm` seed 0, `none` seed 1, ...). With --share I/N
          this process takes pieces I, I+N, ...: with 0/2 and 1/2 side by side, one process trains the `none` arm in
          seed order and the other the `norm` arm, one thread each. Each piece: trained, evaluated as trained at
          n = 1..12, then `norm->none` and `norm->rescale` (norm-trained) or `none->norm` (none-trained). Without
          --share: every piece in turn (cached ones cost nothing), then the e5-cpu-agree table.
          The go/no-go (§10): no `none` seed after seed 0 trains while `none` seed 0's held-out accuracy at n = T
          is below GO_BAR; the arm then needs its own recipe probe first.
  ship    the finished runs of a results folder the pieces ran in (--source, outside the repository) into
          --results, each without its weights (its manifest names their size; they stay in --source), then the
          e5-cpu-agree table rebuilt from what is stored (nothing computed).
  status  which pieces are done, and the go/no-go.

    python -m engine.runtime.cpu_agree pieces --share 0/2 --results DIR & \\
    python -m engine.runtime.cpu_agree pieces --share 1/2 --results DIR
    python -m engine.runtime.cpu_agree ship --source DIR [--results cached_results]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from engine.core import memory
from engine.core.presets import RunConfig, preset, study_root
from engine.core.store import Store
from engine.errors import UsageError, explain
from engine.experiments import e5
from engine.experiments.ladder import recipe_score
from engine.experiments.runs import Live, check_study_precision, live
from engine.runtime.cpu_ladder import ship_runs

PRESET = "cpu-agree"
SEEDS = tuple(range(16))
CHECKPOINT_EVERY = 100  # steps: about 70 s of the 1.6M model on one thread
GO_BAR = 0.95  # §10's go/no-go: `none` seed 0's held-out accuracy at n = T, as trained


def say(text: str) -> None:
    print(f"[cpu-agree {time.strftime('%H:%M:%S')}] {text}", flush=True)


def pieces() -> list[tuple[RunConfig, int]]:
    """Every run of the design, `none` and `norm` interleaved by seed (so --share 0/2 is the `none` arm)."""
    arms = [preset(PRESET, "parity", boundary) for boundary in ("none", "norm")]
    return [(cfg, seed) for seed in SEEDS for cfg in arms]


def go_no_go(store: Store) -> tuple[str, float | None]:
    """("go" | "no-go" | "open", the score): `none` seed 0's held-out accuracy at n = T as trained, against GO_BAR."""
    key = preset(PRESET, "parity", "none").run_key(0)
    if store.status(key) != "ok":
        return "open", None
    score = recipe_score(store.load_rows(key), "none")
    return ("go" if score >= GO_BAR else "no-go"), score


def finished(store: Store, cfg: RunConfig, seed: int) -> bool:
    key = cfg.run_key(seed)
    return store.status(key) == "ok" and e5.evaluated(PRESET, cfg, store.load_rows(key))


def run_pieces(store: Store, share: tuple[int, int] = (0, 1), threads: int | None = None) -> None:
    """This process's share of the pieces (each trained and evaluated whole before the next), then, without a
    share, the table."""
    import torch

    i, n = share
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // n))
    mine = pieces()[i::n]
    check_study_precision(store, PRESET, {cfg for cfg, _ in mine})
    est = memory.estimate(mine[0][0], 1, "cpu")
    say(f"{len(mine)} piece(s) on {torch.get_num_threads()} thread(s); estimated peak memory "
        f"{est.peak_bytes / 2**30:.2f} GiB a piece")  # fmt: skip
    took: list[float] = []
    with live(Live(checkpoint_every=CHECKPOINT_EVERY)):
        for k, (cfg, seed) in enumerate(mine):
            key = cfg.run_key(seed)
            if cfg.model.boundary == "none" and seed > 0:
                verdict, score = go_no_go(store)
                if verdict != "go":
                    why = "has not finished" if score is None else f"scored {score:.4f} < {GO_BAR}"
                    say(f"stopping before `none` seed {seed}: `none` seed 0 {why} (go/no-go, docs/design.md §10)")
                    return
            left = len(mine) - k
            eta = f"; about {left * sum(took) / len(took) / 3600:.1f} h left at this pace" if took else ""
            done = finished(store, cfg, seed)
            say(f"piece {k + 1}/{len(mine)}: {cfg.model.boundary} seed {seed} (run {key}): "
                f"{'cached' if done else 'training'}{eta}")  # fmt: skip
            t0 = time.monotonic()
            e5.ensure(PRESET, cfg, "e2", [seed], store)
            if not done:
                took.append(time.monotonic() - t0)
                score = recipe_score(store.load_rows(key), cfg.model.boundary)
                say(f"{cfg.model.boundary} seed {seed}: held-out accuracy at T {score:.4f} ({took[-1]:.0f} s)")
    if n > 1:
        say(f"share {i}/{n} done; `pieces` without --share writes the table once every share is done")
        return
    rows = e5.run(PRESET, list(SEEDS), store, "cpu", ("parity",), progress=False, compute=lambda cfg: False)
    print(e5.report(rows, PRESET))


def ship(source: Store, store: Store) -> list[str]:
    """source's finished runs into `store`, weightless; the table rebuilt from what is stored (nothing computed)."""
    configs = {cfg.run_key(seed): cfg for cfg, seed in pieces()}
    copied = ship_runs(PRESET, configs, source, store, say)
    e5.run(PRESET, list(SEEDS), store, "cpu", ("parity",), progress=False, compute=lambda cfg: False)
    return copied


def status(store: Store) -> None:
    verdict, score = go_no_go(store)
    done = [(cfg.model.boundary, seed) for cfg, seed in pieces() if finished(store, cfg, seed)]
    for arm in ("none", "norm"):
        seeds = [s for b, s in done if b == arm]
        print(f"{arm}: {len(seeds)} of {len(SEEDS)} seeds finished ({', '.join(map(str, seeds)) or 'none'})")
    print(f"go/no-go: {verdict}" + ("" if score is None else f" (`none` seed 0 at T: {score:.4f}, bar {GO_BAR})"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.runtime.cpu_agree", description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", choices=["pieces", "ship", "status"])
    ap.add_argument("--source", help="ship: the results folder the pieces ran in")
    ap.add_argument("--results", default="cached_results", help="results folder (the study lives in its cpu-agree/)")
    ap.add_argument("--share", default="0/1", help="pieces: I/N, this process's share (pieces I, I+N, ...)")
    ap.add_argument("--threads", type=int, help="pieces: threads of this process (default cores/N)")
    args = ap.parse_args(argv)
    try:
        i, _, n = args.share.partition("/")
        if not (i.isdigit() and n.isdigit() and 0 <= int(i) < int(n)):
            raise UsageError(f"--share must be I/N with 0 <= I < N (e.g. 0/2 and 1/2), got {args.share[:20]!r}.")
        if args.threads is not None and not 1 <= args.threads <= 4 * (os.cpu_count() or 1):
            raise UsageError(f"--threads must be between 1 and {4 * (os.cpu_count() or 1)}, got {args.threads}.")
        store = Store(study_root(args.results, PRESET))
        if args.stage == "status":
            status(store)
            return 0
        store.check_writable()
        if args.stage == "pieces":
            run_pieces(store, (int(i), int(n)), args.threads)
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
