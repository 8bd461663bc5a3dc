"""Which piece of the GPU study a device session runs, and what each piece is predicted to cost (issue 59).

A device session (dev/checks/gpu-session.sh) is one command of COMMAND_S seconds: a calibration (CALIBRATION_S of
timed passes after the compilation it measures), then one piece in its own process, then RESERVE_S for the pack,
the Inductor cache and the plan. units() lists what a piece would run from the store as it is, each unit predicted
as engine.runtime.gpu_study predicts it before starting it (the same Rates methods, the process's start-up and its
compilation once), so a piece chosen here is not refused when it starts. choose() takes the first piece of ORDER
that can run now (`e3` waits until E2's norm-trained group is stored) and fits what is left; a piece that could not
fit a session whose calibration takes all its time is named outside the session in the plan's output.
"""

from __future__ import annotations

from pathlib import Path

from engine.core.presets import preset, study_root
from engine.core.store import Store
from engine.runtime import gpu_study as gs
from engine.runtime.gpu_rates import PROCESS_S, Rates

ORDER = ("norm", "none", "e3", "chain-c1", "chain-c2")  # the GPU's part (the ladder runs on the CPU: cpu_ladder)
COMMAND_S, KILL_S = 540, 20  # one command: 9 of the device tool's 10 minutes; the session's own limit is 20 s less
CALIBRATION_S = 60  # the calibration's timed passes, after the compilation its warm-up measures
RESERVE_S = 40  # of the command, kept after the piece's limit for its pack, the cache's tar and the plan
START_S, PACK_S, MARGIN_S = 150, 30, 30  # the plan's start-up (1-2 min measured), pack and tar, give-back margin
SESSION_S = 780  # the device time one session may plan for (15 minutes less what a session cannot use)


def state(piece: str, preset_name: str, store: Store) -> str:
    """'todo', 'done', or why the piece cannot run yet (one sentence)."""
    from engine.experiments import e3, e5

    norm = preset(preset_name, "parity", "norm")
    if piece in ("norm", "none"):
        cfg = preset(preset_name, "parity", piece)
        seeds = cfg.group(0)
        steps = ["surgery", "rescale"] if piece == "norm" else ["surgery"]
        todo = gs.needs(store, cfg, seeds, preset_name, steps)
        todo = todo or (piece == "norm" and gs.needs(store, cfg, e5.seeds_for(preset_name, cfg, seeds), preset_name,
                                                     ["rescale"]))  # fmt: skip
        return "todo" if todo else "done"
    if piece == "e3":
        keys = [norm.run_key(s) for s in norm.group(0)]
        if not e3.missing_refits(keys, e3.refit_config(preset_name), store):
            return "done"
        if any(store.status(k) != "ok" for k in keys):
            return "waits for the norm piece: E3 refits E2's norm-trained group, which is not stored yet"
        return "todo"
    done = gs.chain_results(store)
    if piece == "chain-c2" and gs.adopted(done) == "C1":
        return "done"
    return "done" if piece.split("-")[1].upper() in done else "todo"


def units(piece: str, preset_name: str, store: Store, rates: Rates) -> list[tuple[str, float, bool]]:
    """What the piece would run, in order, from what the store holds: (what, predicted seconds, whether it trains:
    the first unit that trains pays the process's compile seconds). E3's refits inside `norm` are left out: they run
    only when they fit, else the `e3` piece computes them, from a group it trains again (as it will have to once a
    session packed the group without its weights). chain-c1's training is its least: a quantum of steps (it then
    trains as many as fit what is left)."""
    from engine.experiments import e3, e5

    ref = preset(preset_name, "parity", "norm")
    out: list[tuple[str, float, bool]] = []
    if piece in ("norm", "none"):
        cfg = preset(preset_name, "parity", piece)
        seeds = cfg.group(0)
        if gs.needs(store, cfg, seeds, preset_name, ["surgery"]):
            out.append((f"E2 {piece}-trained", rates.trained_s(cfg, len(seeds), ref, piece == "norm"), True))
        ladder = e5.seeds_for(preset_name, cfg, seeds)
        if piece == "norm" and gs.needs(store, cfg, ladder, preset_name, ["rescale"]):
            if gs.weightless(store, [cfg.run_key(s) for s in seeds]):
                out.append(("E2 norm-trained, retrained", rates.trained_s(cfg, len(seeds), ref), True))
            out.append(("the rescale surgery", rates.rescale_s(cfg, len(ladder), ref), False))
        return out
    if piece == "e3":
        seeds, refit = ref.group(0), e3.refit_config(preset_name)
        refits = rates.refits_s(ref, len(seeds), refit.targets, refit.schedule, ref)
        keys = [ref.run_key(s) for s in seeds]  # not stored yet: it will be weightless once a session packs it
        if gs.weightless(store, keys) or any(store.status(k) != "ok" for k in keys):
            return [("E2 norm-trained again, then E3's refits", rates.trained_s(ref, len(seeds), ref) + refits, True)]
        return [("E3's refits", refits, False)]
    members = len(gs.CHAIN_SEEDS)
    if piece == "chain-c1":
        draft = gs.chain_candidates(preset_name, 100)["C1"]
        per_step = rates.train_s(draft, members, ref, 1000) / 1000  # the candidate's mix, as the probe scales it
        return [("C1's probe", rates.train_s(draft, members, ref, gs.PROBE_STEPS), True),
                (f"C1's least training ({gs.C1_QUANTUM} steps), its evaluation and margin",
                 gs.C1_QUANTUM * per_step + gs.C1_RESERVE_S, False)]  # fmt: skip
    cfg = gs.chain_candidates(preset_name, 100)["C2"]
    return [(f"C2 ({cfg.train.steps} steps)", rates.train_s(cfg, members, ref) + rates.evals_s(cfg, members, 1, ref),
             True)]  # fmt: skip


