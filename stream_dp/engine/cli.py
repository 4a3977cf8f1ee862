"""Run the streaming engine on a TOML config (``stream-dp run --config FILE``).

The engine reads records from the configured source (Kafka, JSONL or CSV), learns them with a
private learner, publishes every release to the release sink with its privacy ledger, sends bad
input to the dead-letter sink with its reason, and checkpoints so that a crash loses nothing and
never spends privacy twice. SIGTERM or Ctrl-C checkpoints and exits cleanly.

Exit codes: 0 done, 2 invalid config, 3 refused to start (state problem), 1 other errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

__all__ = ["add_arguments", "main", "dry_run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="engine TOML file")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the config, print T1, the noise (σ) schedule and the budget plan, exit",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start a NEW model with a new budget even though state exists (the old "
        "checkpoint is kept aside); without it the engine never resets a ledger",
    )
    parser.add_argument(
        "--max-records", type=int, default=None, help="stop after this many input messages"
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.set_defaults(func=main)


def dry_run(config) -> str:
    """The plan an operator should read before the first record: T1, σ_t, ρ per release."""
    from stream_dp.engine.runner import build_learner

    learner = build_learner(config)
    first = learner.T1 + learner.release_every
    if learner.horizon is not None:
        first = min(first, learner.horizon)
    steps = sorted({first, 2 * first, 10 * first, 100 * first})
    if learner.horizon is not None:
        steps = sorted({s for s in steps if s <= learner.horizon} | {learner.horizon})
    plan = learner.noise_plan(steps)
    lines = [
        f"model {config.model.model_id}: {config.model.algorithm} task={config.model.task}",
        learner.describe(),
        f"ρ budget {learner.accountant.rho_budget:.6g} for (ε={learner.epsilon}, "
        f"δ={learner.delta}) with the {learner.conversion} conversion",
        f"schedule: {learner._schedule!r}; release every {learner.release_every} step(s)",
        "",
        f"{'step':>10} {'sensitivity':>12} {'σ per coord':>12} {'ρ this release':>15}",
    ]
    for p in plan:
        lines.append(
            f"{p['step']:>10} {p['sensitivity']:>12.4g} {p['sigma']:>12.4g} {p['rho']:>15.4g}"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from stream_dp.checkpoint import CheckpointError
    from stream_dp.engine.config import ConfigError, load_config
    from stream_dp.engine.runner import Engine, EngineError

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"stream-dp run: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        try:
            print(dry_run(config))
        except ValueError as exc:
            print(f"stream-dp run: invalid model settings: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        engine = Engine(config, fresh=args.fresh, max_records=args.max_records)
    except ValueError as exc:
        print(f"stream-dp run: invalid model settings: {exc}", file=sys.stderr)
        return 2
    try:
        stats = engine.run()
    except (EngineError, CheckpointError) as exc:
        print(f"stream-dp run: refusing to start: {exc}", file=sys.stderr)
        return 3
    eps, delta = engine.learner.accountant.spent()
    print(json.dumps({**stats.to_dict(), "epsilon_spent": eps, "delta": delta}))
    return 0
