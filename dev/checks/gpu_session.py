"""One device session of the GPU study in one command (dev/checks/gpu-session.sh starts it; docs/gpu-study.md).

In order, each step logged to OUT/gpu-session.log as it happens (a kill leaves the log and what was written):
  1. CUDA asserted in the first seconds (exit 3 and one sentence if there is none); --dry-run runs on the CPU. This
     GPU's own Inductor cache folder set, and the carried cache's entries for this GPU unpacked into it
  2. the calibration (gpu_rates.Rates -> OUT/rates.json): first one untimed warm-up of every graph a piece runs
     (training the preset's group, its evaluation under no-grad and TF32, one member evaluated alone, a refit of a
     copy), its seconds beyond the steady cost recorded apart as compile_s (charged once to each piece's process);
     then at most CALIBRATION_S of timed passes: a step at 4 and at 16 seeds, E3's refit as refits run, the host's
     batches. If the compiled path fails, the calibration runs again eager (LOOPSCOPE_COMPILE=0) and so does the
     rest of the session, said in the log and the summary (`compile`)
  3. the piece engine.runtime.gpu_plan.choose picks from those rates, run as `python -m engine.runtime.gpu_study run
     PIECE` under its own timeout, then packed (engine.runtime.gpu_pack); each unit's wall logged beside its prediction
  4. this GPU's Inductor cache tarred to OUT/inductor-cache.tar.gz, as much of it as fits one file that comes back
  5. the plan of the next real session, each part's prediction, and the last line `plan: N s of device time`, from
     the rates last measured on a GPU (dev/studies/gpu-study/rates.json, committed from a session's OUT/rates.json)
     or else the H200's of 2026-12-04
OUT ends with at most 8 files: gpu-session.{log,json}, rates.json, gpu-study-PIECE.{tar.gz,json,log}, inductor-cache.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from engine.runtime.gpu_plan import CALIBRATION_S, RESERVE_S, SESSION_S  # noqa: E402

MAX_FILES, FILE_MIB = 8, 15  # what comes back of $OUT: files, and MiB a file
LAST_RATES = REPO / "dev" / "studies" / "gpu-study" / "rates.json"
CARRIED = REPO / "inductor-cache.tar.gz"  # the last session's $OUT/inductor-cache.tar.gz, put at the tree's root
TRITON_STEPS = {".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn", ".source"}  # Triton's intermediate files: not loaded
GRAPH_CACHES = ("fxgraph", "aotautograd")  # Inductor's caches of whole compiled graphs (the rest: their kernels)
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


# ---------------------------------------------------------------- 1. this GPU's Inductor cache


def cache_slug(device: str) -> str:
    """This device and torch as a folder name: a cache folder holds one GPU kind's kernels for one torch."""
    import torch

    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return re.sub(r"[^a-z0-9]+", "-", f"{name} torch {torch.__version__}".lower()).strip("-")


def cache_base() -> Path:
    return Path(os.environ.get("LOOPSCOPE_INDUCTOR_CACHE", Path.home() / ".cache" / "loopscope" / "inductor"))


def use_cache(slug: str, log: Log, carried: Path = CARRIED) -> Path:
    """Point Inductor at this GPU's own folder ($TORCHINDUCTOR_CACHE_DIR, read by every process of the session), and
    unpack into it the carried tar's entries for this GPU and torch (entries for another are left out)."""
    folder = cache_base() / slug
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    if not carried.is_file():
        log(f"inductor cache: {folder} (nothing carried)")
        return folder
    prefix = f"inductor/{slug}/"
    try:
        with tarfile.open(carried) as tar:
            every = tar.getmembers()
            mine = [m for m in every if m.name.startswith(prefix) and ".." not in m.name and (m.isfile() or m.isdir())]
            for m in mine:
                m.name = m.name[len("inductor/") :]
            tar.extractall(cache_base(), members=mine, filter="data")
    except (tarfile.TarError, OSError, EOFError) as e:
        log(f"inductor cache: the carried {carried.name} is unreadable ({type(e).__name__}); starting empty")
        return folder
    others = sum(1 for m in every if m.isfile()) - sum(1 for m in mine if m.isfile())
    log(f"inductor cache: {folder}; unpacked {sum(1 for m in mine if m.isfile())} files of this GPU's from "
        f"{carried.name} ({others} of another GPU or torch left out)")  # fmt: skip
    return folder