def parts(piece: str, preset_name: str, store: Store, rates: Rates) -> dict[str, float]:
    """The piece's prediction part by part: its process's start-up, its compile seconds (once), each unit."""
    found = units(piece, preset_name, store, rates)
    compile_s = rates.compile_s if any(trains for _, _, trains in found) else 0.0
    return {"start-up": PROCESS_S, "compile": compile_s, **{what: s for what, s, _ in found}}


def predict(piece: str, preset_name: str, results: Path, rates: Rates) -> float:
    """Seconds the piece is predicted to take at `rates`, what the store at `results` holds already not counted."""
    return sum(parts(piece, preset_name, Store(study_root(results, preset_name)), rates).values())


def most_s(rates: Rates) -> float:
    """The most a piece gets of any session: the command less the kill margin, the calibration (its compilation
    included) and the reserve."""
    return COMMAND_S - KILL_S - CALIBRATION_S - rates.compile_s - RESERVE_S


def choose(preset_name: str, results: Path, rates: Rates, left_s: float) -> tuple[str | None, list[dict]]:
    """The first piece of ORDER that can run now and is predicted to fit `left_s`, and what was weighed (a piece
    that does not fit and could not fit a session's whole command named outside the session)."""
    store, weighed = Store(study_root(results, preset_name)), []
    for piece in ORDER:
        now = state(piece, preset_name, store)
        if now != "todo":
            weighed.append(dict(piece=piece, status=now))
            continue
        seconds = sum(parts(piece, preset_name, store, rates).values())
        weighed.append(dict(piece=piece, predicted_s=round(seconds, 1), fits=seconds <= left_s))
        if seconds <= left_s:
            return piece, weighed
        if seconds > most_s(rates):
            weighed[-1]["status"] = outside(seconds, rates)
    return None, weighed


def outside(seconds: float, rates: Rates) -> str:
    return (f"outside the session: predicted {seconds:,.0f} s, more than the {most_s(rates):.0f} s a session's "
            f"command leaves any piece")  # fmt: skip


def plan(results: Path, rates: Rates) -> dict:
    """The next real session on the `gpu` preset at `rates`: start-up, calibration and its compilation, the piece that
    fits, pack and margin, each part's prediction; every piece left with its prediction, and those outside."""
    piece, weighed = choose("gpu", results, rates, most_s(rates))
    store = Store(study_root(results, "gpu"))
    piece_parts = {k: round(v, 1) for k, v in parts(piece, "gpu", store, rates).items()} if piece else {}
    seconds = sum(piece_parts.values())
    session = dict(start=START_S, calibration=CALIBRATION_S, calibration_compile=round(rates.compile_s),
                   piece=round(seconds), pack=PACK_S, margin=MARGIN_S)  # fmt: skip
    states = {p: state(p, "gpu", store) for p in ORDER}
    left = {p: parts(p, "gpu", store, rates) for p, now in states.items() if now != "done"}
    total = {p: sum(v.values()) for p, v in left.items()}
    return dict(piece=piece, piece_s=round(seconds, 1), piece_parts=piece_parts, parts=session,
                total_s=round(sum(session.values())), pieces={p: round(s) for p, s in total.items()},
                pieces_parts={p: {k: round(s, 1) for k, s in v.items()} for p, v in left.items()},
                waiting={p: now for p, now in states.items() if now not in ("todo", "done")},
                outside={p: outside(s, rates) for p, s in total.items() if s > most_s(rates)},
                weighed=weighed, rates=rates.to_dict())  # fmt: skip
