"""Engine vs llama.cpp server vs HF transformers on the same GGUF, on this machine.

    python benchmarks/engine_vs_peers.py --build-only     # make peers: build llama-server
    python benchmarks/engine_vs_peers.py                  # make bench-engine: the comparison

llama-server is built from the llama.cpp sources vendored in the llama-cpp-python source
distribution on PyPI (peers/, gitignored; about 10 minutes on two cores). Every server gets the
same load (swarmfactory.bench.serving: seeded random-token prompts of --input-len tokens,
--output-len tokens each with ignore_eos, streaming, warmup, one closed-loop run per
concurrency level); HF transformers' fp32 ``generate`` is timed at the same batch sizes.
Prints a table and writes JSON. Not a test and not part of the default install or CI.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarmfactory.bench.serving import bench_sync, make_prompts  # noqa: E402
from swarmfactory.engine.gguf_loader import bundled_model_path  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(cmd: list[str], cwd: Path | None = None) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, cwd=cwd, check=True)


# CMake switches per llama.cpp build: "native" tunes for this CPU (-march=native); "avx2" is
# what an AVX2 machine without AVX-512 runs (explicit ISA options, no -march=native), for
# emulating such a machine on an AVX-512 one.
LLAMA_ISA_FLAGS = {
    "native": ["-DGGML_NATIVE=ON"],
    "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
             "-DGGML_F16C=ON", "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF",
             "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF"],
}


def build_llama_server(peers: Path, jobs: int, isa: str = "native") -> Path:
    """peers/llama-server (or llama-server-<isa>), built once from the llama-cpp-python sdist."""
    suffix = "" if isa == "native" else f"-{isa}"
    binary = peers / f"llama-server{suffix}"
    if binary.exists():
        return binary
    peers.mkdir(parents=True, exist_ok=True)
    sdists = glob.glob(str(peers / "sdist" / "llama_cpp_python-*.tar.gz"))
    if not sdists:
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "llama-cpp-python",
             "-d", str(peers / "sdist")])
        sdists = glob.glob(str(peers / "sdist" / "llama_cpp_python-*.tar.gz"))
    sdist = sorted(sdists)[-1]
    src = peers / "src"
    if not src.exists():
        log(f"unpacking {Path(sdist).name}")
        with tarfile.open(sdist) as tf:
            tf.extractall(src, filter="data")
    llama = next(Path(p) for p in glob.glob(str(src / "*" / "vendor" / "llama.cpp")))
    build = f"build{suffix}"
    run(["cmake", "-B", build, "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release", *LLAMA_ISA_FLAGS[isa],
         "-DLLAMA_BUILD_TESTS=OFF"], cwd=llama)
    run(["cmake", "--build", build, "--target", "llama-server", "-j", str(jobs)], cwd=llama)
    built = next(Path(p) for p in glob.glob(str(llama / build / "bin" / "llama-server")))
    binary.symlink_to(built.relative_to(peers))  # the binary finds its shared libraries by rpath
    (peers / f"llama-server{suffix}.version").write_text(f"{Path(sdist).name} {' '.join(LLAMA_ISA_FLAGS[isa])}\n")
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, cmd: list[str], url: str, log_path: Path):
        log("$ " + " ".join(cmd))
        self.url = url
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"server exited (see {log_path})")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"server did not become healthy (see {log_path})")

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


def _busy_s() -> float:
    """CPU-seconds this machine has spent not idle (all processes), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def wait_quiet(limit_s: float, share: float = 0.1, window_s: float = 3.0) -> float:
    """Wait up to limit_s for a window in which other work used under ``share`` of the CPUs;
    returns the share seen last (our servers are idle while this runs)."""
    deadline = time.time() + limit_s
    while True:
        b0 = _busy_s()
        time.sleep(window_s)
        seen = (_busy_s() - b0) / (window_s * (os.cpu_count() or 1))
        if seen < share or time.time() >= deadline:
            return round(seen, 3)