# ---------------------------------------------------------------- 2. calibration


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else f"the CPU ({os.cpu_count()} cores)"


def calibrate(preset_name: str, device: str, log: Log, limit_s: float = CALIBRATION_S) -> tuple[dict, object]:
    """Measure on `device` what the pieces pay (gpu_rates.Rates; module docstring, step 2). The timed passes stop at
    about `limit_s` seconds after the warm-up's one-off seconds; a part cut there is scaled from the H200's rates."""
    import torch

    from engine.core import flops, tasks
    from engine.core.evaluate import batched, step_metrics
    from engine.core.presets import preset
    from engine.core.train import compile_wanted, train_group
    from engine.experiments import refit as rf
    from engine.runtime.gpu_rates import Rates

    ref = preset(preset_name, "parity", "norm")
    group, hardest, lengths = ref.train.group_size, ref.task.eval_difficulties[-1], len(ref.task.eval_difficulties)
    at_hardest = replace(ref, task=replace(ref.task, eval_difficulties=(hardest,)))
    compiling, default = compile_wanted(device), Rates.h200(preset_name)
    record: dict = dict(preset=preset_name, device=device_name(device), compiled=compiling, limit_s=limit_s)
    t0, one_off = time.monotonic(), {}

    def clock(fn) -> float:
        sync(device)
        t = time.monotonic()
        fn()
        sync(device)
        return time.monotonic() - t

    def evaluation(model) -> float:  # one pass at the hardest length, as evaluate() runs it on this device
        return clock(lambda: step_metrics(model, tasks.eval_set(ref.task, hardest), ref.max_eval_loops, "norm"))

    def refit(model, steps: int) -> float:  # E3's refit of head + last as it runs: a copy (eager), then evaluated
        cfg = rf.RefitConfig(targets=("head+last",), schedule=(0, steps))
        seeds = list(range(model.members))
        return clock(lambda: rf.refit(model, at_hardest, seeds, "head+last", cfg, ref.max_eval_loops, device))

    def steps_timed(members: int, steps: int, skip: int) -> float:
        """Seconds of one step of `members` seeds, averaged over the preset's schedule (the timed steps' FLOPs)."""
        cfg = replace(ref, train=replace(ref.train, steps=steps, warmup_steps=1, group_size=members))
        stamps: list[float] = []
        train_group(cfg, list(range(members)), device, progress=False, check_every=skip,  # a host sync at `skip`
                    on_step=lambda *_: stamps.append(time.monotonic()))  # fmt: skip
        measured = flops.training_flops(cfg, 1) - flops.training_flops(cfg, 1, skip)  # the timed steps' own FLOPs
        avg = flops.training_flops(ref, 1) / ref.train.steps  # one member's step over the whole schedule
        return (stamps[-1] - stamps[skip - 1]) / (steps - skip) * avg / (measured / (steps - skip))

    # 1. the warm-up: every graph a piece runs, once, before anything is timed
    stamps: list[float] = []
    start = time.monotonic()
    warm = train_group(replace(ref, train=replace(ref.train, steps=3, warmup_steps=1)), list(range(group)), device,
                       progress=False, check_every=1, on_step=lambda *_: stamps.append(time.monotonic()))  # fmt: skip
    one_off["training"] = stamps[0] - start - (stamps[2] - stamps[1])
    model = warm.model
    evaluated = model if batched(model) else model.member(0)  # the CPU evaluates one member at a time
    first = evaluation(evaluated)
    eval_hard = evaluation(evaluated)
    one_off["evaluation"] = first - eval_hard
    alone_hard = eval_hard
    if batched(model):  # the surgeries evaluate one member alone, from its stored weights: eager
        alone = model.member(0)
        first = evaluation(alone)
        alone_hard = evaluation(alone)
        one_off["one member alone"] = first - alone_hard
    refit_first = refit(model, 1)
    compile_s = sum(max(0.0, s) for s in one_off.values())
    record |= dict(warm_up_s=round(time.monotonic() - start, 1), peak_gib=warm.peak_memory_gib,
                   estimated_gib=round(warm.estimated_memory_gib, 2))  # fmt: skip
    how = "compiled" if compiling else "eager"
    log(f"calibration: warm-up ({how}) of every graph a piece runs {record['warm_up_s']:.0f} s, of which one-off "
        f"{compile_s:.1f} s ({', '.join(f'{k} {v:.1f}' for k, v in one_off.items())}); {group} seeds' peak "
        f"{warm.peak_memory_gib} GiB against the estimate {warm.estimated_memory_gib:.1f} GiB")  # fmt: skip

    def over(part: str) -> bool:
        if time.monotonic() - t0 - compile_s <= limit_s:
            return False
        record.setdefault("not_measured", []).append(part)
        log(f"calibration: past its {limit_s:.0f} s; {part} scaled from the H200's rates of 2026-12-04")
        return True

    # 2. the timed passes
    s4 = steps_timed(4, 6, 2)
    s16 = s4 * default.step(16) / default.step(4) if over("the 16-seed step") else steps_timed(16, 5, 2)
    log(f"calibration: a training step {s4:.4f} s at 4 seeds, {s16:.4f} s at 16")
    eval_s = eval_hard * lengths / evaluated.members
    eval_one_s = alone_hard * lengths
    log(f"calibration: one member's evaluation pass {eval_s:.3f} s in the trained model ({evaluated.members} in one "
        f"forward), {eval_one_s:.3f} s alone from its weights")  # fmt: skip
    if over("the refit step"):
        refit_s, refit_eval_s = s16 * group / 16, eval_s
    else:
        two, six = refit(model, 2), refit(model, 6)
        refit_s = max(0.0, six - two) / 4
        refit_eval_s = max(0.0, two - 2 * refit_s) * lengths / group
        one_off["refit"] = max(0.0, refit_first - (two - refit_s))
        log(f"calibration: a refit step (head + last, {group} seeds, as E3 runs it) {refit_s:.4f} s; one member's "
            f"evaluation pass in a refit {refit_eval_s:.3f} s")  # fmt: skip
    compile_s = sum(max(0.0, s) for s in one_off.values())
    record["host_batch"] = host_batches(ref, device, s4 + (s16 - s4) * (group - 4) / 12)  # the group's step
    log(f"calibration: {record['host_batch']['sentence']}")
    floor = default.floor_s if device == "cuda" else 0.0
    rates = Rates(f"measured {time.strftime('%Y-%m-%d')} on {device_name(device)} ({how}; dev/checks/gpu-session.sh)",
                  {4: s4, 16: s16}, floor, eval_s, refit_s, compile_s, eval_one_s, refit_eval_s)  # fmt: skip
    record |= dict(seconds=round(time.monotonic() - t0, 1), compile_s=round(compile_s, 1), rates=rates.to_dict(),
                   one_off_s={k: round(v, 2) for k, v in one_off.items()})  # fmt: skip
    del model, evaluated, warm
    if device == "cuda":
        torch.cuda.empty_cache()
    return record, rates


