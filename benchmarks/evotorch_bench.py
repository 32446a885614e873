"""seedledger vs EvoTorch on gymnasium control: the same ES family, policy and budget.

Both sides evolve the same MLP policy from the same initial weights (the factory under
torch seed 0, as seedledger's module runs make it) with mirrored ES at a fixed σ,
centered-rank shaping and Adam on the mean: seedledger's `algorithm: es` on the module
backend, EvoTorch's `PGPE` with `stdev_learning_rate=0` on its `GymNE` problem. Same
population, episodes per member and generations, so the same number of episodes.
Reports per problem and side: solved rate over the seeds (the final policy's mean return
on `--test-episodes` fixed episodes at or above the threshold), the final and best
generation mean return per evaluation budget, training wall time and wall time per
environment step (a better policy plays longer CartPole episodes, so wall time alone
compares different amounts of work), and for seedledger the
seed file's size and the time to rebuild the final policy from it. EvoTorch keeps no
record: its runs are not replayable (its episodes are not seeded per generation).

    pip install 'seedledger[gym]' evotorch==0.6.1
    python benchmarks/evotorch_bench.py --seeds 1 --generations 3          # a smoke test
    python benchmarks/evotorch_bench.py --seeds 5                          # the comparison
    python benchmarks/evotorch_bench.py --seeds 1 --generations 5 --sides seedledger,seedledger-vec

`seedledger-vec` is seedledger with the task option `vectorized=true` (a generation's
members × episodes stepped together, one batched policy forward per step); compare its
µs per env step with `seedledger`'s from the same invocation.

Timings need a quiet machine: run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

PROBLEMS = {
    # env, hidden width, threshold for "solved", default generations
    "CartPole-v1": {"hidden": 16, "threshold": 475.0, "generations": 30, "steps": lambda r: r},
    "Pendulum-v1": {"hidden": 16, "threshold": -200.0, "generations": 60, "steps": lambda r: 200.0},
}
POLICIES = '''import torch

def policy_{name}():
    return torch.nn.Sequential(torch.nn.Linear({obs}, {hidden}), torch.nn.Tanh(), torch.nn.Linear({hidden}, {act}))
'''


def spaces(env_id: str) -> tuple[int, int]:
    import gymnasium as gym

    env = gym.make(env_id)
    act = env.action_space.n if hasattr(env.action_space, "n") else env.action_space.shape[0]
    return env.observation_space.shape[0], act


def play(policy: torch.nn.Module, env_id: str, episodes: int) -> float:
    """Mean return of `policy` (argmax for discrete actions, clipped otherwise) on fixed seeds."""
    import gymnasium as gym
    import numpy as np

    env, total = gym.make(env_id), 0.0
    for seed in range(episodes):
        obs, _ = env.reset(seed=10_000 + seed)
        done = False
        with torch.no_grad():
            while not done:
                out = policy(torch.as_tensor(obs, dtype=torch.float32))
                if hasattr(env.action_space, "n"):
                    action = int(out.argmax())
                else:
                    action = np.clip(out.numpy(), env.action_space.low, env.action_space.high)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
    return total / episodes


def seedledger_side(
    module_ref: str, factory, env_id: str, args, seed: int, work: Path, vectorized: bool = False
) -> dict:
    import seedledger as sl

    task = f"gym:{env_id}?episodes={args.episodes}" + ("&vectorized=true" if vectorized else "")
    config = {"model": module_ref, "task": task, "population": args.population,
              "sigma": args.sigma, "lr": args.lr, "optimizer": {"name": "adam"}, "shaping": "centered_rank",
              "mirrored": True, "generations": args.generations, "seed": seed}
    ledger = work / f"sl-{env_id}-{seed}{'-vec' if vectorized else ''}.db"
    started = time.perf_counter()
    result = sl.train(config, run="run", ledger=ledger)
    wall = time.perf_counter() - started
    means = [r.reward_stats()["mean"] for r in result.records]
    steps = sum(PROBLEMS[env_id]["steps"](m.reward) * args.episodes for r in result.records for m in r.members)
    seeds = work / f"{env_id}-{seed}{'-vec' if vectorized else ''}.seeds"
    size = sl.export("run", seeds, ledger=ledger)["bytes"]
    started = time.perf_counter()
    weights = sl.rebuild(seeds, ledger=ledger, base=module_ref)
    rebuild = time.perf_counter() - started
    policy = factory()
    policy.load_state_dict(weights)
    return {"wall_s": wall, "final_mean": means[-1], "best_mean": max(means), "env_steps": steps,
            "test_return": play(policy, env_id, args.test_episodes), "seed_file_bytes": size, "rebuild_s": rebuild}


def evotorch_side(factory, env_id: str, args, seed: int) -> dict:
    from evotorch.algorithms import PGPE
    from evotorch.neuroevolution import GymNE

    torch.manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # seedledger's FACTORY_SEED: the same start
        center = torch.nn.utils.parameters_to_vector(factory().parameters()).detach()
    problem = GymNE(env=env_id, network=factory, num_episodes=args.episodes, num_actors=None)
    searcher = PGPE(problem, popsize=args.population, center_learning_rate=args.lr, stdev_learning_rate=0.0,
                    stdev_init=args.sigma, optimizer="adam", ranking_method="centered", symmetric=True,
                    center_init=center)
    means, steps = [], 0.0
    started = time.perf_counter()
    for _ in range(args.generations):
        searcher.step()
        evals = searcher.population.evals[:, 0].tolist()
        means.append(sum(evals) / len(evals))
        steps += sum(PROBLEMS[env_id]["steps"](e) * args.episodes for e in evals)
    wall = time.perf_counter() - started
    policy = problem.parameterize_net(searcher.status["center"]).cpu()
    return {"wall_s": wall, "final_mean": means[-1], "best_mean": max(means), "env_steps": steps,
            "test_return": play(policy, env_id, args.test_episodes)}


def summary(rows: list[dict], threshold: float) -> dict:
    out = {"solved_rate": sum(r["test_return"] >= threshold for r in rows) / len(rows)}
    for key in rows[0]:
        out[key] = statistics.mean(r[key] for r in rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--generations", type=int, default=None, help="default: the problem's")
    ap.add_argument("--population", type=int, default=32)
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--sigma", type=float, default=0.125)
    ap.add_argument("--lr", type=float, default=0.0625)
    ap.add_argument("--test-episodes", type=int, default=10)
    ap.add_argument("--sides", default="seedledger,seedledger-vec,evotorch",
                    help="seedledger-vec: task option vectorized=true (members × episodes stepped together)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    import sys

    work = Path(tempfile.mkdtemp(prefix="evotorch-bench-"))
    results = {}
    for env_id in args.problems.split(","):
        spec = PROBLEMS[env_id]
        run_args = argparse.Namespace(**{**vars(args), "generations": args.generations or spec["generations"]})
        obs, act = spaces(env_id)
        name = env_id.split("-")[0].lower()
        (work / f"policies_{name}.py").write_text(POLICIES.format(name=name, obs=obs, hidden=spec["hidden"], act=act))
        sys.path.insert(0, str(work))
        factory = getattr(__import__(f"policies_{name}"), f"policy_{name}")
        module_ref = f"module:{work / f'policies_{name}.py'}:policy_{name}"
        warm = argparse.Namespace(**{**vars(run_args), "generations": 1, "test_episodes": 1})
        for side in args.sides.split(","):  # one untimed generation first: imports and first use stay out
            if side != "evotorch":
                seedledger_side(module_ref, factory, env_id, warm, 10_000, work, side == "seedledger-vec")
        for side in args.sides.split(","):
            rows = []
            for seed in range(args.seeds):
                row = (evotorch_side(factory, env_id, run_args, seed) if side == "evotorch" else
                       seedledger_side(module_ref, factory, env_id, run_args, seed, work, side == "seedledger-vec"))
                print(json.dumps({"problem": env_id, "side": side, "seed": seed, **row}), flush=True)
                rows.append(row)
            results[f"{env_id}/{side}"] = summary(rows, spec["threshold"])
        evaluations = run_args.generations * args.population * args.episodes
        print(f"\n{env_id}: {evaluations} episodes per run, {args.seeds} seeds")
        for side in args.sides.split(","):
            r = results[f"{env_id}/{side}"]
            extra = (f"  seed file {r['seed_file_bytes']:.0f} B, rebuild {r['rebuild_s']:.2f} s"
                     if "seed_file_bytes" in r else "")
            print(f"  {side:14s} solved {r['solved_rate']:.0%}  final {r['final_mean']:9.2f}  "
                  f"best {r['best_mean']:9.2f}  test {r['test_return']:9.2f}  wall {r['wall_s']:7.2f} s "
                  f"({1e6 * r['wall_s'] / r['env_steps']:.0f} µs per env step){extra}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