def sweep(url: str, levels: list[int], args, pid: int | None = None, level_index: int = 0) -> list[dict]:
    """One bench level at a time. Records the CPU share other work on the machine took during
    the level (``others_cpu_share``: all busy CPU time less the server's and this process's,
    over wall time x CPUs) and the 1-minute load average, so a disturbed run shows."""
    out = []
    for i, c in enumerate(levels, start=level_index):
        n = args.num_prompts or max(8, 2 * c)
        for attempt in range(1 + args.retries):
            before_quiet = wait_quiet(args.quiet_wait) if args.quiet_wait else None
            b0, s0, o0, t0 = _busy_s(), _proc_cpu_s(pid) if pid else 0.0, sum(os.times()[:2]), time.time()
            res = bench_sync(url, [c], input_len=args.input_len, output_len=args.output_len, num_prompts=n,
                             seed=args.seed + 100 * i, warmup=2 if i == 0 else 1)
            wall = time.time() - t0
            mine = (_proc_cpu_s(pid) - s0 if pid else 0.0) + sum(os.times()[:2]) - o0
            lv = res["levels"][0]
            lv["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
            lv["others_cpu_share"] = round(max(0.0, _busy_s() - b0 - mine) / (wall * (os.cpu_count() or 1)), 3)
            lv["others_cpu_share_before"] = before_quiet
            lv["attempt"] = attempt + 1
            log(f"  c={c}: {lv['output_tok_s']:.1f} tok/s  TTFT {lv['ttft_ms_median']:.0f} ms  "
                f"TPOT {lv['tpot_ms_median']:.1f} ms  errors {lv['errors']}  others {lv['others_cpu_share']:.0%}")
            if lv["others_cpu_share"] <= args.max_others:
                break
            log(f"  other work took {lv['others_cpu_share']:.0%} of the CPUs during the level; measuring it again")
        out.append(lv)
    return out


def bench_hf(gguf: Path, levels: list[int], args) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    gen = dict(do_sample=False, pad_token_id=model.config.pad_token_id or 0)
    out = []
    with torch.inference_mode():
        warm = torch.tensor(make_prompts(1, 16, 0))
        model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=4, min_new_tokens=4, **gen)
        for i, b in enumerate(levels):
            x = torch.tensor(make_prompts(b, args.input_len, args.seed + 100 * i))
            mask = torch.ones_like(x)  # equal lengths: no padding
            t0 = time.perf_counter()
            model.generate(x, attention_mask=mask, max_new_tokens=1, min_new_tokens=1, **gen)
            ttft = time.perf_counter() - t0
            t0 = time.perf_counter()
            model.generate(x, attention_mask=mask, max_new_tokens=args.output_len, min_new_tokens=args.output_len,
                           **gen)
            total = time.perf_counter() - t0
            lv = {"concurrency": b, "output_tok_s": b * args.output_len / total, "ttft_ms_median": ttft * 1e3,
                  "tpot_ms_median": (total - ttft) / (args.output_len - 1) * 1e3, "errors": 0,
                  "loadavg_1m_after": round(os.getloadavg()[0], 2),
                  "note": "batch of b prompts in one generate() call"}
            log(f"  b={b}: {lv['output_tok_s']:.1f} tok/s  TTFT {lv['ttft_ms_median']:.0f} ms  "
                f"TPOT {lv['tpot_ms_median']:.1f} ms")
            out.append(lv)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", type=Path, default=ROOT / "peers")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--llama-isa", default="native", choices=sorted(LLAMA_ISA_FLAGS),
                    help="llama.cpp build to compare with (avx2: no AVX-512, for an emulated AVX2 machine)")
    ap.add_argument("--formats", default="q4_1,bf16,fp32")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-prompts", type=int, default=0, help="per level (default: max(8, 2 x concurrency))")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--skip", default="", help="comma list of: llama.cpp, hf, engine")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "engine_vs_peers.json")
    ap.add_argument("--quiet-wait", type=float, default=0.0,
                    help="before each level, wait up to this many seconds for other work to use < 10%% of the CPUs")
    ap.add_argument("--rounds", type=int, default=1, help="alternate the systems this many times")
    ap.add_argument("--max-others", type=float, default=1.0,
                    help="measure a level again when other work took more than this share of the CPUs")
    ap.add_argument("--retries", type=int, default=0, help="at most this many repeats of a disturbed level")
    args = ap.parse_args()

    llama = build_llama_server(args.peers, args.threads, args.llama_isa)
    if args.build_only:
        log(f"llama-server ready: {llama}")
        return 0
    gguf = bundled_model_path()
    levels = [int(x) for x in args.concurrency.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    max_c = max(levels)
    ctx = args.input_len + args.output_len + 16
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = args.out.parent
    from swarmfactory.hardware import MASK_ENV, cpu_features, cpu_fingerprint

    host = cpu_features(mask=None)
    results: dict = {"machine": {"cpu": cpu_fingerprint()["model"], "threads": args.threads,
                                 "cores": os.cpu_count(),
                                 "simd": sorted(f for f in host if f.startswith(("avx", "amx", "fma", "f16c"))),
                                 "mask": {k: os.environ[k] for k in (MASK_ENV, "ATEN_CPU_CAPABILITY",
                                                                     "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
                                          if k in os.environ}},
                     "model": gguf.name, "input_len": args.input_len, "output_len": args.output_len,
                     "systems": {}}

    # Every server runs from the start (idle when not measured); each level is measured for
    # every system in turn, the order reversed every other round (ABBA), so slow drifts in what
    # else runs on the machine hit all systems alike.
    servers: dict[str, Proc] = {}
    try:
        if "llama.cpp" not in skip:
            port = free_port()
            log("starting llama.cpp server")
            servers[f"llama.cpp (Q4_1 file, {args.llama_isa} build)"] = Proc(
                [str(llama), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
                 "-tb", str(args.threads), "-np", str(max_c), "-c", str(max_c * ctx), "--no-warmup"],
                f"http://127.0.0.1:{port}", logs / "llama-server.log")
        if "engine" not in skip:
            for fmt in args.formats.split(","):
                port = free_port()
                log(f"starting engine {fmt}")
                servers[f"engine {fmt}"] = Proc(
                    [sys.executable, "-m", "swarmfactory.engine.cli", "serve", "--weights", fmt, "--port", str(port),
                     "--max-batch", str(max_c), "--max-seq-len", str(ctx), "--threads", str(args.threads)],
                    f"http://127.0.0.1:{port}", logs / f"engine-{fmt}.log")
        for r in range(args.rounds):
            tag = f" (round {r + 1})" if args.rounds > 1 else ""
            for i, c in enumerate(levels):
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in order:
                    log(f"{name}{tag}")
                    lv = sweep(servers[name].url, [c], args, servers[name].p.pid, level_index=i)[0]
                    results["systems"].setdefault(name + tag, []).append(lv)
    finally:
        for proc in servers.values():
            proc.stop()

    if "hf" not in skip:
        log("HF transformers fp32 generate")
        results["systems"]["HF transformers fp32 generate"] = bench_hf(gguf, levels, args)

    args.out.write_text(json.dumps(results, indent=2))
    print(table(results, levels))
    log(f"wrote {args.out}")
    return 0


def table(results: dict, levels: list[int]) -> str:
    head = ("| system | " + " | ".join(f"c={c} tok/s | TTFT ms | TPOT ms" for c in levels)
            + " | max load | others' CPU |")
    sep = "|---|" + "---|---|---|" * len(levels) + "---|---|"
    rows = [head, sep]
    for name, lvs in results["systems"].items():
        by = {lv["concurrency"]: lv for lv in lvs}
        cells = []
        for c in levels:
            lv = by.get(c)
            cells.append("n/a | n/a | n/a" if lv is None else
                         f"{lv['output_tok_s']:.1f} | {lv['ttft_ms_median']:.0f} | {lv['tpot_ms_median']:.1f}")
        load = max((lv.get("loadavg_1m_after", 0) for lv in lvs), default=0)
        others = max((lv.get("others_cpu_share", 0) for lv in lvs), default=0)
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {load:.1f} | {others:.0%} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