def host_batches(ref, device: str, step_s: float, repeat: int = 5) -> dict:
    """Seconds the host takes to build one training step's batches for the preset's group at the hardest training
    length (train_group builds them on the host, pinned on a GPU, and copies them without a wait), against a step."""
    import torch

    from engine.core import tasks

    gens = [tasks.train_generator(s) for s in range(ref.train.group_size)]
    d = max(ref.task.train_difficulties)
    t = time.monotonic()
    for _ in range(repeat):
        batches = [tasks.train_batch(ref.task, d, ref.train.batch_size, g) for g in gens]
        tokens, targets = (torch.stack([getattr(b, f) for b in batches]) for f in ("tokens", "targets"))
        if device == "cuda":
            tokens, targets = tokens.pin_memory(), targets.pin_memory()
    seconds = (time.monotonic() - t) / repeat
    share = seconds / step_s if step_s > 0 else float("nan")
    sentence = (f"a step's batches built on the host in {seconds * 1e3:.1f} ms, {share:.0%} of the group's step; "
                "the losses stay on the device (checked every 25 steps), so the host builds the next step's batches "
                "while the device runs this one" if device == "cuda" else
                f"a step's batches built in {seconds * 1e3:.1f} ms, {share:.0%} of the group's step (the CPU builds "
                "them between steps)")  # fmt: skip
    return dict(seconds=round(seconds, 5), share_of_step=round(share, 4), sentence=sentence)


