"""``dispatch``: the command line of dispatch (DESIGN.md section 1).

``dispatch up`` runs everything on this machine; every other command is a thin client of the
HTTP API (``services/api/README.md``). Exit codes are in :mod:`dispatch_cli.errors`.
"""

from __future__ import annotations

import functools
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Final, TypeVar

import click
import msgspec
from click.shell_completion import CompletionItem

from dispatch_cli.client import (
    ApiClient,
    CommandResponse,
    EscalationView,
    JobSummary,
    new_idempotency_key,
)
from dispatch_cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_WATCH_UNSUCCESSFUL,
    CliError,
    UsageError,
)
from dispatch_cli.home import DEFAULT_API, default_data_dir, read_state, read_token
from dispatch_cli.jobfile import PolicyFlags, build_submission, parse_causes, parse_duration
from dispatch_cli.listing import jobs_page, rows_table, unreadable_lines
from dispatch_cli.program import program
from dispatch_cli.render import (
    escalations_table,
    event_line,
    plan_lines,
    status_detail,
    status_line,
)
from dispatch_cli.sbatch import build_sbatch_submission, plan_summary
from dispatch_cli.watching import Watcher
from dispatch_core import JobCreated, State, escalation_open
from dispatch_sdk.client import Client  # the submodule: dispatch_sdk imports dispatch_cli

__all__ = ["cli", "main"]

F = TypeVar("F", bound=Callable[..., Any])

_DEFAULT_PORT: Final = 8080
"""``dispatch up``'s API port when ``--port`` is not given."""

_EXIT_CODES_HELP: Final = """\b
Exit codes: 0 ok; 1 failure (API 5xx, services); 2 usage or an unreadable
job file; 3 API unreachable; 4 token refused (401) or forbidden (403);
5 not found (404); 6 refused by the core (409); 7 invalid request (400);
8 `watch`: the job settled failed or cancelled; 9 the job's record can't
be read (422 record-unreadable: retrying won't help); 130 interrupted."""


def _echo(text: str = "") -> None:
    click.echo(text)


def _err(text: str) -> None:
    click.echo(text, err=True)


def _json(value: object) -> None:
    click.echo(msgspec.json.encode(value).decode())


# ------------------------------------------------------------------------------ the client


class Target:
    """Where the API is and which token to send: options, then the environment, then the
    state of a ``dispatch up`` on this machine."""

    def __init__(self, api: str | None, token: str | None, as_json: bool) -> None:
        data_dir = default_data_dir(os.environ)
        state = read_state(data_dir)
        self.url = api or (state.api if state is not None else DEFAULT_API)
        # The token `up` keeps goes only to that up's API (or the default address), never to
        # another server named by --api.
        local = self.url.rstrip("/") in {DEFAULT_API, state.api if state else DEFAULT_API}
        self.token = token or (read_token(data_dir) if local else None)
        self.json = as_json

    def client(self, *, timeout_s: float = 30.0) -> ApiClient:
        """The API client."""
        return ApiClient(self.url, self.token, timeout_s=timeout_s)


def client_options(func: F) -> F:
    """Add ``--api``, ``--token`` and ``--json`` to a client command; it receives ``target``."""
    return _client_options(func, with_json=True)


def raw_client_options(func: F) -> F:
    """Add ``--api`` and ``--token`` to a client command whose output is the job's own bytes
    (``logs``): it has no JSON form, so it offers no ``--json``; it receives ``target``."""
    return _client_options(func, with_json=False)


def _client_options(func: F, *, with_json: bool) -> F:
    def wrapper(api: str | None, token: str | None, as_json: bool = False, **kwargs: Any) -> Any:
        return func(target=Target(api, token, as_json), **kwargs)

    decorated: Any = functools.wraps(func)(wrapper)
    if with_json:
        decorated = click.option(
            "--json", "as_json", is_flag=True, help="Print JSON (for scripts)."
        )(decorated)
    decorated = click.option(
        "--token",
        envvar="DISPATCH_TOKEN",
        metavar="TOKEN",
        help="Bearer token [env DISPATCH_TOKEN; default: the one `dispatch up` keeps].",
    )(decorated)
    decorated = click.option(
        "--api",
        envvar="DISPATCH_API",
        metavar="URL",
        help="The API's address [env DISPATCH_API; default: the running `dispatch up`, "
        f"else {DEFAULT_API}].",
    )(decorated)
    return decorated  # type: ignore[no-any-return]


def complete_job_ids(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Shell completion of a JOB argument: the ids of the API's jobs that start with what is
    typed (``--api``/``--token`` as typed so far, else as for any command). Nothing when the
    API doesn't answer: completion never prints an error into the shell."""
    target = Target(ctx.params.get("api"), ctx.params.get("token"), False)
    try:
        listing = target.client(timeout_s=3.0).jobs()
    except Exception:  # a completion must never fail the shell
        return []
    return [
        CompletionItem(j.job_id, help=j.state.value)
        for j in listing.jobs
        if j.job_id.startswith(incomplete)
    ]


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # in the order they were added, not sorted


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=_EXIT_CODES_HELP,
)
@click.version_option(package_name="dispatch", prog_name="dispatch", message="%(prog)s %(version)s")
def cli() -> None:
    """Supervise long-running training jobs: say why a job stopped, recover it by rules
    written against causes, and ask a person when it won't decide alone.

    \b
    Quick start (everything on this machine, local backend):
      dispatch demo                      # watch a job get preempted, resubmitted, resume
      dispatch up                        # in one terminal: NATS, services and the API
      dispatch submit examples/local-train.toml --watch
      dispatch status                    # every job; `dispatch status JOB` for one
    """


