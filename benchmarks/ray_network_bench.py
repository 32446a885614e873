"""What crosses between the driver and the Ray workers per generation, against population
size and model size: the goal is O(N) in members and O(1) in parameters.

Measured at the pool boundary: every actor call the pool makes (`ActorMethod._remote`) is
recorded with the size of its arguments, and every answer the pool reads (its `get`) with
the size of the result, both as Ray's serializer pickles them (`ray.cloudpickle`, protocol
5). This counts what the driver sends and receives over RPC and the object store alike
(Ray inlines small arguments in the RPC and puts large ones in the object store; the
bytes are the same); Ray's own control traffic (heartbeats, scheduling) is not counted.
Worker start-up is counted apart: the actor's constructor arguments (the config and the
model's path; every worker loads the weights from its own disk, never from the driver).

    .venv/bin/python benchmarks/ray_network_bench.py [--workers 2] [--populations 8 32 128]
        [--models tiny smollm2-135m-instruct] [--generations 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ray_bench import one_generation  # noqa: E402

from seedledger.engine.config import validate  # noqa: E402
from seedledger.engine.runtime.models.resolve import resolve_model  # noqa: E402
from seedledger.replay.noise import run_key  # noqa: E402
from seedledger.trainers.es import ES  # noqa: E402


class Meter:
    """Bytes and calls per actor method, driver -> workers (`sent`) and back (`received`)."""

    def __init__(self):
        import ray
        from ray import cloudpickle

        from seedledger.engine.runtime.pools import ray as pool_module

        self.size = lambda obj: len(cloudpickle.dumps(obj, protocol=5))
        self.sent: dict[str, int] = defaultdict(int)
        self.received: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self._method: dict[object, str] = {}
        meter, remote, get = self, ray.actor.ActorMethod._remote, pool_module.get

        def counted_remote(method, args=None, kwargs=None, **options):
            ref = remote(method, args, kwargs, **options)
            name = method._method_name
            meter.sent[name] += meter.size((args, kwargs))
            meter.calls[name] += 1
            meter._method[ref] = name
            return ref

        def counted_get(refs, **kwargs):
            out = get(refs, **kwargs)
            many = isinstance(refs, list)
            for ref, value in zip(refs if many else [refs], out if many else [out], strict=True):
                meter.received[meter._method.pop(ref, "?")] += meter.size(value)
            return out

        ray.actor.ActorMethod._remote = counted_remote
        pool_module.get = counted_get

    def reset(self) -> None:
        self.sent.clear()
        self.received.clear()
        self.calls.clear()


def measure(meter: Meter, model: str, population: int, workers: int, generations: int) -> dict:
    from seedledger.engine.runtime.pools.ray import RayPool

    cfg = validate({
        "model": model, "population": population, "batch_size": 2, "max_new_tokens": 4, "sigma": 0.05,
        "lr": 0.01, "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 12}]},
        "workers": {"pool": "ray", "count": workers},
    })
    model_dir = resolve_model(model)
    params = sum(
        f.stat().st_size for f in model_dir.glob("*.safetensors")
    )
    start = meter.size(((cfg.model_dump(mode="json"), str(model_dir), 1, 0, None, None), {}))
    pool = RayPool(cfg, model_dir)
    meter.reset()
    strategy, key = ES(cfg.population, mirrored=cfg.mirrored, shaping=cfg.shaping), run_key(cfg.seed)
    try:
        for generation in range(1, generations + 1):
            one_generation(pool, cfg, strategy, key, generation)
    finally:
        pool.close()
    per = {name: (meter.sent[name] / generations, meter.received[name] / generations) for name in meter.calls}
    return {"weights": params, "start": start, "per": per, "calls": dict(meter.calls)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--populations", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--models", nargs="+", default=["tiny"])
    parser.add_argument("--model-population", type=int, default=8, help="population for the models beyond the first")
    parser.add_argument("--generations", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    meter = Meter()
    rows = [(args.models[0], n) for n in args.populations]
    rows += [(m, args.model_population) for m in args.models[1:]]
    print(f"{args.workers} workers, batch 2, 4 new tokens, {args.generations} generations; bytes per generation, "
          "pickled at the pool boundary")
    print(f"{'model':>22} {'weights MB':>10} {'N':>5} {'worker start B':>14} {'score ->':>9} {'score <-':>9} "
          f"{'apply ->':>9} {'apply <-':>9} {'total B':>9} {'B/member':>8}  state() calls")
    for model, population in rows:
        r = measure(meter, model, population, args.workers, args.generations)
        score_out, score_in = r["per"].get("score_population", (0, 0))
        apply_out, apply_in = r["per"].get("apply", (0, 0))
        total = sum(s + g for s, g in r["per"].values())
        print(f"{model:>22} {r['weights'] / 1e6:>10.1f} {population:>5} {r['start']:>14,} {score_out:>9,.0f} "
              f"{score_in:>9,.0f} {apply_out:>9,.0f} {apply_in:>9,.0f} {total:>9,.0f} {total / population:>8,.0f}  "
              f"{r['calls'].get('state', 0)}")


if __name__ == "__main__":
    main()