# ---------------------------------------------------------------- 3. the piece


def run_piece(piece: str, args, rates_path: Path, limit: float, log: Log) -> dict:
    """The piece in its own process under its own timeout (it refuses a unit its prediction says would not end by
    `limit`), then its pack; each unit's wall against its prediction, logged and returned."""
    env = dict(os.environ)
    study = [sys.executable, "-u", "-m", "engine.runtime.gpu_study", "run", piece, "--preset", args.preset,
             "--results", str(args.results), "--device", args.device, "--budget", f"{limit:.0f}",
             "--limit", f"{limit:.0f}", "--out", str(args.out), "--rates", str(rates_path)]  # fmt: skip
    piece_log = args.out / f"gpu-study-{piece}.log"
    log(f"{piece}: started, limit {limit:.0f} s; its log: {piece_log.name}")
    t = time.monotonic()
    with piece_log.open("a") as f:
        try:
            status = subprocess.run(study, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                    timeout=limit + 5).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            status = 124
            f.write(f"[gpu-session] {piece} reached its limit of {limit:.0f} s; packing what finished\n")
    wall = time.monotonic() - t
    log(f"{piece}: exit {status} after {wall:.0f} s ({elapsed():.0f} s of the session); packing")
    pack = [sys.executable, "-m", "engine.runtime.gpu_pack", piece, "--preset", args.preset, "--results",
            str(args.results), "--out", str(args.out)]  # fmt: skip
    with piece_log.open("a") as f:
        packed = subprocess.run(pack, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env, timeout=120).returncode
    log(f"{piece}: pack exit {packed}")
    summary_path = args.out / f"gpu-study-{piece}.json"
    units = json.loads(summary_path.read_text()).get("units", []) if summary_path.is_file() else []
    for u in units:
        log(f"{piece}: {u['what']}: {u.get('status')}; predicted {u.get('predicted_s')} s (compile "
            f"{u.get('compile_s', 0)}), wall {u.get('wall_s', '-')} s")  # fmt: skip
    kept = ("what", "status", "predicted_s", "compile_s", "wall_s")
    return dict(name=piece, status=status or packed, wall_s=round(wall, 1),
                units=[{k: u.get(k) for k in kept} for u in units])  # fmt: skip


# ---------------------------------------------------------------- 4. the Inductor cache, 5. the plan


def tar_cache(out: Path, folder: Path, slug: str, log: Log, limit_mib: float = FILE_MIB) -> str | None:
    """OUT/inductor-cache.tar.gz of this GPU's cache folder, under inductor/SLUG/, in one file of at most `limit_mib`:
    every entry, else without Triton's intermediate files, else Inductor's graph caches alone; which fitted, or None."""
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    if not files:
        log(f"inductor cache: nothing compiled here ({folder}); no tar")
        return None
    tiers = {
        "every entry": files,
        "without Triton's intermediate files": [p for p in files if p.suffix not in TRITON_STEPS],
        "Inductor's graph caches alone": [p for p in files if p.relative_to(folder).parts[0] in GRAPH_CACHES],
    }  # fmt: skip
    path = out / "inductor-cache.tar.gz"
    for tier, chosen in tiers.items():
        if not chosen:
            continue
        with tarfile.open(path, "w:gz") as tar:
            for p in chosen:
                tar.add(p, arcname=f"inductor/{slug}/{p.relative_to(folder)}")
        size = path.stat().st_size
        if size <= limit_mib * 2**20:
            log(f"inductor cache: {path.name}, {size / 2**20:.1f} MiB, {tier} ({len(chosen)} of {len(files)} files; "
                "carry it as inductor-cache.tar.gz at the tree's root)")  # fmt: skip
            return tier
    path.unlink()
    log(f"inductor cache: even its graph caches alone are over {limit_mib} MiB; not kept")
    return None


