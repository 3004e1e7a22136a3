"""``dispatch-ckpt``: the checkpoint helper's command line, used inside the training job.

Scripts rely on these forms (seed 004, issue 4):

    dispatch-ckpt publish --root ROOT --step N PATH
    dispatch-ckpt latest --root ROOT [--json]
    dispatch-ckpt watch --root ROOT [--timeout SECONDS] [--marker NAME]
    dispatch-ckpt env [--root ROOT]

Exit codes: 0 done; 1 an error (the message names the entry, path or variable); 2 a usage
error; 3 ``latest`` found nothing published.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from functools import wraps
from types import FrameType
from typing import Final, ParamSpec, TypeVar

import click
import msgspec

from dispatch_ckpt.checkpoints import Checkpoints
from dispatch_ckpt.errors import CkptError
from dispatch_ckpt.names import MAX_STEP, Publication
from dispatch_ckpt.watch import Watcher

__all__ = ["EXIT_ERROR", "EXIT_NOTHING_PUBLISHED", "EXIT_OK", "EXIT_USAGE", "cli", "main"]

EXIT_OK: Final = 0
#: Any error: a store failure, a malformed entry (named), a missing DISPATCH_* variable, a
#: duplicate publication, a watch scan over its timeout.
EXIT_ERROR: Final = 1
#: A command line click refuses (unknown option, missing argument).
EXIT_USAGE: Final = 2
#: ``latest``: ``pub/`` holds no publication (a first execution starts from scratch).
EXIT_NOTHING_PUBLISHED: Final = 3

#: Fallback for ``--root`` (the checkpoint root dispatch passes to the job).
ROOT_VAR: Final = "DISPATCH_CHECKPOINT"

P = ParamSpec("P")
R = TypeVar("R")

_encoder = msgspec.json.Encoder()


def _fail_on_ckpt_error(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn a CkptError into its message on stderr and exit code 1."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except CkptError as err:
            click.echo(f"dispatch-ckpt: error: {err}", err=True)
            sys.exit(EXIT_ERROR)

    return wrapper


def _pub_json(ckpt: Checkpoints, pub: Publication) -> bytes:
    return _encoder.encode({"epoch": pub.epoch, "step": pub.step, "path": ckpt.location(pub)})


_root_option = click.option(
    "--root",
    required=True,
    envvar=ROOT_VAR,
    show_envvar=True,
    metavar="ROOT",
    help="The checkpoint root: a path, or s3://bucket/prefix (endpoint, region and "
    "credentials from the usual boto3 configuration, e.g. AWS_ENDPOINT_URL).",
)
_attempt_option = click.option(
    "--attempt",
    metavar="TOKEN",
    default=None,
    help="The execution's token; default: $DISPATCH_ATTEMPT.",
)
_epoch_option = click.option(
    "--epoch",
    metavar="EPOCH",
    default=None,
    help="The execution's epoch (G*10^12 + N*10^6 + R); default: $DISPATCH_EPOCH.",
)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Exit codes: 0 done; 1 error (the message names the entry, path or variable); "
    "2 usage error; 3 `latest` found nothing published.",
)
def cli() -> None:
    """Isolated checkpoints and append-only publication, inside a dispatch job.

    Each execution saves into its own folder, ROOT/exec/$DISPATCH_ATTEMPT/, and makes a save
    visible to later executions by publishing it: an empty entry
    ROOT/pub/<epoch>-<step>-<path, base32>, created exclusively. The latest checkpoint is the
    publication with the greatest epoch, then step, so an old execution that outlives its job
    can never make a replacement resume from its lineage.

    \b
    A job script:
        OUT=$(dispatch-ckpt env --root /ckpt/job-7)        # the execution folder
        rc=0; RESUME=$(dispatch-ckpt latest --root /ckpt/job-7) || rc=$?
        [ "$rc" = 0 ] || [ "$rc" = 3 ] || exit 1           # 3: nothing yet; else an error
        dispatch-ckpt watch --root /ckpt/job-7 & WATCH=$!
        python train.py --output-dir "$OUT" --resume "$RESUME"
        kill $WATCH; wait $WATCH || exit 1                 # an early exit is a failure
    """


@cli.command()
@_root_option
@click.option(
    "--step",
    required=True,
    type=click.IntRange(0, MAX_STEP),
    metavar="N",
    help="The training step of the save.",
)
@click.argument("path", metavar="PATH")
@_epoch_option
@_attempt_option
@_fail_on_ckpt_error
def publish(root: str, step: int, path: str, epoch: str | None, attempt: str | None) -> None:
    """Publish the save at PATH (inside ROOT) as step N of this execution.

    Creates ROOT/pub/<epoch:020d>-<step:020d>-<PATH relative to ROOT, base32> exclusively
    (POSIX: O_CREAT|O_EXCL, then fsync of pub/ and ROOT; S3: If-None-Match: *) and prints
    the entry. Publishing the same name twice is an error. Needs DISPATCH_ATTEMPT and
    DISPATCH_EPOCH (or --attempt and --epoch).

    \b
    Example:
        dispatch-ckpt publish --root /ckpt/job-7 --step 500 \\
            /ckpt/job-7/exec/$DISPATCH_ATTEMPT/checkpoint-500
    """
    ckpt = Checkpoints.open(root, os.environ, attempt=attempt, epoch=epoch)
    pub = ckpt.publish(step, path)
    click.echo(ckpt.store.location(f"pub/{pub.name}"))


@cli.command()
@_root_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print one JSON object {"epoch": E, "step": N, "path": LOCATION} instead of the path.',
)
@_fail_on_ckpt_error
def latest(root: str, as_json: bool) -> None:
    """Print the latest published save: greatest epoch, then step.

    Lists ROOT/pub/ (every page on S3) and prints the save's full location (a path or an
    s3:// URL). Exits 3 when nothing is published, and 1 naming the entry when the name of
    an entry that could be the latest doesn't parse (it is never skipped).

    \b
    Example:
        if RESUME=$(dispatch-ckpt latest --root s3://ckpt/job-7); then
            python train.py --resume "$RESUME"
        fi
        dispatch-ckpt latest --root /ckpt/job-7 --json
        {"epoch":1000000,"step":500,"path":"/ckpt/job-7/exec/a1/checkpoint-500"}
    """
    ckpt = Checkpoints.open(root)
    pub = ckpt.latest()
    if pub is None:
        click.echo(f"dispatch-ckpt: nothing published under {ckpt.root}", err=True)
        sys.exit(EXIT_NOTHING_PUBLISHED)
    if as_json:
        click.echo(_pub_json(ckpt, pub))
    else:
        click.echo(ckpt.location(pub))


@cli.command()
@_root_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="The longest one scan (and its publications) may take; a scan over it ends "
    "watch with an error.",
)
@click.option(
    "--marker",
    metavar="NAME",
    default=None,
    help="Also count a folder holding a file NAME as a complete save.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="The pause between scans.",
)
@click.option("--once", is_flag=True, help="Scan and publish once, then exit.")
@_epoch_option
@_attempt_option
@_fail_on_ckpt_error
def watch(
    root: str,
    timeout: float,
    marker: str | None,
    interval: float,
    once: bool,
    epoch: str | None,
    attempt: str | None,
) -> None:
    """Publish each new complete save in this execution's folder.

    Scans ROOT/exec/$DISPATCH_ATTEMPT/ every --interval seconds and publishes each save once
    it is complete: a Hugging Face checkpoint-<step> folder once its trainer_state.json is
    written, a PyTorch DCP folder with .metadata, an Orbax step folder with its commit
    marker, or a folder holding --marker NAME. Prints one JSON line per publication. Stops
    at the first error with exit code 1 (a store error, or a scan over --timeout), so a job
    script must treat watch exiting early as a failure. On SIGTERM or SIGINT it scans once
    more and exits 0.

    \b
    Example:
        dispatch-ckpt watch --root s3://ckpt/job-7 --timeout 120 & WATCH=$!
        torchrun train.py ...
        kill $WATCH; wait $WATCH || echo "watch failed: saves may be unpublished" >&2
    """
    ckpt = Checkpoints.open(root, os.environ, attempt=attempt, epoch=epoch, timeout_s=timeout)
    ckpt.env.require_epoch("watch (it publishes)")
    ckpt.env.require_attempt("watch (it follows the execution folder)")

    def report(pub: Publication) -> None:
        click.echo(_pub_json(ckpt, pub))

    watcher = Watcher(
        ckpt, marker=marker, timeout_s=timeout, interval_s=interval, on_publish=report
    )
    if once:
        watcher.scan()
        return
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    watcher.run(stop)


@cli.command()
@_root_option
@_attempt_option
@_fail_on_ckpt_error
def env(root: str, attempt: str | None) -> None:
    """Print this execution's folder, ROOT/exec/$DISPATCH_ATTEMPT (created if missing).

    Nothing else writes there, so the framework can save and rotate in it freely.

    \b
    Example:
        OUT=$(dispatch-ckpt env --root /ckpt/job-7)
        python train.py --output_dir "$OUT"
    """
    ckpt = Checkpoints.open(root, os.environ, attempt=attempt)
    click.echo(ckpt.exec_dir())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (the console script's entry point)."""
    logging.basicConfig(level=logging.WARNING, format="dispatch-ckpt: %(levelname)s: %(message)s")
    try:
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE if isinstance(exc, click.UsageError) else EXIT_ERROR
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        return EXIT_ERROR
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
