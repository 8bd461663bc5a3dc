"""The placement checks of the GPU engine in one bounded run (dev/checks/gpu-check.sh starts it after the session's
calibration, which measures what the study runs: dev/checks/gpu_session.py).

Each stage writes its result into OUT/gpu-check.json as soon as it ends, so a run stopped by its time limit
keeps what it measured; the exit status is 1 when any stage failed. Stages:
  env        the GPU, driver, CUDA, cuDNN, torch (engine.core.store.gpu_info)
  placement  `loopscope run e2 --preset smoke` on the device, twice into two folders: tables and weights
             bit-identical, evaluation on the device (manifest: dtype policy, GPU provenance, eval seconds);
             `eval` of a run, `run e3`, `verify` on the same GPU (read from its whole output, not a tail)
  bench      (--bench) every throughput lever of `loopscope bench --device cuda`; off by default: at the `paper`
             preset it measures batch 256 and chain with 16 seeds, which the study does not run (issue 45)
  readout    dev/studies/e1-readout/readout_check.py (E1's released exit rule) on this device, when present
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def sh(*args: str, timeout: int = 300) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)  # fmt: skip
    out = {"rc": done.returncode, "s": round(time.perf_counter() - t0, 1), "tail": (done.stdout + done.stderr)[-600:]}
    return out | {"stdout": done.stdout}  # the whole of stdout: what a check reads (tqdm fills the tail of stderr)


def digests(root: Path) -> dict[str, str]:
    """sha256 of every table and every run's weights and rows (not manifests: they hold times and hosts)."""
    files = [*root.glob("*.parquet"), *root.glob("runs/*/model-*"), *root.glob("runs/*/rows-*")]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files)}


def placement(device: str) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        out["e2_first"] = sh("run", "e2", "--preset", "smoke", "--seeds", "4", "--device", device, "--results", a)
        out["e2_again"] = sh("run", "e2", "--preset", "smoke", "--seeds", "4", "--device", device, "--results", b)
        da, db = digests(Path(a)), digests(Path(b))
        out["bit_identical"] = bool(da) and da == db
        out["files_compared"] = len(da)
        m = json.loads(next(Path(a).glob("runs/*/manifest.json")).read_text())
        out["manifest"] = {k: m.get(k) for k in ("device", "dtype_policy", "gpu", "eval_wall_s", "wall_time_s",
                                                 "peak_memory_gib", "estimated_memory_gib")}  # fmt: skip
        key = m["run_key"]
        out["eval"] = sh("eval", key, "--loops", "1-12", "--device", device, "--results", a)
        out["e3"] = sh("run", "e3", "--preset", "smoke", "--seeds", "4", "--device", device, "--results", a)
        out["verify"] = sh("verify", "e2", "--preset", "smoke", "--seeds", "2", "--task", "parity", "--boundary",
                           "norm", "--device", device, "--results", a)  # fmt: skip
        out["verify"]["bit_for_bit"] = "verified: bit for bit" in out["verify"].pop("stdout")
        out["bit_identical"] = out["bit_identical"] and all(out[k]["rc"] == 0 for k in ("e2_first", "e2_again"))
        for k in ("e2_first", "e2_again", "eval", "e3"):
            out[k].pop("stdout", None)
        demo = str(REPO / "cached_results" / "e1-demo")  # E1's probe on the device, the released readout
        out["ouro"] = sh("ouro", "--model", demo, "--device", device, "--readout", "released", "--task", "parity",
                         "--difficulty", "parity=12", "--loops", "1-8", "--results", a)  # fmt: skip
        probes = [json.loads(p.read_text()) for p in Path(a).glob("e1*.json")]
        out["ouro"].pop("stdout", None)
        out["ouro"]["readout_device"] = [m.get("readout_device") for m in probes]
    return out


def e2_wall(bench: dict, size: str) -> dict:
    """Paper-preset E2 (2 tasks x 2 modes x 16 seeds) at the best measured grouped rate, and its floor at the peak."""
    from engine.core.flops import training_flops
    from engine.core.presets import preset

    peak = bench["bf16_peak_tflops"] * 1e12
    out = {}
    for task in ("parity", "chain"):
        cfg = preset(size, task)
        flops = 2 * training_flops(cfg, 16)  # both modes
        rates = [r["mfu"] for k, hows in bench.get(task, {}).items() if k != "eval" and k != "1"
                 for r in hows.values() if "mfu" in r]  # fmt: skip
        best = max(rates, default=None)
        ev = bench.get(task, {}).get("eval", {}).get("group_eval_estimate_s")
        out[task] = {
            "floor_min": flops / peak / 60,
            "best_grouped_mfu": best,
            "at_measured_min": flops / peak / best / 60 if best else None,
            "eval_min_per_group": ev / 60 if ev else None,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="paper", help="the bench's preset (smoke: a dry run on the CPU)")
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bench", action="store_true", help="also every lever of `loopscope bench` at --size")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "size": args.size}

    def save():
        (out_dir / "gpu-check.json").write_text(json.dumps(result, indent=1, default=str))

    def stage(name, fn):
        t0 = time.perf_counter()
        print(f"[gpu-check] {name} ...", flush=True)
        try:
            result[name] = fn()
        except Exception as e:  # a stage's failure is a result; the next stage still runs
            result[name] = {"error": f"{type(e).__name__}: {e}"[:800]}
        result.setdefault("stage_s", {})[name] = round(time.perf_counter() - t0, 1)
        save()
        print(f"[gpu-check] {name}: {json.dumps(result[name], default=str)[:1500]}", flush=True)

    import torch

    from engine.core.store import gpu_info
    from engine.runtime import bench

    stage("env", lambda: {"torch": torch.__version__, "python": sys.version.split()[0],
                          **(gpu_info() if args.device == "cuda" else {"device": "cpu"})})  # fmt: skip
    stage("placement", lambda: placement(args.device))

    def run_bench():
        def partial(r):
            result["bench"] = r
            save()

        r = bench.run_device(args.device, True, 10, args.seeds, args.size, partial)
        print(bench.format_device_report(r), flush=True)
        return r

    if args.bench:
        stage("bench", run_bench)
        stage("e2_wall", lambda: e2_wall(result["bench"], args.size))
    check = REPO / "dev" / "studies" / "e1-readout" / "readout_check.py"
    if check.exists():

        def readout():
            cmd = [sys.executable, str(check), "--device", args.device, "--out", str(out_dir / "readout.json")]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            return {"rc": done.returncode, "tail": (done.stdout + done.stderr)[-1500:]}

        stage("readout", readout)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    failed = [k for k, v in result.items() if isinstance(v, dict) and ("error" in v or v.get("rc", 0) != 0)]
    failed += [k for k in ("placement",) if isinstance(result.get(k), dict) and not result[k].get("bit_identical")]
    result["failed"] = failed
    save()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