def plan(results: Path, log: Log) -> dict:
    """The next real session on the `gpu` preset (gpu_plan.plan) at the rates last measured on a GPU (LAST_RATES) or
    else the H200's of 2026-12-04, logged."""
    from engine.runtime import gpu_plan
    from engine.runtime.gpu_rates import Rates

    out = gpu_plan.plan(results, Rates.load(LAST_RATES, "gpu"))
    log(f"the next real session (gpu preset, {results}): {out['piece'] or 'nothing fits'}; weighed {out['weighed']}")
    log(f"rates: {out['rates']['source']}")
    return out


def plan_lines(p: dict) -> list[str]:
    """The plan as it is printed last: each piece left with its parts, then `plan: N s of device time (...)`."""
    lines = []
    for piece, seconds in p["pieces"].items():
        parts = p["pieces_parts"][piece]
        why = p["outside"].get(piece) or p["waiting"].get(piece)
        lines.append(f"  {piece}: {seconds} s ({', '.join(f'{k} {v:.0f}' for k, v in parts.items())})"
                     + (f"; {why}" if why else ""))  # fmt: skip
    s, within = p["parts"], "within" if p["total_s"] <= SESSION_S else "OVER"
    lines.append(f"plan: {p['total_s']} s of device time (start-up {s['start']}, calibration {s['calibration']} + "
                 f"compile {s['calibration_compile']}, {p['piece'] or 'no piece'} {s['piece']} (of which compile "
                 f"{p['piece_parts'].get('compile', 0):.0f}), pack {s['pack']}, margin {s['margin']}; {within} the "
                 f"{SESSION_S} s a session plans for)")  # fmt: skip
    return lines


# ---------------------------------------------------------------- the session


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="on the CPU at gpu-smoke size, into a scratch folder")
    ap.add_argument("--calibrate-only", action="store_true", help="the calibration, no piece (dev/checks/gpu-check.sh)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--limit", type=float, default=520, help="the command's seconds (gpu-session.sh: its own less 20)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out)
    summary: dict = dict(started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), dry_run=args.dry_run)
    path = args.out / "gpu-session.json"

    def save() -> None:
        path.write_text(json.dumps(summary, indent=1, default=str))

    import torch

    from engine.core.train import compile_wanted
    from engine.runtime.gpu_plan import choose

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
    slug = cache_slug(args.device)
    cache = use_cache(slug, log)
    summary["plan"] = plan(REPO / "cached_results", log)  # the next real session's, before anything can cut this short
    compiling = compile_wanted(args.device)
    summary["compile"] = dict(mode="compiled" if compiling else "eager")
    save()
    try:
        summary["calibration"], rates = calibrate(args.preset, args.device, log)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"[:600]
        if not compiling:
            summary["calibration"] = dict(error=error)
            log(f"calibration failed: {error}")
            save()
            return 1
        log(f"calibration: the compiled path failed ({error.splitlines()[0][:300]}); the session goes on eager "
            "(LOOPSCOPE_COMPILE=0), its calibration run again and its piece planned at the eager rates")  # fmt: skip
        summary["compile"] = dict(mode="eager", failed=error)
        os.environ["LOOPSCOPE_COMPILE"] = "0"  # this process and the piece's
        torch._dynamo.reset()
        save()
        try:
            summary["calibration"], rates = calibrate(args.preset, args.device, log)
        except Exception as again:
            summary["calibration"] = dict(error=f"{type(again).__name__}: {again}"[:600])
            log(f"calibration failed eager too: {summary['calibration']['error']}")
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
            summary["piece"] = run_piece(piece, args, rates_path, left, log)
            status = summary["piece"]["status"]
            save()
    summary["inductor_cache"] = tar_cache(args.out, cache, slug, log)
    summary["wall_s"] = round(elapsed(), 1)
    files = sorted(p.name for p in args.out.iterdir())
    summary["files"] = files
    save()
    if len(files) > MAX_FILES:
        log(f"OUT holds {len(files)} files, over the {MAX_FILES} that come back: {files}")
        status = status or 1
    log(f"session: {elapsed():.0f} s ({summary['compile']['mode']}); OUT: {len(files)} files")
    print("\n".join(plan_lines(summary["plan"])), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
