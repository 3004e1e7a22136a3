"""``python -m dispatch_backends.local``: fault injection and inspection."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from dispatch_backends.local.errors import FaultError
from dispatch_backends.local.faults import CALLS, Faults, kill_all
from dispatch_backends.local.files import _utcnow
from dispatch_backends.local.store import _Store

# -- command line ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_backends.local",
        description="The local backend's fault injection and inspection.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    inject = commands.add_parser("inject", help="inject a fault")
    inject.add_argument("--data-dir", required=True, type=Path)
    faults = inject.add_subparsers(dest="fault", required=True)
    for name, what in (
        ("preempt", "preempt an object (SIGTERM, kill wait, SIGKILL)"),
        ("node-lost", "lose a running object's node (it keeps running)"),
        ("recover-node", "take a node loss back"),
        ("admin-hold", "hold a pending object's gate as an admin"),
        ("admin-release", "release an admin hold"),
    ):
        faults.add_parser(name, help=what).add_argument("object_id")
    faults.add_parser("foreign", help="make a foreign object dj-JOB_ID").add_argument("job_id")
    refuse = faults.add_parser("refuse-next", help="refuse the next start(s)")
    refuse.add_argument("--count", type=int, default=1)
    refuse.add_argument("--detail", default=None)
    unknown = faults.add_parser("unknown-next", help="make the next start(s) unknown")
    unknown.add_argument("--count", type=int, default=1)
    die = faults.add_parser(
        "die-in-start-next", help="make the next start(s) SIGKILL their caller mid-launch"
    )
    die.add_argument("--count", type=int, default=1)
    unreachable_next = faults.add_parser("unreachable-next", help="fail the next call(s)")
    unreachable_next.add_argument("--count", type=int, default=1)
    unreachable_next.add_argument("--call", choices=("any", *CALLS), default="any")
    unreachable = faults.add_parser("unreachable", help="fail every call (on) or none (off)")
    unreachable.add_argument("state", choices=("on", "off"))
    faults.add_parser("clear", help="disarm launch and reachability faults")
    listing = commands.add_parser("list", help="print every object as a JSON line")
    listing.add_argument("--data-dir", required=True, type=Path)
    listing.add_argument("--cluster", default="local")
    killing = commands.add_parser("kill-all", help="SIGKILL every object")
    killing.add_argument("--data-dir", required=True, type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (see the module docstring); return the exit status.

    Exit status 0 on success, 1 when the fault can't be injected, 2 for a usage error.
    """
    args = _parser().parse_args(argv)
    try:
        if args.command == "list":
            store = _Store(args.data_dir)
            if store.objects.is_dir():
                found = store.scan(args.cluster, _utcnow(), None)
                for job_id, objects in sorted(found.items()):
                    for observed in objects:
                        line = {"job_id": job_id, "object": msgspec.to_builtins(observed)}
                        print(msgspec.json.encode(line).decode())
            return 0
        if args.command == "kill-all":
            print(kill_all(args.data_dir))
            return 0
        faults = Faults(args.data_dir)
        match args.fault:
            case "preempt":
                faults.preempt(args.object_id)
            case "node-lost":
                faults.node_lost(args.object_id)
            case "recover-node":
                faults.recover_node(args.object_id)
            case "admin-hold":
                faults.admin_hold(args.object_id)
            case "admin-release":
                faults.admin_release(args.object_id)
            case "foreign":
                print(faults.foreign(args.job_id))
            case "refuse-next":
                faults.refuse_next(args.count, args.detail)
            case "unknown-next":
                faults.unknown_next(args.count)
            case "die-in-start-next":
                faults.die_in_start_next(args.count)
            case "unreachable-next":
                faults.unreachable_next(args.count, args.call)
            case "unreachable":
                faults.set_unreachable(args.state == "on")
            case "clear":
                faults.clear()
            case other:  # argparse only lets the choices above through
                raise AssertionError(f"unhandled fault {other!r}")
    except FaultError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0
