"""One device session of the GPU study in one command (dev/checks/gpu-session.sh starts it; docs/gpu-study.md).

In order, each step logged to OUT/gpu-session.log as it happens (a kill leaves the log and what was written):
  1. CUDA asserted in the first seconds (exit 3 and one sentence if there is none); --dry-run runs on the CPU
  2. calibration (at most CALIBRATION_S): the preset's compile seconds, a training step at 4 and at 16 seeds, one
     evaluation pass, one refit step, the peak memory against the estimate -> OUT/rates.json (gpu_study.Rates)
  3. the next unfinished piece (ORDER) whose prediction from those rates fits what is left of the command, run
     as `python -m engine.runtime.gpu_study run PIECE` under its own timeout, then packed (engine.runtime.gpu_pack)
  4. the Inductor cache tarred to OUT/inductor-cache.tar.gz (for the next session to carry), when it fits 16 MiB
  5. the plan of the next real session: `plan: N s of device time`, from the rates last measured on a GPU
     (dev/studies/gpu-study/rates.json, committed from a session's OUT/rates.json) or else the H200's of 2026-12-04
OUT ends with at most 8 files: gpu-session.{log,json}, rates.json, gpu-study-PIECE.{tar.gz,json,log}, inductor-cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

COMMAND_S = 540  # one command: 9 of the device tool's 10 minutes
CALIBRATION_S = 60
START_S, PACK_S, MARGIN_S = 150, 30, 30  # the plan's start-up (1-2 min measured), pack and tar, give-back margin
RESERVE_S = 60  # of the command, kept after the piece's limit for its pack, the cache's tar and the plan
SESSION_S = 780  # the device time one session may plan for (15 minutes less what a session cannot use)
ORDER = ("norm", "none", "e3", "chain-c1", "chain-c2")  # the GPU's part (the ladder runs on the CPU: cpu_ladder)
MAX_FILES, FILE_MIB = 8, 16
LAST_RATES = REPO / "dev" / "studies" / "gpu-study" / "rates.json"
T0 = time.monotonic()


class Log:
    def __init__(self, out: Path):
        self.path = out / "gpu-session.log"
        self.file = self.path.open("a", buffering=1)

    def __call__(self, text: str) -> None:
        line = f"[gpu-session {time.monotonic() - T0:6.1f} s] {text}"
        print(line, flush=True)
        self.file.write(line + "\n")


def elapsed() -> float:
    return time.monotonic() - T0


# ---------------------------------------------------------------- 2. calibration


def calibrate(preset_name: str, device: str, log: Log, limit_s: float = CALIBRATION_S) -> tuple[dict, object]:
    """Measure, on `device`, what a piece's prediction reads (gpu_study.Rates), within about `limit_s` seconds."""
    import torch

    from engine.core import flops, memory
    from engine.core.evaluate import batched, step_metrics
    from engine.core.presets import preset
    from engine.core.tasks import eval_set
    from engine.core.train import compile_wanted, train_group
    from engine.runtime.gpu_study import Rates

    t0, record = time.monotonic(), {}
    ref = preset(preset_name, "parity", "norm")
    avg = flops.training_flops(ref, 1) / ref.train.steps  # one member's step over the whole schedule

    def steps_timed(members: int, steps: int, skip: int) -> tuple[float, object]:
        cfg = replace(ref, train=replace(ref.train, steps=steps, warmup_steps=1, group_size=members))
        stamps: list[float] = []
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        r = train_group(cfg, list(range(members)), device, progress=False, check_every=steps,
                        on_step=lambda *_: stamps.append(time.monotonic()))  # fmt: skip
        measured = flops.training_flops(cfg, 1) - flops.training_flops(cfg, 1, skip)  # the timed steps' own FLOPs
        per = (stamps[-1] - stamps[skip - 1]) / (steps - skip) * avg / (measured / (steps - skip))
        first = stamps[0] - (stamps[-1] - stamps[0]) / max(1, steps - 1)  # compile and warm-up in the first step
        return per, dict(seconds_a_step=round(per, 4), first_step_s=round(first, 2), wall_s=round(r.wall_s, 1),
                         peak_gib=r.peak_memory_gib, estimated_gib=r.estimated_memory_gib, model=r.model)  # fmt: skip

    compiling = compile_wanted(device)
    t = time.monotonic()
    s4, record["train_4"] = steps_timed(4, 6, 2)
    compile_s = max(0.0, (time.monotonic() - t) - 6 * s4) if compiling else 0.0
    record["train_4"].pop("model")
    log(f"calibration: 4 seeds {s4:.4f} s a step (compile and warm-up {compile_s:.0f} s)")
    default = Rates.h200(preset_name)  # what a part cut by the calibration's limit falls back to (said in the log)

    def over(part: str) -> bool:
        if time.monotonic() - t0 <= limit_s:
            return False
        record.setdefault("not_measured", []).append(part)
        log(f"calibration: past its {limit_s:.0f} s; {part} from the H200's rates of 2026-12-04")
        return True

    if over("the 16-seed step"):
        s16 = s4 * default.step(16) / default.step(4)
        model = train_group(replace(ref, train=replace(ref.train, steps=1, warmup_steps=1)), list(range(16)), device,
                            progress=False).model  # fmt: skip
    else:
        s16, record["train_16"] = steps_timed(16, 5, 2)
        model = record["train_16"].pop("model")
    if "train_16" in record:
        log(f"calibration: 16 seeds {s16:.4f} s a step; peak {record['train_16']['peak_gib']} GiB against the "
            f"estimate {record['train_16']['estimated_gib']:.1f} GiB")  # fmt: skip
    hardest = ref.task.eval_difficulties[-1]
    evaluated = model if batched(model) else model.member(0)  # the CPU evaluates one member at a time
    if over("the evaluation pass"):
        eval_s = default.eval_s * s16 / default.step(16)
    else:
        t = time.monotonic()
        step_metrics(evaluated, eval_set(ref.task, hardest), ref.max_eval_loops, "none")
        sync(device)
        eval_s = (time.monotonic() - t) * len(ref.task.eval_difficulties) / evaluated.members  # a member, every one
        log(f"calibration: one member's evaluation pass {eval_s:.3f} s ({evaluated.members} in one forward)")
    refit_s = s16 if over("the refit step") else refit_step_s(model, ref, device)
    log(f"calibration: one refit step (head + last, 16 seeds) {refit_s:.4f} s")
    floor = Rates.h200(preset_name).floor_s if device == "cuda" else 0.0
    rates = Rates(f"measured {time.strftime('%Y-%m-%d')} on {device_name(device)} (dev/checks/gpu-session.sh)",
                  {4: s4, 16: s16}, floor, eval_s, refit_s, compile_s)  # fmt: skip
    record |= dict(preset=preset_name, device=device_name(device), seconds=round(time.monotonic() - t0, 1),
                   limit_s=limit_s, eval_member_s=round(eval_s, 4), refit_step_s=round(refit_s, 4),
                   compile_s=round(compile_s, 1))  # fmt: skip
    est = memory.estimate(ref, 16, device)
    record["memory_16"] = dict(estimated_gib=round(est.peak_bytes / memory.GIB, 2),
                               measured_gib=record.get("train_16", {}).get("peak_gib"))  # fmt: skip
    del model
    return record, rates


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def refit_step_s(model, ref, device: str, warm: int = 1, timed: int = 3) -> float:
    """Seconds of one E3 refit step of head + last layer for the whole group, as engine.experiments.refit trains it
    (a copy of the model, the loop frozen, `none` mode at n = T, per-member clipping), evaluation left out."""
    import copy

    import torch

    from engine.core import tasks
    from engine.core.train import adamw, member_losses, optimizer_step
    from engine.experiments import refit as rf

    m = copy.deepcopy(model)
    names = rf.refit_names(m, "head+last")
    for n, p in m.named_parameters():
        p.requires_grad_(n in names)
    params = [p for p in m.parameters() if p.requires_grad]
    opt = adamw([p for p in params if p.dim() == 3], [p for p in params if p.dim() != 3], 1e-3, 0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    gens = [tasks.train_generator(tasks.derive_seed("calibration", s)) for s in range(m.members)]
    hardest = max(ref.task.train_difficulties)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")
    t = 0.0
    for step in range(warm + timed):
        if step == warm:
            sync(device)
            t = time.monotonic()
        batches = [tasks.train_batch(ref.task, hardest, ref.train.batch_size, g) for g in gens]
        tokens = torch.stack([b.tokens for b in batches]).to(device)
        targets = torch.stack([b.targets for b in batches]).to(device)
        with autocast:
            out = m(tokens, ref.model.trained_loops, "none", all_positions=True, readout_steps="last")
        optimizer_step(member_losses(out.logits, targets).sum(), opt, sched, params, 1.0)
    sync(device)
    return (time.monotonic() - t) / timed


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else f"the CPU ({os.cpu_count()} cores)"


# ---------------------------------------------------------------- 3. the next piece


def todo(piece: str, preset_name: str, results: Path) -> bool:
    """Whether a piece still has work in the store at `results`."""
    from engine.core.presets import preset, study_root
    from engine.core.store import Store
    from engine.experiments import e3, e5
    from engine.runtime import gpu_study as gs

    store = Store(study_root(results, preset_name))
    if piece in ("norm", "none"):
        cfg = preset(preset_name, "parity", piece)
        seeds = cfg.group(0)
        steps = ["surgery"] if piece == "none" else ["surgery", "rescale"]
        return gs.needs(store, cfg, seeds, preset_name, steps) or (
            piece == "norm" and gs.needs(store, cfg, e5.seeds_for(preset_name, cfg, seeds), preset_name, ["rescale"])
        )
    if piece == "e3":
        cfg = preset(preset_name, "parity", "norm")
        keys = [cfg.run_key(s) for s in cfg.group(0)]
        return bool(e3.missing_refits(keys, e3.refit_config(preset_name), store))
    done = gs.chain_results(store)
    if piece == "chain-c2" and gs.adopted(done) == "C1":
        return False
    return piece.split("-")[1].upper() not in done


def predict(piece: str, preset_name: str, results: Path, rates) -> float:
    """Seconds a piece is predicted to take at `rates` (gpu_study.Rates), what it has stored already not counted."""
    from engine.core.presets import preset, study_root
    from engine.core.store import Store
    from engine.experiments import e3
    from engine.runtime import gpu_study as gs

    ref = preset(preset_name, "parity", "norm")
    store = Store(study_root(results, preset_name))
    if piece in ("norm", "none"):
        cfg = preset(preset_name, "parity", piece)
        m = len(cfg.group(0))
        stored = all(store.status(cfg.run_key(s)) == "ok" for s in cfg.group(0))
        train = 0.0 if stored else rates.train_s(cfg, m, ref) + rates.compile_s + rates.evals_s(cfg, m, 1, ref)
        return train + (rates.evals_s(cfg, m, 1, ref) + rates.evals_s(cfg, 4, 3, ref) if piece == "norm" else 0.0)
    if piece == "e3":
        refit = e3.refit_config(preset_name)
        m = len(ref.group(0))
        keys = [ref.run_key(s) for s in ref.group(0)]
        retrain = rates.train_s(ref, m, ref) + rates.compile_s if gs.weightless(store, keys) else 0.0
        return retrain + rates.refits_s(ref, m, refit.targets, refit.schedule, ref)
    cfg = gs.chain_candidates(preset_name, 100)["C2" if piece == "chain-c2" else "C1"]
    if piece == "chain-c1":
        return COMMAND_S - CALIBRATION_S - PACK_S  # as many steps as fit: it fills what is left
    return rates.train_s(cfg, len(gs.CHAIN_SEEDS), ref) + rates.compile_s


def choose(preset_name: str, results: Path, rates, left_s: float) -> tuple[str | None, list[dict]]:
    """The first unfinished piece of ORDER predicted to fit `left_s`, and what was weighed."""
    weighed = []
    for piece in ORDER:
        if not todo(piece, preset_name, results):
            weighed.append(dict(piece=piece, status="done"))
            continue
        seconds = predict(piece, preset_name, results, rates)
        fits = seconds <= left_s
        weighed.append(dict(piece=piece, predicted_s=round(seconds, 1), fits=fits))
        if fits:
            return piece, weighed
    return None, weighed


def run_piece(piece: str, args, rates_path: Path, limit: float, log: Log) -> int:
    """The piece under its own timeout (its budget refuses what would not fit first), then its pack."""
    env = dict(os.environ)
    study = [sys.executable, "-u", "-m", "engine.runtime.gpu_study", "run", piece, "--preset", args.preset,
             "--results", str(args.results), "--device", args.device, "--budget", f"{max(1.0, limit - 60):.0f}",
             "--limit", f"{limit:.0f}", "--out", str(args.out), "--rates", str(rates_path)]  # fmt: skip
    piece_log = args.out / f"gpu-study-{piece}.log"
    log(f"{piece}: started, limit {limit:.0f} s; its log: {piece_log.name}")
    with piece_log.open("a") as f:
        try:
            status = subprocess.run(study, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                    timeout=limit + 5).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            status = 124
            f.write(f"[gpu-session] {piece} reached its limit of {limit:.0f} s; packing what finished\n")
    log(f"{piece}: exit {status} after {elapsed():.0f} s of the session; packing")
    pack = [sys.executable, "-m", "engine.runtime.gpu_pack", piece, "--preset", args.preset, "--results",
            str(args.results), "--out", str(args.out)]  # fmt: skip
    with piece_log.open("a") as f:
        packed = subprocess.run(pack, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env, timeout=120).returncode
    log(f"{piece}: pack exit {packed}")
    return status or packed


# ---------------------------------------------------------------- 4. the Inductor cache, 5. the plan


def tar_cache(out: Path, log: Log) -> None:
    """OUT/inductor-cache.tar.gz of $TORCHINDUCTOR_CACHE_DIR, when it fits one file that comes back."""
    cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", Path.home() / ".cache" / "loopscope" / "inductor"))
    if not cache.is_dir() or not any(cache.iterdir()):
        log(f"inductor cache: nothing compiled here ({cache}); no tar")
        return
    path = out / "inductor-cache.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(cache, arcname="inductor")
    size = path.stat().st_size
    if size > (FILE_MIB - 1) * 2**20:
        path.unlink()
        log(f"inductor cache: {size / 2**20:.1f} MiB, over what one file of $OUT takes; not kept")
        return
    log(f"inductor cache: {path.name}, {size / 2**20:.1f} MiB (carry it as inductor-cache.tar.gz at the tree's root)")


def plan(results: Path, log: Log) -> dict:
    """The next real session on the `gpu` preset: start-up, calibration, the next piece that fits, pack and margin,
    at the rates last measured on a GPU (LAST_RATES) or else the H200's of 2026-12-04."""
    from engine.runtime.gpu_study import Rates

    rates = Rates.load(LAST_RATES, "gpu")
    left = COMMAND_S - CALIBRATION_S - RESERVE_S  # what a session's piece gets of its command
    piece, weighed = choose("gpu", results, rates, left)
    seconds = predict(piece, "gpu", results, rates) if piece else 0.0
    total = START_S + CALIBRATION_S + seconds + PACK_S + MARGIN_S
    pieces = {p: round(predict(p, "gpu", results, rates)) for p in ORDER if todo(p, "gpu", results)}
    out = dict(piece=piece, pieces=pieces,
               piece_s=round(seconds, 1), total_s=round(total), weighed=weighed, rates=rates.to_dict(),
               parts=dict(start=START_S, calibration=CALIBRATION_S, piece=round(seconds), pack=PACK_S,
                          margin=MARGIN_S))  # fmt: skip
    log(f"the next real session (gpu preset, {results}): {piece or 'nothing fits'}; weighed {weighed}")
    log(f"rates: {rates.source}")
    return out


# ---------------------------------------------------------------- the session


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="on the CPU at gpu-smoke size, into a scratch folder")
    ap.add_argument("--calibrate-only", action="store_true", help="the calibration, no piece (dev/checks/gpu-check.sh)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--limit", type=float, default=COMMAND_S, help="the command's seconds")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out)
    summary: dict = dict(started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), dry_run=args.dry_run)
    path = args.out / "gpu-session.json"

    def save() -> None:
        path.write_text(json.dumps(summary, indent=1, default=str))

    import torch

    args.device = "cpu" if args.dry_run else "cuda"
    args.preset = "gpu-smoke" if args.dry_run else "gpu"
    if args.results is None:
        args.results = Path("/tmp/gpu-session-dry-run-results") if args.dry_run else REPO / "cached_results"
    summary |= dict(torch=torch.__version__, device=args.device, preset=args.preset, results=str(args.results))
    if not args.dry_run and not torch.cuda.is_available():
        summary["error"] = "no CUDA device is visible: nothing was run (use --dry-run on a machine without one)"
        log(summary["error"])
        save()
        return 3
    from engine.core.store import gpu_info

    summary["env"] = gpu_info() if args.device == "cuda" else {"device": "cpu", "threads": torch.get_num_threads()}
    log(f"{args.device} asserted after {elapsed():.1f} s (torch {torch.__version__}); preset {args.preset}")
    summary["plan"] = plan(REPO / "cached_results", log)  # the next real session's, before anything can cut this short
    save()
    try:
        summary["calibration"], rates = calibrate(args.preset, args.device, log)
    except Exception as e:  # the session still plans and says why
        summary["calibration"] = dict(error=f"{type(e).__name__}: {e}"[:600])
        log(f"calibration failed: {summary['calibration']['error']}")
        save()
        return 1
    rates_path = args.out / "rates.json"
    rates_path.write_text(json.dumps(rates.to_dict(), indent=1))
    save()
    status = 0
    if not args.calibrate_only:
        left = args.limit - elapsed() - RESERVE_S
        piece, weighed = choose(args.preset, args.results, rates, left)
        summary["choice"] = dict(piece=piece, left_s=round(left, 1), weighed=weighed)
        log(f"next piece: {piece or 'none fits or none is left'} ({left:.0f} s left; weighed {weighed})")
        save()
        if piece:
            status = run_piece(piece, args, rates_path, left, log)
            summary["piece"] = dict(name=piece, status=status, session_s=round(elapsed(), 1))
            save()
    tar_cache(args.out, log)
    summary["wall_s"] = round(elapsed(), 1)
    files = sorted(p.name for p in args.out.iterdir())
    summary["files"] = files
    save()
    if len(files) > MAX_FILES:
        log(f"OUT holds {len(files)} files, over the {MAX_FILES} that come back: {files}")
        status = status or 1
    p = summary["plan"]
    log(f"session: {elapsed():.0f} s; OUT: {len(files)} files")
    within = "within" if p["total_s"] <= SESSION_S else "OVER"
    print(f"plan: {p['total_s']} s of device time (start-up {START_S}, calibration {CALIBRATION_S}, "
          f"{p['piece'] or 'no piece'} {p['piece_s']:.0f}, pack {PACK_S}, margin {MARGIN_S}; {within} the "
          f"{SESSION_S} s a session plans for; each piece left: {p['pieces']})", flush=True)  # fmt: skip
    return status


if __name__ == "__main__":
    sys.exit(main())
