"""Engine vs llama.cpp server vs HF transformers on the same GGUF, on this machine.

    python benchmarks/engine_vs_peers.py --build-only     # make peers: build llama-server, llama-quantize
    python benchmarks/engine_vs_peers.py                  # make bench-engine: the comparison
    python benchmarks/engine_vs_peers.py --engine-config tuned.yaml   # + a tuned engine design
    python benchmarks/engine_vs_peers.py --model gemma.gguf           # another GGUF for every system
    python benchmarks/engine_vs_peers.py --model smollm2-q4_k_m       # SmolLM2 re-quantised to Q4_K_M

llama-server (and llama-quantize) are built from the llama.cpp sources vendored in the
llama-cpp-python source distribution on PyPI (peers/, gitignored; about 10 minutes on two cores).
--model smollm2-q4_k_m is the bundled SmolLM2-135M-Instruct written out as F32 and re-quantised
to Q4_K_M by llama-quantize (benchmarks/quantize_model.py; made once, into peers/models/).

Load: one closed-loop run per workload (--workloads, default 128 tokens in / 128 out and the
prefill-heavy 1024 in / 128 out) and concurrency level (--concurrency, default 1, 4, 16, 64),
from swarmfactory.bench.serving: seeded random-token prompts, the same for every system,
``ignore_eos`` so every request gives exactly the output length, streaming, warmup first.
Per level: output tok/s, TTFT and TPOT (median and p99). HF transformers' fp32 ``generate``
is timed at the same batch sizes on the same prompts (medians only: one call per batch).

Servers: the engine servers start per workload with max batch >= the largest level and a
context per sequence of input + output + 16 tokens. llama-server gets its best flags per level:
-np = the concurrency (one slot per request), -c = slots x (input + output + 16) so every slot
holds a request, and the -b/-ub pair (--llama-batches) that won a short probe at that level
(--llama-tune, on by default: one wave of requests with at most --llama-probe-out output tokens
per pair); so llama-server restarts at every level. Within a level each system is measured in
turn, the order reversed every other round (--rounds 2: ABBA). The JSON records every level's
metrics, the exact server command line, the probe results, and how much of the CPUs other
work took. --engine-config / --engine-profile add an "engine tuned" column next to the
"engine default" one. Not a test and not part of the default install or CI.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarmfactory import lifecycle  # noqa: E402
from swarmfactory.bench.serving import LEVEL_REPEATS, bench_sync, make_prompts  # noqa: E402
from swarmfactory.contention import BUSY  # noqa: E402
from swarmfactory.engine.gguf_loader import bundled_model_path  # noqa: E402

DEFAULT_CONCURRENCY = "1,4,16,64"
DEFAULT_WORKLOADS = "128x128,1024x128"
# -b:-ub pairs llama-server is probed with per level; the first is llama-server's own default
# and the one used with --no-llama-tune.
DEFAULT_LLAMA_BATCHES = "2048:512,512:128"
CTX_MARGIN = 16  # context tokens per sequence beyond input + output
SMOLLM2_Q4_K_M = "smollm2-q4_k_m"  # --model name: the bundled model re-quantised by llama-quantize


def parse_levels(spec: str) -> list[int]:
    """'1,4,16' -> [1, 4, 16]: positive concurrency levels, in the order given, no repeats."""
    try:
        levels = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"concurrency levels must be integers, got {spec!r}") from None
    if not levels or min(levels) < 1 or len(set(levels)) != len(levels):
        raise ValueError(f"concurrency levels must be distinct integers >= 1, got {spec!r}")
    return levels


def parse_workloads(spec: str) -> list[tuple[int, int]]:
    """'128x128,1024x128' -> [(128, 128), (1024, 128)]: (input tokens, output tokens) pairs."""
    out = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        inp, sep, outp = item.lower().partition("x")
        try:
            pair = (int(inp), int(outp)) if sep else None
        except ValueError:
            pair = None
        if pair is None or pair[0] < 1 or pair[1] < 2:
            raise ValueError(f"workload must be INPUTxOUTPUT with input >= 1 and output >= 2 tokens, got {item!r}")
        if pair in out:
            raise ValueError(f"workload {item!r} given twice")
        out.append(pair)
    if not out:
        raise ValueError("no workload given")
    return out


def parse_batches(spec: str) -> list[tuple[int, int]]:
    """'2048:512,512:128' -> [(2048, 512), (512, 128)]: llama-server (-b, -ub) pairs, ub <= b."""
    out = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        b, sep, ub = item.partition(":")
        try:
            pair = (int(b), int(ub)) if sep else None
        except ValueError:
            pair = None
        if pair is None or not 1 <= pair[1] <= pair[0]:
            raise ValueError(f"llama batch sizes must be B:UB with 1 <= UB <= B, got {item!r}")
        if pair not in out:
            out.append(pair)
    if not out:
        raise ValueError("no llama batch sizes given")
    return out


def seq_ctx(input_len: int, output_len: int) -> int:
    """Context one request needs: its prompt, its output and a margin."""
    return input_len + output_len + CTX_MARGIN


def level_seed(seed: int, input_len: int, level_index: int) -> int:
    """Prompt seed of a level: the same for every system, distinct per level and per input
    length (so no prompt shares a prefix with another workload's)."""
    return seed + 10_000 * input_len + 100 * level_index


def llama_server_cmd(binary: Path | str, gguf: Path | str, port: int, threads: int, slots: int, input_len: int,
                     output_len: int, batch: int, ubatch: int) -> list[str]:
    """llama-server for ``slots`` concurrent requests: one slot each (-np), every slot's share
    of the context (-c / -np) holding a whole request, the given logical / physical batch."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-tb", str(threads), "-np", str(slots), "-c", str(slots * seq_ctx(input_len, output_len)),
            "-b", str(batch), "-ub", str(ubatch), "--no-warmup"]


def engine_cmd(port: int, threads: int, max_batch: int, max_seq_len: int, weights: str | None = None,
               config: Path | str | None = None, profile: str | None = None, no_profile: bool = False,
               model: Path | str | None = None) -> list[str]:
    """``engine serve`` of ``model`` (default: serve's own, the bundled one) sized for the run.
    A profile sets the whole design (weights, threads, batch, context), so with ``profile``
    nothing else but the model is passed; ``no_profile`` adds ``--profile none`` (the untuned
    engine, where serve has that option)."""
    cmd = [sys.executable, "-m", "swarmfactory.engine_cli", "serve", "--port", str(port)]
    if model:
        cmd += ["--model", str(model)]
    if profile:
        return cmd + ["--profile", profile]
    if weights:
        cmd += ["--weights", weights]
    if config:
        cmd += ["--config", str(config)]
    if no_profile:
        cmd += ["--profile", "none"]
    return cmd + ["--max-batch", str(max_batch), "--max-seq-len", str(max_seq_len), "--threads", str(threads)]


def serve_takes_profile() -> bool:
    """Whether this checkout's ``engine serve`` has --profile (tuned profiles)."""
    r = subprocess.run([sys.executable, "-m", "swarmfactory.engine_cli", "serve", "--help"], capture_output=True,
                       text=True, env={**os.environ, "COLUMNS": "200"})
    return r.returncode == 0 and "--profile" in r.stdout


def served_limits(url: str) -> dict:
    """What an engine server actually runs with (a profile may size it differently)."""
    out: dict = {}
    try:
        h = httpx.get(url + "/health", timeout=10).json()
        out = {"max_batch": h.get("max_batch"), "paths": h.get("paths")}
        models = httpx.get(url + "/v1/models", timeout=10).json().get("data") or [{}]
        out["max_model_len"] = models[0].get("max_model_len")
    except (httpx.HTTPError, ValueError):
        pass
    return out


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


def build_llama_tool(peers: Path, jobs: int, target: str, isa: str = "native") -> Path:
    """peers/<target> (or <target>-<isa>): a llama.cpp CMake target (llama-server, llama-quantize),
    built once from the llama-cpp-python sdist in that ISA's build dir and symlinked into peers/."""
    suffix = "" if isa == "native" else f"-{isa}"
    binary = peers / f"{target}{suffix}"
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
    run(["cmake", "--build", build, "--target", target, "-j", str(jobs)], cwd=llama)
    built = next(Path(p) for p in glob.glob(str(llama / build / "bin" / target)))
    binary.symlink_to(built.relative_to(peers))  # the binary finds its shared libraries by rpath
    (peers / f"{target}{suffix}.version").write_text(f"{Path(sdist).name} {' '.join(LLAMA_ISA_FLAGS[isa])}\n")
    return binary


def build_llama_server(peers: Path, jobs: int, isa: str = "native") -> Path:
    """peers/llama-server (or llama-server-<isa>), built once from the llama-cpp-python sdist."""
    return build_llama_tool(peers, jobs, "llama-server", isa)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, cmd: list[str], url: str, log_path: Path):
        log("$ " + shlex.join(cmd))
        self.cmd = cmd
        self.url = url
        self.log = open(log_path, "w")
        # its own process group, adopted: it dies with this benchmark however that ends (a
        # SIGKILL of the benchmark left both servers running)
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        lifecycle.adopt(self.p.pid, f"benchmark server {shlex.join(cmd[:1])}", ledger_too=False)
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.p.poll() is not None:
                lifecycle.release(self.p.pid)
                self.log.close()
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
        lifecycle.release(self.p.pid)
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


def _ms(lv: dict) -> str:
    return (f"{lv['output_tok_s']:.1f} tok/s  TTFT {lv['ttft_ms_median']:.0f} / {lv['ttft_ms_p99']:.0f} ms  "
            f"TPOT {lv['tpot_ms_median']:.1f} / {lv['tpot_ms_p99']:.1f} ms (median / p99)  errors {lv['errors']}")


def measure(proc: Proc, c: int, workload: tuple[int, int], level_index: int, args, warmup: int,
            name: str = "") -> dict:
    """One level on one server. Records the CPU share other work on the machine took during
    the level (``contention``, from swarmfactory.bench.serving: ``others`` is the CPU time of
    processes other than the server, its children and this one, over wall time x CPUs; a level
    over ``contention.BUSY`` is measured again there, at most ``--level-repeats`` times, and
    stays marked ``busy`` if it stays over) and the 1-minute load average, so a disturbed run
    shows. ``others_cpu_share`` is ``contention["others"]`` (where it is unreadable: the
    machine's busy time less the server's and this process's, warmup included); a level over
    --max-others is measured again here too (at most --retries times)."""
    inp, outp = workload
    n = args.num_prompts or max(8, 2 * c)
    pid = proc.p.pid
    for attempt in range(1 + args.retries):
        before_quiet = wait_quiet(args.quiet_wait) if args.quiet_wait else None
        b0, s0, o0, t0 = _busy_s(), _proc_cpu_s(pid), sum(os.times()[:2]), time.time()
        res = bench_sync(proc.url, [c], input_len=inp, output_len=outp, num_prompts=n,
                         seed=level_seed(args.seed, inp, level_index), warmup=warmup, server_pid=pid,
                         repeats=args.level_repeats)
        wall = time.time() - t0
        mine = _proc_cpu_s(pid) - s0 + sum(os.times()[:2]) - o0
        lv = res["levels"][0]
        cont = lv.get("contention") or {}
        lv["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
        lv["others_cpu_share"] = (round(cont["others"], 3) if cont.get("others") is not None else
                                  round(max(0.0, _busy_s() - b0 - mine) / (wall * (os.cpu_count() or 1)), 3))
        lv["others_cpu_share_before"] = before_quiet
        lv["attempt"] = attempt + 1
        lv["server_cmd"] = shlex.join(proc.cmd)
        log(f"  c={c}: {_ms(lv)}  others {lv['others_cpu_share']:.0%}"
            + (f" ({cont['attempts']} attempts)" if cont.get("attempts", 1) > 1 else ""))
        for line in res.get("warnings") or []:
            log(f"  warning: {name + ': ' if name else ''}{line}")
        if lv["others_cpu_share"] <= args.max_others:
            break
        log(f"  other work took {lv['others_cpu_share']:.0%} of the CPUs during the level; measuring it again")
    return lv


def start_llama(binary: Path, gguf: Path, c: int, workload: tuple[int, int], level_index: int, args,
                logs: Path) -> tuple[Proc, dict, bool]:
    """llama-server for level c: -np c, -c fitted, and the (-b, -ub) pair that gave the most
    output tok/s in a short probe (one wave of max(2, c) requests, output capped at
    --llama-probe-out tokens, prompts of their own seed). Returns the server (the probe's last
    one when it won: already warm), what to record, and whether the server is fresh."""
    inp, outp = workload

    def launch(b: int, ub: int) -> Proc:
        port = free_port()
        return Proc(llama_server_cmd(binary, gguf, port, args.threads, c, inp, outp, b, ub),
                    f"http://127.0.0.1:{port}", logs / f"llama-server-{inp}x{outp}-c{c}-b{b}-ub{ub}.log")

    candidates = args.llama_batches if args.llama_tune else args.llama_batches[:1]
    probes: list[dict] = []
    if len(candidates) == 1:
        b, ub = candidates[0]
        return launch(b, ub), {"llama_batch": b, "llama_ubatch": ub, "llama_probe": probes}, True
    probe_out = max(2, min(outp, args.llama_probe_out))
    proc = None
    for b, ub in candidates:
        proc = launch(b, ub)
        try:
            res = bench_sync(proc.url, [c], input_len=inp, output_len=probe_out, num_prompts=max(2, c),
                             seed=level_seed(args.seed, inp, level_index) + 50, warmup=1, server_pid=proc.p.pid,
                             repeats=args.level_repeats)["levels"][0]
        except BaseException:
            proc.stop()
            raise
        probes.append({"batch": b, "ubatch": ub, "output_len": probe_out, "num_prompts": res["num_prompts"],
                       "output_tok_s": res["output_tok_s"], "ttft_ms_median": res["ttft_ms_median"],
                       "tpot_ms_median": res["tpot_ms_median"], "errors": res["errors"],
                       "server_cmd": shlex.join(proc.cmd)})
        log(f"  probe -b {b} -ub {ub}: {res['output_tok_s']:.1f} tok/s  errors {res['errors']}")
        if (b, ub) != candidates[-1]:
            proc.stop()
    best = max(probes, key=lambda p: (p["errors"] == 0, p["output_tok_s"]))
    chosen = {"llama_batch": best["batch"], "llama_ubatch": best["ubatch"], "llama_probe": probes}
    log(f"  llama-server at c={c}: -b {best['batch']} -ub {best['ubatch']}")
    if (best["batch"], best["ubatch"]) == candidates[-1]:
        return proc, chosen, False
    proc.stop()
    return launch(best["batch"], best["ubatch"]), chosen, True


def bench_hf(gguf: Path, levels: list[int], workload: tuple[int, int], args) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    inp, outp = workload
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    gen = dict(do_sample=False, pad_token_id=model.config.pad_token_id or 0)
    out = []
    with torch.inference_mode():
        warm = torch.tensor(make_prompts(1, 16, 0))
        model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=4, min_new_tokens=4, **gen)
        for i, b in enumerate(levels):
            # the first b prompts the servers get at this level
            x = torch.tensor(make_prompts(b, inp, level_seed(args.seed, inp, i) + 1))
            mask = torch.ones_like(x)  # equal lengths: no padding
            t0 = time.perf_counter()
            model.generate(x, attention_mask=mask, max_new_tokens=1, min_new_tokens=1, **gen)
            ttft = time.perf_counter() - t0
            t0 = time.perf_counter()
            model.generate(x, attention_mask=mask, max_new_tokens=outp, min_new_tokens=outp, **gen)
            total = time.perf_counter() - t0
            lv = {"concurrency": b, "output_tok_s": b * outp / total, "ttft_ms_median": ttft * 1e3,
                  "tpot_ms_median": (total - ttft) / (outp - 1) * 1e3, "errors": 0,
                  "loadavg_1m_after": round(os.getloadavg()[0], 2),
                  "note": "batch of b prompts in one generate() call (no p99: one call)"}
            log(f"  b={b}: {lv['output_tok_s']:.1f} tok/s  TTFT {lv['ttft_ms_median']:.0f} ms  "
                f"TPOT {lv['tpot_ms_median']:.1f} ms")
            out.append(lv)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", type=Path, default=ROOT / "peers")
    ap.add_argument("--model", type=Path, default=None,
                    help="GGUF file every system runs (default: the bundled SmolLM2-135M-Instruct), or "
                         f"{SMOLLM2_Q4_K_M}: that model re-quantised to Q4_K_M by llama-quantize (made once "
                         "under --peers/models by benchmarks/quantize_model.py)")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--llama-isa", default="native", choices=sorted(LLAMA_ISA_FLAGS),
                    help="llama.cpp build to compare with (avx2: no AVX-512, for an emulated AVX2 machine)")
    ap.add_argument("--formats", default=None,
                    help="engine weight formats to serve (default q4_1,bf16,fp32; q4_1 alone when a tuned "
                         "engine is given)")
    tuned_ap = ap.add_mutually_exclusive_group()
    tuned_ap.add_argument("--engine-config", type=Path, default=None,
                          help="EngineConfig YAML of a tuned design, served as 'engine tuned' (engine serve "
                               "--config; same --threads, its max_batch / max_seq_len raised where the run needs "
                               "more)")
    tuned_ap.add_argument("--engine-profile", default=None,
                          help="profile id of a tuned design, served as 'engine tuned' (engine serve --profile ID "
                               "alone: the profile sets threads, batch and context; the JSON records what it "
                               "served)")
    ap.add_argument("--concurrency", default=DEFAULT_CONCURRENCY, help=f"levels (default {DEFAULT_CONCURRENCY})")
    ap.add_argument("--workloads", default=None,
                    help=f"INPUTxOUTPUT token lengths, comma-separated (default {DEFAULT_WORKLOADS})")
    ap.add_argument("--input-len", type=int, default=None,
                    help="with --output-len: one workload, INPUTxOUTPUT (each defaults to 128)")
    ap.add_argument("--output-len", type=int, default=None, help="see --input-len")
    ap.add_argument("--num-prompts", type=int, default=0, help="per level (default: max(8, 2 x concurrency))")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="threads of every system")
    ap.add_argument("--skip", default="",
                    help="comma list of: llama.cpp, hf, engine (the default engine; a tuned one still runs)")
    ap.add_argument("--llama-tune", action=argparse.BooleanOptionalAction, default=True,
                    help="probe llama-server's -b:-ub pairs at every level and keep the fastest (default on; "
                         "off: the first pair)")
    ap.add_argument("--llama-batches", default=DEFAULT_LLAMA_BATCHES,
                    help=f"llama-server -b:-ub pairs to probe (default {DEFAULT_LLAMA_BATCHES})")
    ap.add_argument("--llama-probe-out", type=int, default=32,
                    help="output tokens per probe request (default 32; at most the workload's)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "engine_vs_peers.json")
    ap.add_argument("--quiet-wait", type=float, default=0.0,
                    help="before each level, wait up to this many seconds for other work to use < 10%% of the CPUs")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure each level this many times per system, the order reversed every other round")
    ap.add_argument("--max-others", type=float, default=1.0,
                    help="measure a level again when other work took more than this share of the CPUs")
    ap.add_argument("--retries", type=int, default=0, help="at most this many repeats of a disturbed level")
    ap.add_argument("--level-repeats", type=int, default=LEVEL_REPEATS,
                    help=f"a level on which other processes took over {BUSY * 100:.0f}%% of the CPUs is measured "
                         f"again up to this many times (default {LEVEL_REPEATS}), then kept and marked busy")
    args = ap.parse_args()
    # a SIGTERM (timeout, kill) unwinds like Ctrl-C, so the finally blocks stop the servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    try:
        levels = parse_levels(args.concurrency)
        if args.input_len is not None or args.output_len is not None:
            if args.workloads is not None:
                raise ValueError("give --workloads or --input-len/--output-len, not both")
            workloads = parse_workloads(f"{args.input_len or 128}x{args.output_len or 128}")
        else:
            workloads = parse_workloads(args.workloads or DEFAULT_WORKLOADS)
        args.llama_batches = parse_batches(args.llama_batches)
    except ValueError as e:
        ap.error(str(e))
    tuned = args.engine_config is not None or args.engine_profile is not None
    formats = [f for f in (args.formats or ("q4_1" if tuned else "q4_1,bf16,fp32")).split(",") if f]
    skip = set(filter(None, args.skip.split(",")))
    tuned_cfg = None
    if args.engine_config is not None:
        from swarmfactory.engine.config import EngineConfig

        try:
            tuned_cfg = EngineConfig.from_yaml(args.engine_config)  # fail now, not after the first workload
        except Exception as e:  # unreadable file, bad YAML, invalid config
            ap.error(f"--engine-config: {e}")

    llama = build_llama_server(args.peers, args.threads, args.llama_isa)
    if args.build_only:
        quantize = build_llama_tool(args.peers, args.threads, "llama-quantize", args.llama_isa)
        log(f"llama-server ready: {llama}")
        log(f"llama-quantize ready: {quantize}")
        return 0
    if args.model is not None and str(args.model) == SMOLLM2_Q4_K_M and not args.model.is_file():
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from quantize_model import smollm2_q4_k_m

        args.model = smollm2_q4_k_m(args.peers, isa=args.llama_isa, jobs=args.threads)
    # the untuned engine says so where serve would otherwise pick a tuned profile by itself
    no_profile = ("engine" not in skip or args.engine_config is not None) and serve_takes_profile()
    gguf = args.model.resolve() if args.model else bundled_model_path()
    if not gguf.is_file():
        ap.error(f"--model: no such file: {args.model}")
    max_c = max(levels)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = args.out.parent
    from swarmfactory.hardware import MASK_ENV, cpu_features, cpu_fingerprint

    host = cpu_features(mask=None)
    version = args.peers / f"llama-server{'' if args.llama_isa == 'native' else '-' + args.llama_isa}.version"
    llama_name = f"llama.cpp ({args.llama_isa} build)"
    results: dict = {
        "machine": {"cpu": cpu_fingerprint()["model"], "threads": args.threads, "cores": os.cpu_count(),
                    "simd": sorted(f for f in host if f.startswith(("avx", "amx", "fma", "f16c"))),
                    "mask": {k: os.environ[k] for k in (MASK_ENV, "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                        "MKL_ENABLE_INSTRUCTIONS") if k in os.environ}},
        "model": gguf.name, "model_path": str(gguf), "concurrency": levels, "rounds": args.rounds, "seed": args.seed,
        "num_prompts": args.num_prompts or "max(8, 2 x concurrency)",
        "llama_build": version.read_text().strip() if version.exists() else None,
        "llama_tune": {"on": args.llama_tune, "batches": [list(p) for p in args.llama_batches],
                       "probe_output_len": args.llama_probe_out},
        "engine_tuned": ({"config": str(args.engine_config) if args.engine_config else None,
                          "config_values": tuned_cfg.model_dump() if tuned_cfg else None,
                          "profile": args.engine_profile} if tuned else None),
        "workloads": {},
    }

    # Per workload, the engine servers run from its start (idle when not measured); llama-server
    # restarts at every level (its slots follow the concurrency). Each level is measured for
    # every system in turn, the order reversed every other round (ABBA), so slow drifts in what
    # else runs on the machine hit all systems alike.
    for inp, outp in workloads:
        wl = (inp, outp)
        ctx = seq_ctx(inp, outp)
        log(f"workload {inp} in / {outp} out")
        wres = results["workloads"][f"{inp}x{outp}"] = {"input_len": inp, "output_len": outp, "seq_ctx": ctx,
                                                         "systems": {}}
        engines: dict[str, Proc] = {}
        warmed: set[int] = set()
        try:
            if "engine" not in skip:
                for fmt in formats:
                    name = f"engine {fmt}" if not tuned else ("engine default" if fmt == "q4_1" else f"engine {fmt}")
                    port = free_port()
                    log(f"starting {name}")
                    engines[name] = Proc(engine_cmd(port, args.threads, max_c, ctx, weights=fmt, no_profile=no_profile,
                                                    model=gguf),
                                         f"http://127.0.0.1:{port}", logs / f"engine-{fmt}-{inp}x{outp}.log")
            if tuned:
                port = free_port()
                mb = max(max_c, tuned_cfg.max_batch if tuned_cfg else 0)
                msl = max(ctx, tuned_cfg.max_seq_len if tuned_cfg else 0)
                log("starting engine tuned")
                engines["engine tuned"] = Proc(engine_cmd(port, args.threads, mb, msl, config=args.engine_config,
                                                          profile=args.engine_profile, no_profile=no_profile,
                                                          model=gguf),
                                               f"http://127.0.0.1:{port}", logs / f"engine-tuned-{inp}x{outp}.log")
            wres["served"] = {name: served_limits(proc.url) for name, proc in engines.items()}
            for name, got in wres["served"].items():
                if (got.get("max_batch") or 0) < max_c or (got.get("max_model_len") or 0) < inp + outp:
                    log(f"warning: {name} serves max_batch {got.get('max_batch')}, context "
                        f"{got.get('max_model_len')}; this run needs {max_c} and {inp + outp}")
            for i, c in enumerate(levels):
                llama_proc, llama_meta = None, {}
                try:
                    if "llama.cpp" not in skip:
                        log(f"starting {llama_name} for c={c}")
                        llama_proc, llama_meta, fresh = start_llama(llama, gguf, c, wl, i, args, logs)
                        if not fresh:
                            warmed.add(llama_proc.p.pid)
                    servers = ([(llama_name, llama_proc)] if llama_proc else []) + list(engines.items())
                    for r in range(args.rounds):
                        tag = f" (round {r + 1})" if args.rounds > 1 else ""
                        for name, proc in (servers if r % 2 == 0 else list(reversed(servers))):
                            log(f"{name}{tag}, {inp}x{outp}")
                            lv = measure(proc, c, wl, i, args, warmup=1 if proc.p.pid in warmed else 2,
                                         name=f"{name}{tag} {inp}x{outp}")
                            warmed.add(proc.p.pid)
                            if proc is llama_proc:
                                lv.update(llama_meta)
                            wres["systems"].setdefault(name + tag, []).append(lv)
                finally:
                    if llama_proc:
                        llama_proc.stop()
        finally:
            for proc in engines.values():
                proc.stop()
        args.out.write_text(json.dumps(results, indent=2))  # what is measured so far

    if "hf" not in skip:
        for inp, outp in workloads:
            log(f"HF transformers fp32 generate, {inp}x{outp}")
            results["workloads"][f"{inp}x{outp}"]["systems"]["HF transformers fp32 generate"] = bench_hf(
                gguf, levels, (inp, outp), args)

    args.out.write_text(json.dumps(results, indent=2))
    print(table(results, levels))
    log(f"wrote {args.out}")
    return 0


def _cell(lv: dict, key: str, digits: int) -> str:
    x = lv.get(key)
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def table(results: dict, levels: list[int]) -> str:
    """One Markdown table per workload: a row per level and system (systems of a level adjacent)."""
    parts = []
    for key, wres in results["workloads"].items():
        model = f", {results['model']}" if results.get("model") else ""
        rows = [f"### {wres['input_len']} tokens in / {wres['output_len']} out{model} (TTFT and TPOT in ms)", "",
                "| c | system | tok/s | TTFT median | TTFT p99 | TPOT median | TPOT p99 | errors | load | "
                "others' CPU |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for c in levels:
            for name, lvs in wres["systems"].items():
                lv = next((x for x in lvs if x["concurrency"] == c), None)
                if lv is None:
                    continue
                others = lv.get("others_cpu_share")
                busy = bool((lv.get("contention") or {}).get("busy"))
                rows.append(f"| {c} | {name} | {_cell(lv, 'output_tok_s', 1)} | {_cell(lv, 'ttft_ms_median', 0)} | "
                            f"{_cell(lv, 'ttft_ms_p99', 0)} | {_cell(lv, 'tpot_ms_median', 1)} | "
                            f"{_cell(lv, 'tpot_ms_p99', 1)} | {lv.get('errors', 0)} | "
                            f"{lv.get('loadavg_1m_after', 0):.1f} | {'n/a' if others is None else f'{others:.0%}'}"
                            f"{' busy' if busy else ''} |")
        kept = [f"c={lv['concurrency']}: -b {lv['llama_batch']} -ub {lv['llama_ubatch']}"
                for name, lvs in wres["systems"].items() if "(round " not in name or "(round 1)" in name
                for lv in lvs if "llama_batch" in lv]
        if kept:
            rows += ["", "llama-server batch sizes kept: " + ", ".join(kept)]
        busy = [f"{name} c={lv['concurrency']} ({lv['contention']['others']:.0%})"
                for name, lvs in wres["systems"].items() for lv in lvs
                if (lv.get("contention") or {}).get("busy") and lv["contention"].get("others") is not None]
        if busy:
            rows += ["", f"busy after its repeats (other processes took over {BUSY:.0%} of the CPUs; figures "
                     "not reliable): " + ", ".join(busy)]
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