# -------------------------------------------------------------------------------- up / demo


@cli.command(short_help="Run dispatch on this machine (NATS, services, API).")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where records, logs, the token and the local backend's jobs are kept "
    "[env DISPATCH_DATA_DIR; default ~/.local/share/dispatch].",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=_DEFAULT_PORT, show_default=True,
    help="The API's port on 127.0.0.1 (0: any free one).",
)  # fmt: skip
@click.option(
    "--clusters", "clusters_file", metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also serve the clusters of this clusters file (TOML or JSON, [[clusters]] with "
    "name, backend and its settings), each with an observer of its own. Not remembered: "
    "give it on every start.",
)  # fmt: skip
@click.option(
    "--nats", "nats_urls", metavar="URL[,URL...]",
    help="Use this existing NATS (with JetStream) instead of starting one; needs "
    "--nats-credentials.",
)  # fmt: skip
@click.option(
    "--nats-credentials", metavar="DIR", type=click.Path(file_okay=False, path_type=Path),
    help="With --nats: the directory of the services' NATS credentials, one file per "
    "identity: api.nk, supervisor.nk, notifier.nk, observer-local.nk, observer-<cluster>.nk "
    "(nkey seeds from `dispatch nats init`, or .creds files); optional ca.pem, "
    "client-cert.pem and client-key.pem for TLS.",
)  # fmt: skip
@click.option("--verbose", "-v", is_flag=True, help="Also print every service's log lines.")
@click.option(
    "--json", "as_json", is_flag=True,
    help="Once ready, print one JSON line (api, pid, nats_url, data_dir, ...) and the token.",
)  # fmt: skip
def up(
    data_dir: Path | None,
    port: int,
    clusters_file: Path | None,
    nats_urls: str | None,
    nats_credentials: Path | None,
    verbose: bool,
    as_json: bool,
) -> int:
    """Run dispatch on this machine until Ctrl-C: a private nats-server with JetStream,
    the observer of the local cluster, a supervisor, the notifier and the API, all on
    loopback.

    Prints the API's address and token. Started again on the same data directory it
    continues where it stopped: records, jobs and the token are kept. Escalations are
    printed here (and appended to <data dir>/escalations.log) unless a channel is
    configured with NOTIFIER_* variables (e.g. NOTIFIER_SLACK_URL).

    With --clusters FILE it also serves FILE's clusters (a Slurm cluster, a second local
    one, ...) beside the local cluster: one observer each (log: <data
    dir>/logs/observer-<cluster>.log), and the supervisor and the API know them all. FILE
    is checked before anything starts: an unknown backend or field, a bad value, or a
    cluster named "local" (the built-in one's name) is refused. Relative paths in FILE are
    taken from FILE's directory. The option is not remembered: a start without it serves
    the local cluster alone (and says which clusters it no longer serves).

    NATS is locked: each service has its own identity (nkey seeds, mode 0600, under <data
    dir>/nats-identities/, kept across starts), and the private nats-server (configuration
    <data dir>/nats.conf, no monitoring port) refuses a connection without one and lets
    each identity do only its service's work. With --nats URL --nats-credentials DIR the
    services use that NATS with the credentials in DIR (`dispatch nats init` makes them)
    and no nats-server is started. No NATS secret is printed.

    \b
    Examples:
      dispatch up --data-dir /tmp/dispatch --port 8080
      # in another terminal, with the two variables it prints:
      export DISPATCH_API=http://127.0.0.1:8080 DISPATCH_TOKEN=...
      dispatch submit examples/local-train.toml --watch
    \b
      # with the Slurm test cluster (scripts/slurm-cluster.sh start) as cluster "slurm":
      dispatch up --clusters examples/slurm/clusters.toml
      dispatch submit examples/slurm/digits.toml --watch
    """
    from dispatch_cli.embedded import Embedded

    data = (data_dir or default_data_dir(os.environ)).expanduser()
    # With --json, stdout has the one JSON line; the progress goes to stderr.
    say = _err if as_json else _echo
    # A bad clusters file is refused here, before anything starts.
    urls = tuple(u.strip() for u in (nats_urls or "").split(",") if u.strip())
    embedded = Embedded(
        data,
        api_port=port,
        say=say,
        verbose=verbose,
        clusters_file=clusters_file,
        nats_urls=urls,
        nats_credentials=nats_credentials,
    )
    stop = threading.Event()
    presses = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal presses
        presses += 1
        if presses > 1:
            _err("dispatch up: second interrupt: killing every service now")
            embedded.kill()
            os._exit(EXIT_INTERRUPTED)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        say(f"dispatch up: data in {embedded.data_dir}")
        state = embedded.start()
        if stop.is_set():
            raise CliError("interrupted while starting", exit_code=EXIT_INTERRUPTED)
        if as_json:
            _echo(
                msgspec.json.encode(
                    {**msgspec.structs.asdict(state), "token": embedded.token}
                ).decode()
            )
        say("")
        say(f"dispatch is up. API: {state.api}   token: {embedded.token}")
        say("  Clusters:")
        for line in embedded.cluster_lines():
            say(f"    {line}")
        say("  Use it from another shell:")
        say(f"    export DISPATCH_API={state.api} DISPATCH_TOKEN={embedded.token}")
        say(f"    {program()} submit examples/local-train.toml --watch")
        say(f"    {program()} status")
        if embedded.data_dir.resolve() == default_data_dir(os.environ).resolve():
            say(
                f"  (on this machine the CLI also finds both by itself; the token is kept in "
                f"{embedded.data_dir / 'token'})"
            )
        else:
            # not the default data directory: client commands find it only when told
            say(f"  (or, on this machine: export DISPATCH_DATA_DIR={embedded.data_dir})")
        say(f"  Logs: {embedded.logs_dir}/   Ctrl-C stops everything.")
        while not stop.wait(1.0):
            embedded.watch()
        say("dispatch up: stopping (Ctrl-C again to kill at once)")
        embedded.stop()
        jobs = embedded.live_jobs()
        if jobs:
            again = _up_again(embedded.data_dir, port, clusters_file, nats_urls, nats_credentials)
            say(
                f"dispatch up: {jobs} job(s) keep running on the local backend; "
                f"`{program()} up{again}` again supervises them"
            )
        say("dispatch up: stopped")
        return EXIT_OK
    finally:
        embedded.stop(quiet=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _up_again(
    data_dir: Path,
    port: int,
    clusters_file: Path | None,
    nats_urls: str | None,
    nats_credentials: Path | None,
) -> str:
    """The options that start this ``up`` again on the same data, clusters and NATS (each
    with a leading space; none for the defaults): a bare ``dispatch up`` would start on the
    default data directory, not supervising these jobs, and without a second cluster's."""
    words = []
    if data_dir.resolve() != default_data_dir(os.environ).expanduser().resolve():
        words += ["--data-dir", str(data_dir.resolve())]
    if port != _DEFAULT_PORT:
        words += ["--port", str(port)]
    if clusters_file is not None:
        words += ["--clusters", str(clusters_file.resolve())]
    if nats_urls:
        words += ["--nats", nats_urls]
    if nats_credentials is not None:
        words += ["--nats-credentials", str(nats_credentials.resolve())]
    return "".join(f" {shlex.quote(w)}" for w in words)


@cli.command(short_help="Watch a training job preempted and resumed.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Use the `dispatch up` running on this data directory; without one running, the "
    "demo starts its own in a new temporary directory and stops it at the end.",
)
@click.option(
    "--epochs", type=click.IntRange(3, 1000), default=12, show_default=True,
    help="Training epochs (one checkpoint each).",
)  # fmt: skip
@click.option(
    "--epoch-s", type=click.FloatRange(0, 60), default=0.6, show_default=True,
    help="Least seconds per epoch, so the run can be watched (0: full speed).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON at the end.")
def demo(data_dir: Path | None, epochs: int, epoch_s: float, as_json: bool) -> int:
    """Show dispatch recovering a real training job, in about a minute.

    A small PyTorch model (examples/local/train.py) trains on CPU under the local
    backend, saving a checkpoint each epoch through dispatch_ckpt. Once it has published
    a few, the demo preempts it (fault injection); its rule resubmits it, the new
    execution resumes from the latest published checkpoint, and the job succeeds. Status
    changes are shown live, the training's own lines prefixed with `|`, and a summary at
    the end.

    \b
    Example:
      dispatch demo
      dispatch demo --epochs 20 --epoch-s 1
    """
    from dispatch_cli.demo import run_demo

    return run_demo(data_dir=data_dir, epochs=epochs, epoch_s=epoch_s, as_json=as_json, say=_echo)


# ------------------------------------------------------------------------------ submit


def _causes(option: str) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return ()
        try:
            return parse_causes(value, option=option)
        except UsageError as err:
            raise click.BadParameter(err.message.removeprefix(f"{option}: ")) from err

    return convert


@cli.command(short_help="Submit a job file or batch script; show its plan.")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--cluster", metavar="NAME", help="The cluster (required for a batch script).")
@click.option("--name", metavar="NAME", help="Prefix of the job id the API makes.")
@click.option("--job-id", metavar="ID", help="The job's id (default: <name>-<8 random chars>).")
@click.option("--reason", metavar="TEXT", help="Why it is submitted (recorded).")
@click.option(
    "--chdir", metavar="DIR", default=None,
    help="Working directory of the job when the spec sets none [default: this directory].",
)  # fmt: skip
@click.option(
    "--policy", "policy_file", type=click.Path(dir_okay=False, path_type=Path),
    help="Recovery rules from a TOML/JSON file ([[rules]] on/action/budget).",
)  # fmt: skip
@click.option(
    "--resubmit-on", metavar="CAUSES", callback=_causes("--resubmit-on"),
    help="Rule: resubmit on these causes (comma-separated, e.g. preempted,node-lost).",
)  # fmt: skip
@click.option("--budget", type=click.IntRange(0), help="Budget of --resubmit-on [default 3].")
@click.option(
    "--hold-on", metavar="CAUSES", callback=_causes("--hold-on"),
    help="Rule: hold for a person on these causes (e.g. non-zero-exit,out-of-memory).",
)  # fmt: skip
@click.option("--hold-for", metavar="DURATION", help="Deadline of --hold-on's hold (e.g. 12h).")
@click.option(
    "--escalate-on", metavar="CAUSES", callback=_causes("--escalate-on"),
    help="Rule: fail and escalate on these causes.",
)  # fmt: skip
@click.option("--watch", "then_watch", is_flag=True, help="Then watch it until it settles.")
@client_options
def submit(
    target: Target,
    file: Path,
    cluster: str | None,
    name: str | None,
    job_id: str | None,
    reason: str | None,
    chdir: str | None,
    policy_file: Path | None,
    resubmit_on: Sequence[Any],
    budget: int | None,
    hold_on: Sequence[Any],
    hold_for: str | None,
    escalate_on: Sequence[Any],
    then_watch: bool,
) -> int:
    """Submit a job and print its id and plan: the rules as applied, what the plan
    changed, and the causes no rule covers (before the job starts).

    FILE is a dispatch job file (TOML or JSON: [spec] and [[policy.rules]], see
    examples/*.toml), or a batch script with #SBATCH lines (then --cluster is required
    and the rules come from --policy or the rule flags). The job runs in this directory
    unless its spec sets options.chdir, as with sbatch.

    \b
    Examples:
      dispatch submit examples/local-train.toml
      dispatch submit train.sbatch --cluster slurm --resubmit-on preempted,node-lost --budget 3
      dispatch submit train.sbatch --cluster slurm --policy rules.toml --watch
    """
    flags = PolicyFlags(
        resubmit_on=resubmit_on,
        budget=budget,
        hold_on=hold_on,
        hold_for_s=None if hold_for is None else parse_duration(hold_for, option="--hold-for"),
        escalate_on=escalate_on,
    )
    body = build_submission(
        file,
        cluster=cluster,
        name=name,
        job_id=job_id,
        reason=reason,
        chdir=chdir or os.getcwd(),
        policy_file=policy_file,
        flags=flags,
    )
    client = target.client()
    answer = client.submit(body, key=new_idempotency_key())
    if target.json:
        _json(answer)
    else:
        replayed = (
            " (already submitted: answered from the first request)" if answer.replayed else ""
        )
        _echo(f"submitted job {answer.job_id}{replayed}")
        _echo(f"  state:      {answer.status.state.value}")
        for line in plan_lines(answer.plan):
            _echo(line)
        if not then_watch:
            _echo(f"follow it:    {program()} watch {answer.job_id}")
    if then_watch:
        return _watch(client, answer.job_id, target.json)
    return EXIT_OK


@cli.command(
    short_help="Submit a plain sbatch script with #DISPATCH lines; show its plan.",
    context_settings={"allow_interspersed_args": False},
)
@click.argument("script", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--cluster", metavar="NAME", help="The cluster [default: #DISPATCH cluster=].")
@click.option("--reason", metavar="TEXT", help="Why it is submitted (recorded).")
@click.option("--parsable", is_flag=True, help="Print only the job id (as sbatch --parsable).")
@click.option("--watch", "then_watch", is_flag=True, help="Then watch it until it settles.")
@client_options
def sbatch(
    target: Target,
    script: Path,
    args: tuple[str, ...],
    cluster: str | None,
    reason: str | None,
    parsable: bool,
    then_watch: bool,
) -> int:
    """Submit a plain Slurm batch script as a dispatch job: its #SBATCH lines as sbatch
    reads them, its #DISPATCH lines for what dispatch adds (plain sbatch runs the same
    script: there they are comments). ARGS are the script's arguments. The job runs in
    this directory, as with sbatch.

    \b
    #DISPATCH lines (before the script's first command, like #SBATCH):
      #DISPATCH resubmit on=preempted,node-lost budget=3
      #DISPATCH hold on=non-zero-exit for=12h
      #DISPATCH escalate on=out-of-memory
      #DISPATCH checkpoint=/ckpt/{job}      (DISPATCH_CHECKPOINT; {job}: the job id)
      #DISPATCH cluster=slurm               (when --cluster is not given)
      #DISPATCH free-if-progress            (progress-aware budgets, when supported)

    \b
    Examples:
      dispatch sbatch examples/slurm/digits.sbatch
      dispatch sbatch --cluster slurm train.sbatch --epochs 10
      job=$(dispatch sbatch --parsable train.sbatch)
    """
    body = build_sbatch_submission(script, args, cluster=cluster, chdir=os.getcwd(), reason=reason)
    client = target.client()
    answer = client.submit(body, key=new_idempotency_key())
    if target.json:
        _json(answer)
    elif parsable:
        _echo(answer.job_id)
    else:
        _echo(f"Submitted dispatch job {answer.job_id} (plan: {plan_summary(answer.plan)})")
        uncovered = ", ".join(k.value for k in answer.plan.uncovered)
        if uncovered:
            _echo(f"uncovered: {uncovered} (an execution ending with one fails the job)")
        else:
            _echo("uncovered: none (every cause has a rule)")
        if not then_watch:
            _echo(f"follow it: {program()} watch {answer.job_id}")
    if then_watch:
        return _watch(client, answer.job_id, target.json)
    return EXIT_OK


# ------------------------------------------------------------------------------ reading


@cli.command(short_help="Show jobs, or one job in detail.")
@click.argument("job", required=False, shell_complete=complete_job_ids)
@click.option(
    "--state", "states", multiple=True, type=click.Choice([s.value for s in State]),
    help="Only jobs in this state (repeatable).",
)  # fmt: skip
@click.option(
    "--cluster", "clusters", multiple=True, metavar="NAME",
    help="Only jobs on this cluster (repeatable).",
)  # fmt: skip
@click.option(
    "--limit", type=click.IntRange(1), default=100, show_default=True,
    help="Most jobs on one page.",
)  # fmt: skip
@click.option(
    "--after", metavar="JOB",
    help="Start the page after this job id (the last line of a page names the next one).",
)  # fmt: skip
@click.option("--events", is_flag=True, help="With JOB: also print every event of its record.")
@client_options
def status(
    target: Target,
    job: str | None,
    states: tuple[str, ...],
    clusters: tuple[str, ...],
    limit: int,
    after: str | None,
    events: bool,
) -> int:
    """Show the jobs in a table, or one job in detail: its state and cause, the hold in
    force, its committed history and its escalations (with the command answering each).

    The table shows each job's cluster, age and latest published checkpoint (read from its
    checkpoint root when this machine sees that path), a page of --limit jobs at a time.

    \b
    Examples:
      dispatch status
      dispatch status --state held --state recovering --cluster slurm
      dispatch status --limit 20 --after digits-k3x9ab2c
      dispatch status digits-k3x9ab2c --events
    """
    client = target.client()
    if job is None:
        page = jobs_page(
            client,
            states=[State(s) for s in states],
            clusters=clusters,
            after=after,
            limit=limit,
        )
        if target.json:
            _json(page)
            return EXIT_OK
        if not page.jobs:
            filtered = states or clusters or after or page.unreadable
            _echo("no jobs" + (" match" if filtered else f" yet: {program()} submit FILE"))
        else:
            _echo(rows_table(page.jobs, datetime.now(UTC)))
            if page.next_after is not None:
                more = [f"{program()} status", *(f"--state {s}" for s in states)]
                more += [*(f"--cluster {shlex.quote(c)}" for c in clusters)]
                more += [f"--limit {limit}", f"--after {page.next_after}"]
                _echo(f"more: {' '.join(more)}")
        for line in unreadable_lines(page.unreadable):
            _echo(line)
        return EXIT_OK
    current = client.status(job)
    escalations = client.escalations(job_id=job).escalations
    record = client.record(job)
    if target.json:
        _json(
            {
                "status": current,
                "escalations": escalations,
                **({"events": record.events} if events else {}),
            }
        )
        return EXIT_OK
    created = next((e.event for e in record.events if isinstance(e.event, JobCreated)), None)
    cluster = created.spec.cluster if created is not None else None
    command = None
    if created is not None:
        command = shlex.join(created.spec.command) or (
            f"(script, {len(created.spec.script.splitlines())} lines)"
            if created.spec.script
            else None
        )
    _echo(status_detail(current, escalations, cluster=cluster, command=command))
    where = _output_location(target, job)
    if where:
        _echo(where)
    if events:
        _echo("record")
        for entry in record.events:
            _echo(event_line(entry.seq, entry.event))
    return EXIT_OK


def _watch(client: ApiClient, job_id: str, as_json: bool) -> int:
    watcher = Watcher(client, job_id, emit=_echo, json_lines=as_json, say=_err)
    final = watcher.run()
    if not as_json:
        _echo(f"job {job_id} settled: {final.state.value}")
    return EXIT_OK if final.state is State.SUCCEEDED else EXIT_WATCH_UNSUCCESSFUL


@cli.command(short_help="Follow a job's status live until it settles.")
@click.argument("job", shell_complete=complete_job_ids)
@client_options
def watch(target: Target, job: str) -> int:
    """Follow a job live: one line per Status change, until the job settles (exit 0 if
    it succeeded, 8 if it failed or was cancelled). A transition the stream skipped is
    shown from the record. Ctrl-C stops watching (the job goes on). A job whose record
    can't be read ends the watch at once (exit 9: retrying won't help).

    \b
    Examples:
      dispatch watch digits-k3x9ab2c
      dispatch watch digits-k3x9ab2c --json | jq -r .state
    """
    return _watch(target.client(), job, target.json)


def _sdk(target: Target, *, timeout_s: float = 30.0) -> Client:
    return Client(target.url, target.token, timeout_s=timeout_s)


def _output_location(target: Target, job: str) -> str:
    """``output: <where> (dispatch logs JOB)`` for ``status JOB``; empty when the API can't
    say (nothing launched yet, a backend that reads no output, an observer not answering)."""
    try:
        with _sdk(target, timeout_s=10.0).logs(job, limit=0) as answer:
            where = answer.location or answer.object
            return f"output: {where}  (execution {answer.execution}: {program()} logs {job})"
    except CliError:
        return ""


@cli.command(short_help="Print a job's output (stdout or stderr).")
@click.argument("job", shell_complete=complete_job_ids)
@click.option(
    "--execution", type=click.IntRange(1), metavar="N",
    help="The execution (submission N) to show [default: the latest].",
)  # fmt: skip
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the execution ends.")
@click.option("--stderr", is_flag=True, help="Print the standard error instead.")
@raw_client_options
def logs(target: Target, job: str, execution: int | None, follow: bool, stderr: bool) -> int:
    """Print the output of a job's execution, read where the cluster keeps it (local: the
    object's files; Slurm: the job's output file; Kubeflow: the trainer node-0 pod's log) by
    the cluster's observer. With --follow
    new output is printed as it comes and the command ends when the execution ends (one
    not launched yet is waited for). `dispatch status JOB` shows where the output is.

    \b
    Examples:
      dispatch logs digits-k3x9ab2c
      dispatch logs digits-k3x9ab2c --follow
      dispatch logs digits-k3x9ab2c --execution 1 --stderr
    """
    out = sys.stdout.buffer
    with _sdk(target).logs(job, execution=execution, stderr=stderr, follow=follow) as answer:
        for data in answer:
            out.write(data)
            out.flush()
    return EXIT_OK


@cli.command(short_help="List escalations waiting for a person.")
@click.option("--all", "show_all", is_flag=True, help="Every escalation, answered or not.")
@click.option("--job", metavar="JOB", help="Only this job's.")
@click.option("--undelivered", is_flag=True, help="Only those no channel has accepted yet.")
@client_options
def escalations(target: Target, show_all: bool, job: str | None, undelivered: bool) -> int:
    """List escalations: dispatch asking a person to decide. By default those still open:
    not delivered yet, or not answered yet (a hold still in force, a launch nobody
    abandoned, a failure nobody has superseded, anything of a job that can still act).
    Each id's prefix says what happened; `dispatch status JOB` shows the command that
    answers it.

    \b
    Examples:
      dispatch escalations
      dispatch escalations --all --job digits-k3x9ab2c
    """
    client = target.client()
    listing = client.escalations(job_id=job, delivered=False if undelivered else None)
    found = listing.escalations
    if not show_all and not undelivered:
        jobs = {j.job_id: j for j in client.jobs().jobs}
        found = tuple(e for e in found if _is_open(e, jobs.get(e.job_id)))
    if target.json:
        _json({"escalations": found, "unreadable": listing.unreadable})
        return EXIT_OK
    if not found:
        _echo("no escalations" + ("" if show_all else " open (--all shows every one)"))
    else:
        _echo(escalations_table(found))
        _echo(f"answer each by its id: `{program()} status JOB` shows how")
    # a job whose record can't be read may hold escalations nobody can list
    for line in unreadable_lines(listing.unreadable):
        _echo(line)
    return EXIT_OK


def _is_open(escalation: EscalationView, job: JobSummary | None) -> bool:
    """Whether an escalation still waits for a person: the core's rule (seed 002,
    :func:`dispatch_core.escalation_open`), from the job's summary (no abandoned targets: an
    abandoned ``unmatched:``/``foreign:`` one stays listed until the job settles)."""
    return escalation_open(escalation.id, delivered=escalation.delivered is not None, job=job)


@cli.command(short_help="Print a job's record, event by event.")
@click.argument("job", shell_complete=complete_job_ids)
@click.option("--after", type=click.IntRange(0), default=0, help="Only events after this seq.")
@client_options
def record(target: Target, job: str, after: int) -> int:
    """Print a job's record: every event, with its seq, oldest first.

    \b
    Example:
      dispatch record digits-k3x9ab2c
    """
    answer = target.client().record(job, after)
    if target.json:
        _json(answer)
    else:
        for entry in answer.events:
            _echo(event_line(entry.seq, entry.event))
    return EXIT_OK


# ------------------------------------------------------------------ operator commands


def _show_command(target: Target, answer: CommandResponse) -> None:
    if target.json:
        _json(answer)
        return
    note = " (answered from an earlier identical request)" if answer.replayed else ""
    _echo(f"{answer.command}: committed to job {answer.job_id}{note}")
    for entry in answer.events:
        _echo("  " + event_line(entry.seq, entry.event).lstrip())
    _echo("  now: " + status_line(answer.status))
    if answer.new_job_id is not None:
        _echo(f"new job {answer.new_job_id} supersedes {answer.job_id}")
        if answer.plan is not None:
            for line in plan_lines(answer.plan):
                _echo(line)
        _echo(f"follow it:    {program()} watch {answer.new_job_id}")


_REASON = click.option(
    "--reason", "-r", required=True, metavar="TEXT",
    help="Why, in your words (required; recorded with the command).",
)  # fmt: skip


def _operator(name: str, short: str, help_text: str, example: str) -> None:
    """Register a command taking only JOB and --reason."""

    @_REASON
    @click.argument("job", shell_complete=complete_job_ids)
    @client_options
    def command(target: Target, job: str, reason: str) -> int:
        answer = target.client().command(job, name, {"reason": reason}, key=new_idempotency_key())
        _show_command(target, answer)
        return EXIT_OK

    command.__doc__ = f"{help_text}\n\n\b\nExample:\n  {example}"
    cli.command(name, short_help=short)(command)


@cli.command(short_help="Hold a job until it is released.")
@click.argument("job", shell_complete=complete_job_ids)
@_REASON
@click.option(
    "--for", "for_", metavar="DURATION", default="24h", show_default=True,
    help="Until the hold is overdue (escalated overdue:<n>; it stays in force).",
)  # fmt: skip
@client_options
def hold(target: Target, job: str, reason: str, for_: str) -> int:
    """Hold a job: nothing of it is launched and no gate opens until it is released.

    \b
    Example:
      dispatch hold digits-k3x9ab2c --reason "node maintenance tonight" --for 12h
    """
    body = {"reason": reason, "for_s": parse_duration(for_, option="--for")}
    _show_command(target, target.client().command(job, "hold", body, key=new_idempotency_key()))
    return EXIT_OK


_operator(
    "release",
    "Release an actor's hold.",
    "Release the hold an actor placed (a recovery hold is refused: resubmit, cancel or "
    "give up instead). Releasing someone else's hold is recorded as an override.",
    'dispatch release digits-k3x9ab2c --reason "maintenance done"',
)
_operator(
    "resubmit",
    "Run a new submission of a job under a recovery hold.",
    "Run a new submission of a job under a recovery hold (spends no rule's budget).",
    'dispatch resubmit digits-k3x9ab2c --reason "bad node drained, try again"',
)
_operator(
    "cancel",
    "Cancel a job.",
    "Cancel a job: stop its objects; its outcome becomes cancelled.",
    'dispatch cancel digits-k3x9ab2c --reason "wrong learning rate"',
)
_operator(
    "give-up",
    "Fail a held job with the cause that ended it.",
    "Fail a held job with the cause that ended it (records the decision).",
    'dispatch give-up digits-k3x9ab2c --reason "OOM at every size we tried"',
)


@cli.command(short_help="Close an unknown launch or a foreign object.")
@click.argument("job", shell_complete=complete_job_ids)
@_REASON
@click.option("--submission", type=click.IntRange(1), help="N of all-unknown:<N> (alone).")
@click.option(
    "--attempt", type=click.IntRange(1), help="a of unmatched:<N>/<a> (with --submission)."
)
@click.option("--foreign", metavar="CLUSTER/ID", help="The object of foreign:<id>.")
@client_options
def abandon(
    target: Target,
    job: str,
    reason: str,
    submission: int | None,
    attempt: int | None,
    foreign: str | None,
) -> int:
    """Close a launch whose outcome nobody knows, or dispose of a foreign object (a human
    token only). Check the scheduler first: there must be no object for it.

    \b
    Examples:
      dispatch abandon digits-k3x9ab2c --submission 2 --reason "no such job in squeue"
      dispatch abandon digits-k3x9ab2c --submission 2 --attempt 1 --reason "not in squeue"
      dispatch abandon digits-k3x9ab2c --foreign slurm/81234 --reason "site plugin rewrite"
    """
    if (foreign is None) == (submission is None):
        raise UsageError("give either --submission N [--attempt A] or --foreign CLUSTER/ID")
    target_body: dict[str, Any]
    if foreign is not None:
        if attempt is not None:
            raise UsageError("abandon: --attempt goes with --submission, not --foreign")
        cluster, sep, object_id = foreign.partition("/")
        if not sep or not cluster or not object_id:
            raise UsageError(f"--foreign: {foreign!r} is not CLUSTER/ID (e.g. slurm/81234)")
        target_body = {"foreign": {"cluster": cluster, "id": object_id}}
    else:
        target_body = {"submission": submission}
        if attempt is not None:
            target_body["attempt"] = attempt
    body = {"reason": reason, "target": target_body}
    _show_command(target, target.client().command(job, "abandon", body, key=new_idempotency_key()))
    return EXIT_OK


@cli.command(short_help="Run a finished job again as a new job.")
@click.argument("job", shell_complete=complete_job_ids)
@_REASON
@click.option("--new-job-id", metavar="ID", help="The new job's id.")
@click.option("--name", metavar="NAME", help="Prefix of the new id the API makes.")
@client_options
def supersede(
    target: Target, job: str, reason: str, new_job_id: str | None, name: str | None
) -> int:
    """Run a finished job again as a new job: same spec, a higher epoch (its checkpoints
    outrank the old job's, and it can resume from them), linked both ways.

    \b
    Example:
      dispatch supersede digits-k3x9ab2c --reason "fixed the data path"
    """
    body: dict[str, Any] = {"reason": reason}
    if new_job_id:
        body["new_job_id"] = new_job_id
    if name:
        body["name"] = name
    answer = target.client().command(job, "supersede", body, key=new_idempotency_key())
    _show_command(target, answer)
    return EXIT_OK


_operator(
    "emergency-stop",
    "Kill every live object of a job at once.",
    "Kill every live object of a job at once, without waiting (cancels a job without an outcome).",
    'dispatch emergency-stop digits-k3x9ab2c --reason "writing to the wrong bucket"',
)


# ------------------------------------------------------------------------------ nats


@cli.group(short_help="NATS identities, permissions and server configuration of a site.")
def nats() -> None:
    """NATS identities and the nats-server configuration that enforces their permissions
    (deploy/nats/README.md).

    Every dispatch service connects with its own identity (api, supervisor, notifier,
    observer-<cluster>), and nats-server lets each publish and subscribe only what its work
    needs; nobody may delete or purge a stream or consumer; there is no anonymous access.
    `dispatch up` does all of this by itself for its private server; `dispatch nats init`
    does it for a site that runs its own NATS.

    \b
    Example:
      dispatch nats init --out site-nats --cluster slurm   # then see site-nats/
    """


def _server_spec(text: str, *, route_port: int) -> Any:
    """``NAME=HOST:PORT[:ROUTE_PORT]`` -> a ``ServerSpec``."""
    from dispatch_cli.natsite import ServerSpec

    name, sep, where = text.partition("=")
    if not sep:
        name, where = "", text
    parts = where.split(":")
    if len(parts) == 3 and parts[2].isdigit():
        route_port = int(parts.pop())
    host, port = ":".join(parts[:-1]), parts[-1]
    if not host or not port.isdigit():
        raise UsageError(
            f"--server {text!r}: use NAME=HOST:PORT[:ROUTE_PORT] (e.g. n1=nats1.example:4222)"
        )
    return ServerSpec(
        name=name or host.split(".")[0], host=host, port=int(port), route_port=route_port
    )


@nats.command("init", short_help="Make a site's identities and nats-server configuration.")
@click.option(
    "--out", required=True, type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write into (identities/, the server configuration(s), env/).",
)  # fmt: skip
@click.option(
    "--cluster", "clusters", multiple=True, required=True, metavar="NAME",
    help="A cluster dispatch serves (one observer identity each); repeat for several.",
)  # fmt: skip
@click.option(
    "--server", "servers", multiple=True, metavar="NAME=HOST:PORT[:ROUTE_PORT]",
    help="A nats-server of the site (where clients and the other servers reach it); give 3 "
    "for a JetStream cluster [default: one server, local=127.0.0.1:4222].",
)  # fmt: skip
@click.option("--route-port", type=click.IntRange(1, 65535), default=6222, show_default=True,
              help="Cluster route port of the servers that name none.")  # fmt: skip
@click.option("--listen", default="0.0.0.0", show_default=True,
              help="Address the servers listen on.")  # fmt: skip
@click.option("--store-dir", default="/var/lib/nats/{server}", show_default=True,
              help="JetStream store directory ({server}: the server's name).")  # fmt: skip
@click.option("--namespace", default="", help="The installation's namespace (default: none).")
@click.option("--tls-cert", metavar="FILE", default="",
              help="Server certificate (PEM; {server}: its name); enables TLS.")  # fmt: skip
@click.option("--tls-key", metavar="FILE", default="", help="Its key (PEM; {server} too).")
@click.option("--tls-ca", metavar="FILE", default="",
              help="CA bundle: signs the servers' certificates (the services trust it) and, "
              "with --tls-verify, the clients'.")  # fmt: skip
@click.option("--tls-verify", is_flag=True,
              help="Require a client certificate from every service.")  # fmt: skip
@click.option("--client-cert", metavar="FILE", default="",
              help="Client certificate the services present (with --tls-verify).")  # fmt: skip
@click.option("--client-key", metavar="FILE", default="", help="Its key.")
@click.option("--supervisor-durable", default="supervisor", show_default=True,
              help="SUPERVISOR_DURABLE of the site's supervisors.")  # fmt: skip
@click.option("--notifier-durable", default="notifier", show_default=True,
              help="NOTIFIER_DURABLE of the site's notifiers.")  # fmt: skip
def nats_init(
    out: Path,
    clusters: tuple[str, ...],
    servers: tuple[str, ...],
    route_port: int,
    listen: str,
    store_dir: str,
    namespace: str,
    tls_cert: str,
    tls_key: str,
    tls_ca: str,
    tls_verify: bool,
    client_cert: str,
    client_key: str,
    supervisor_durable: str,
    notifier_durable: str,
) -> int:
    """Make (or reuse) one nkey identity per service under OUT/identities/ (seed files,
    mode 0600: copy each to its service's host only), and write the nats-server
    configuration enforcing their permissions (OUT/nats-server.conf, or OUT/<server>.conf
    per server of a cluster; public keys only, no secret) and each service's NATS variables
    (OUT/env/<identity>.env: paths and URLs, no secret).

    Run it again to add a cluster or change servers: existing identities are kept. To
    rotate one, delete OUT/identities/<identity>.nk, run it again, install the new seed and
    the new configuration, and reload the servers (`nats-server --signal reload`).

    \b
    Examples:
      # one server on this host:
      dispatch nats init --out /etc/dispatch/nats --cluster slurm
      # a 3-server JetStream cluster with TLS:
      dispatch nats init --out site --cluster slurm --cluster k8s \
        --server n1=nats1.example:4222 --server n2=nats2.example:4222 \
        --server n3=nats3.example:4222 \
        --tls-cert /etc/nats/{server}.pem --tls-key /etc/nats/{server}-key.pem \
        --tls-ca /etc/nats/ca.pem
    """
    from dispatch_cli.natsite import write_site
    from dispatch_nats import InvalidName, Layout
    from dispatch_nats.identities import IdentityError

    specs = [_server_spec(s, route_port=route_port) for s in servers] or [
        _server_spec("local=127.0.0.1:4222", route_port=route_port)
    ]
    try:
        site = write_site(
            out,
            clusters=clusters,
            servers=specs,
            layout=Layout(namespace=namespace),
            store_dir=store_dir,
            listen_host=listen,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_ca=tls_ca,
            tls_verify=tls_verify,
            client_cert=client_cert,
            client_key=client_key,
            supervisor_durable=supervisor_durable,
            notifier_durable=notifier_durable,
        )
    except (ValueError, InvalidName) as err:
        raise UsageError(str(err)) from None
    except IdentityError as err:
        raise CliError(str(err)) from None
    _echo(f"identities (seeds, 0600; copy each to its service only): {site.identities_dir}/")
    for ident in sorted(p.name for p in site.identities_dir.glob("*.nk")):
        _echo(f"  {ident}")
    _echo("server configuration (public keys only):")
    for name, path in site.configs.items():
        _echo(f"  {name}: {path}")
    _echo("services' NATS variables (paths, no secret):")
    for name, path in site.env_files.items():
        _echo(f"  {name}: {path}")
    return EXIT_OK


# ------------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return its exit status (see :mod:`dispatch_cli.errors`)."""
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name="dispatch",
                          standalone_mode=False)  # fmt: skip
    except click.exceptions.Abort:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except CliError as err:
        _err(f"error: {err.message}")
        return err.exit_code
    except BrokenPipeError:
        # `dispatch status | head`: the reader went away; that is not a failure.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    return result if isinstance(result, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
