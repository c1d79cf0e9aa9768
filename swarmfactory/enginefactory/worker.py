"""One engine design in its own process: load, verify, then serve over HTTP.

    python -m swarmfactory.enginefactory.worker --config DESIGN.yaml --reference REF.pt --port P [--store-file F]

Reports one JSON line per stage on stdout (``loaded``, ``verified``, ``serving``) and the
failure of a stage as ``{"event": "failed", "stage": ..., "error": ...}``. A design that fails
verification never serves. The tune driver measures the served engine over HTTP, as a user's
client would, and kills the process when done; a crash or hang costs that design only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path


def emit(**kw) -> None:
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--make-reference", nargs=2, metavar=("MODEL", "CACHE"),
                    help="compute and cache the HF fp32 reference for MODEL under CACHE, then exit")
    ap.add_argument("--config")
    ap.add_argument("--reference")
    ap.add_argument("--port", type=int)
    ap.add_argument("--store-file", help="a file holding the URL of the evidence store the design's champion: "
                                         "kernels come from (a URL may carry a password: never on a command line)")
    ap.add_argument("--verify-only", action="store_true")
    ap.add_argument("--serve-anyway", action="store_true",
                    help="serve even when verification failed (the tune's baseline only: what users run today)")
    args = ap.parse_args(argv)
    if args.make_reference:
        from .verify import reference

        reference(Path(args.make_reference[0]), Path(args.make_reference[1]))
        return 0
    if not (args.config and args.reference and args.port):
        ap.error("--config, --reference and --port are required")

    import torch

    from swarmfactory.champions import Corridor
    from swarmfactory.engine import Engine, EngineConfig

    from .verify import verify

    try:
        cfg = EngineConfig.from_yaml(args.config)
        t0 = time.perf_counter()
        store = Path(args.store_file).read_text().strip() if args.store_file else None
        engine = Engine(cfg, supply=Corridor(store))
        emit(event="loaded", seconds=time.perf_counter() - t0, paths=engine.paths.summary(),
             threads=cfg.resolved_threads())
    except Exception as e:  # noqa: BLE001 - any failure to build is this design's verdict
        emit(event="failed", stage="load", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-2000:])
        return 3
    try:
        t0 = time.perf_counter()
        check = verify(engine, torch.load(args.reference, weights_only=True))
        emit(event="verified", ok=check.ok, detail=check.detail, evidence=check.evidence,
             seconds=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001
        emit(event="failed", stage="verify", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-2000:])
        return 4
    if (not check.ok and not args.serve_anyway) or args.verify_only:
        return 0
    from swarmfactory.engine.server import serve

    emit(event="serving", port=args.port)
    serve(engine, host="127.0.0.1", port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
