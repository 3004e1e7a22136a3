#!/usr/bin/env bash
# slurm-cluster.sh: dispatch's Slurm test cluster on one Debian 12 machine.
#
# A real Slurm 22.05 from Debian's packages: one munged, one slurmctld and
# SLURM_LAB_NODES slurmd processes, each acting as a separate node
# (node1..nodeN, all on 127.0.0.1, one port each). With accounting (the
# default) also a MariaDB server and slurmdbd, so that sacct works as on a
# real site. Needs root and a machine without systemd: every daemon is
# started by hand, and only daemons this script started (pid files in
# $SLURM_LAB_DIR/run) are ever stopped. See deploy/slurm/README.md.
#
# Usage:
#   slurm-cluster.sh start [--accounting|--no-accounting] [--fresh]
#       install what is missing, (re)configure, start what is not running,
#       wait until every node is usable; prints "slurm-cluster: READY ...".
#       Idempotent; restarts the daemons it started if the config changed.
#   slurm-cluster.sh stop [--purge] [--keep-jobs]
#       cancel jobs, stop the daemons this script started. --purge also
#       deletes $SLURM_LAB_DIR (state, logs, database) and the generated
#       /etc/slurm/*.conf.
#   slurm-cluster.sh status
#       print what runs; exit 0 if the cluster is up and every node usable,
#       3 if nothing of it runs, 1 otherwise.
#   slurm-cluster.sh --help
#
# Settings (environment variables, defaults in brackets):
#   SLURM_LAB_DIR            state, spool, logs, database, pids  [/tmp/dispatch-slurm]
#   SLURM_LAB_ACCOUNTING     1: slurmdbd + MariaDB, sacct works;
#                            0: no accounting, jobcomp/filetxt only   [1]
#   SLURM_LAB_NODES          number of simulated nodes                [3]
#   SLURM_LAB_CPUS           CPUs declared per node                   [2]
#   SLURM_LAB_MEM_MB         RealMemory declared per node (MB)        [2000]
#   SLURM_LAB_CLUSTER        ClusterName (as in sacct/sacctmgr)       [dispatch]
#   SLURM_LAB_PORT_BASE      slurmd port of node1 (node i: +i-1)      [17001]
#   SLURM_LAB_CTLD_PORT      slurmctld port                           [6817]
#   SLURM_LAB_DBD_PORT       slurmdbd port                            [6819]
#   SLURM_LAB_DB_PORT        MariaDB port (127.0.0.1 only)            [13306]
#   SLURM_LAB_MIN_JOB_AGE    MinJobAge: s a finished job stays in
#                            squeue/scontrol (short for tests; Slurm's
#                            default is 300)                          [30]
#   SLURM_LAB_KILL_WAIT      KillWait: s between SIGTERM and SIGKILL  [10]
#   SLURM_LAB_SLURMD_TIMEOUT SlurmdTimeout: s before a silent node
#                            is declared DOWN                         [20]
#   SLURM_LAB_CRED_EXPIRE    AuthInfo cred_expire (>= 5); a requeued
#                            job waits this + 1 s before it may start [10]
#   SLURM_LAB_STORE_COMMENT  1: AccountingStoreFlags=job_comment (sacct
#                            shows --comment); 0: Slurm's default     [0]
#   SLURM_LAB_CGROUP         1: proctrack/task cgroup (cgroup v1 only;
#                            OOM gives OUT_OF_MEMORY); 0: linuxproc
#                            + OverMemoryKill                         [0]
#   SLURM_LAB_WAIT           max seconds to wait for READY            [90]
#   SLURM_LAB_FRESH          1: wipe saved jobs, node state, logs
#                            (with the jobcomp file) and accounting
#                            database first (cluster must be
#                            stopped); job ids start at 1; = --fresh  [0]
#   SLURM_LAB_FORCE          1: replace /etc/slurm files that this
#                            script did not write (a backup is kept)  [0]
#   SLURM_LAB_CANCEL_WAIT    stop: s to wait for cancelled jobs       [45]
#   SLURM_LAB_KEEP_JOBS      stop: 1 = do not cancel jobs; = --keep-jobs [0]
#   SLURM_LAB_USERS          Unix users created for jobs that run as
#                            their owners (issue 16; with accounting,
#                            each gets an association in account
#                            "dispatch-users"); dispatch's backend
#                            acts for them through sudo, which is
#                            installed too, with a service user
#                            dj-dispatch, group dispatch-users and
#                            /etc/sudoers.d/dispatch-test (the
#                            shipped rule)                 [dj-alice dj-bob]
set -euo pipefail

PROG=slurm-cluster
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

CMD=${1:-}
[ $# -gt 0 ] && shift
case "$CMD" in
    start|stop|status) ;;
    -h|--help|help) usage; exit 0 ;;
    "") usage >&2; exit 2 ;;
    *) echo "$PROG: unknown command '$CMD' (start, stop, status, --help)" >&2; exit 2 ;;
esac

LAB_DIR=${SLURM_LAB_DIR:-/tmp/dispatch-slurm}
ACCOUNTING=${SLURM_LAB_ACCOUNTING:-1}
NODES=${SLURM_LAB_NODES:-3}
CPUS=${SLURM_LAB_CPUS:-2}
MEM_MB=${SLURM_LAB_MEM_MB:-2000}
CLUSTER=${SLURM_LAB_CLUSTER:-dispatch}
PORT_BASE=${SLURM_LAB_PORT_BASE:-17001}
CTLD_PORT=${SLURM_LAB_CTLD_PORT:-6817}
DBD_PORT=${SLURM_LAB_DBD_PORT:-6819}
DB_PORT=${SLURM_LAB_DB_PORT:-13306}
MIN_JOB_AGE=${SLURM_LAB_MIN_JOB_AGE:-30}
KILL_WAIT=${SLURM_LAB_KILL_WAIT:-10}
SLURMD_TIMEOUT=${SLURM_LAB_SLURMD_TIMEOUT:-20}
CRED_EXPIRE=${SLURM_LAB_CRED_EXPIRE:-10}
STORE_COMMENT=${SLURM_LAB_STORE_COMMENT:-0}
CGROUP=${SLURM_LAB_CGROUP:-0}
WAIT=${SLURM_LAB_WAIT:-90}
FRESH=${SLURM_LAB_FRESH:-0}
FORCE=${SLURM_LAB_FORCE:-0}
CANCEL_WAIT=${SLURM_LAB_CANCEL_WAIT:-45}
KEEP_JOBS=${SLURM_LAB_KEEP_JOBS:-0}
USERS=${SLURM_LAB_USERS-dj-alice dj-bob}
TOP=$(cd "$(dirname "$0")/.." && pwd)
PURGE=0

while [ $# -gt 0 ]; do
    case "$CMD:$1" in
        start:--accounting) ACCOUNTING=1 ;;
        start:--no-accounting) ACCOUNTING=0 ;;
        start:--fresh) FRESH=1 ;;
        stop:--purge) PURGE=1 ;;
        stop:--keep-jobs) KEEP_JOBS=1 ;;
        *) echo "$PROG: unknown option '$1' for '$CMD' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

ETC=/etc/slurm
CONF=$ETC/slurm.conf
CGCONF=$ETC/cgroup.conf
DBDCONF=$ETC/slurmdbd.conf
MARK="# dispatch: generated by scripts/slurm-cluster.sh; edit the script, not this file"
RUN=$LAB_DIR/run
LOGD=$LAB_DIR/log
STATE=$LAB_DIR/state
SPOOL=$LAB_DIR/spool
# MariaDB runs as user mysql: its data, socket and pid file live in a
# directory of its own
MDB=$LAB_DIR/mariadb
DATADIR=$MDB/data
DBRUN=$MDB/run
DBPID=$DBRUN/mariadbd.pid
DBSOCK=$DBRUN/mariadbd.sock
DBNAME=slurm_acct_db
SLURM_PKGS=(munge slurmctld slurmd slurm-client sudo)
DBD_PKGS=(slurmdbd slurm-wlm-mysql-plugin mariadb-server mariadb-client)

log() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
# tail_log FILE...: the last lines of each existing log, to stderr
tail_log() {
    local f
    for f in "$@"; do
        [ -s "$f" ] || continue
        printf -- '--- last lines of %s\n' "$f" >&2
        tail -n 25 "$f" >&2
    done
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
T_START=$(now)

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts daemons)"
case "$LAB_DIR" in /?*) ;; *) die "SLURM_LAB_DIR must be an absolute path, got '$LAB_DIR'" ;; esac
for v in NODES CPUS MEM_MB PORT_BASE CTLD_PORT DBD_PORT DB_PORT MIN_JOB_AGE KILL_WAIT SLURMD_TIMEOUT CRED_EXPIRE WAIT CANCEL_WAIT; do
    val=${!v}
    [[ "$val" =~ ^[0-9]+$ ]] || die "SLURM_LAB_$v must be a non-negative integer, got '$val'"
done
for v in ACCOUNTING STORE_COMMENT CGROUP FRESH FORCE KEEP_JOBS; do
    case "${!v}" in 0|1) ;; *) die "SLURM_LAB_$v must be 0 or 1, got '${!v}'" ;; esac
done
[[ "$CLUSTER" =~ ^[a-z][a-z0-9_]*$ ]] || die "SLURM_LAB_CLUSTER must be lowercase letters, digits, '_', got '$CLUSTER'"

# ---------------------------------------------------------------- process helpers
pid_of() { head -n 1 "$1" 2> /dev/null | tr -dc '0-9'; }
# pid_alive PIDFILE NAME: the pid in PIDFILE is running and is program NAME
pid_alive() {
    local pid
    pid=$(pid_of "$1")
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2> /dev/null || true)" = "$2" ]
}
# daemon_of PIDFILE: the program name a pid file of ours belongs to
daemon_of() {
    case "${1##*/}" in
        slurmd-*.pid) echo slurmd ;;
        *.pid) basename "$1" .pid ;;
    esac
}
# stop_pidfiles SECONDS PIDFILE...: SIGTERM to each live daemon of the pid
# files (all at once), wait up to SECONDS for all of them, SIGKILL what is
# left; the pid files are removed
stop_pidfiles() {
    local secs=$1 f pid i left
    shift
    local pids=() names=()
    for f in "$@"; do
        [ -e "$f" ] || continue
        if pid_alive "$f" "$(daemon_of "$f")"; then
            pid=$(pid_of "$f")
            kill -TERM "$pid" 2> /dev/null || true
            pids+=("$pid"); names+=("$(daemon_of "$f")")
        fi
    done
    [ "${#pids[@]}" -gt 0 ] || { rm -f "$@"; return 0; }
    for i in $(seq 1 $((secs * 10))); do
        left=0
        for pid in "${pids[@]}"; do [ -d "/proc/$pid" ] && left=1; done
        [ "$left" = 0 ] && break
        sleep 0.1
    done
    for i in "${!pids[@]}"; do
        pid=${pids[$i]}
        if [ -d "/proc/$pid" ]; then
            log "${names[$i]} (pid $pid) ignored SIGTERM for $secs s; sending SIGKILL"
            kill -KILL "$pid" 2> /dev/null || true
        fi
        log "stopped ${names[$i]} (pid $pid)"
    done
    rm -f "$@"
}
# wait_pidfile PIDFILE NAME SECONDS: until the daemon wrote a live pid file
wait_pidfile() {
    local i
    for i in $(seq 1 $(($3 * 10))); do
        pid_alive "$1" "$2" && return 0
        sleep 0.1
    done
    return 1
}
# kill_tree PID: SIGKILL PID and every process below it (found via /proc)
kill_tree() {
    local tree=("$1") i=0 p ppid
    while [ "$i" -lt "${#tree[@]}" ]; do
        for p in /proc/[0-9]*; do
            ppid=$(sed 's/.*) //' "$p/stat" 2> /dev/null | cut -d' ' -f2) || continue
            [ "$ppid" = "${tree[$i]}" ] && tree+=("${p#/proc/}")
        done
        i=$((i + 1))
    done
    kill -KILL "${tree[@]}" 2> /dev/null || true
}
munge_ok() { munge -n 2> /dev/null | unmunge > /dev/null 2>&1; }
ours() { [ -e "$1" ] && [ "$(head -n 1 "$1")" = "$MARK" ]; }
# the mode the installed config was generated for (empty: none of ours)
installed_accounting() {
    ours "$CONF" || return 0
    if grep -q '^AccountingStorageType=accounting_storage/slurmdbd' "$CONF"; then echo 1; else echo 0; fi
}
db() { mariadb --no-defaults --protocol=socket -S "$DBSOCK" -u root; }

# One invocation at a time (concurrent test sessions may call start). status
# and stop do not create the lab dir. Every daemon is started with fd 9
# closed ("9>&-"), or it would hold the lock for its whole life.
[ "$CMD" = start ] && mkdir -p "$LAB_DIR"
if [ -d "$LAB_DIR" ]; then
    exec 9> "$LAB_DIR/.lock"
    flock -w 300 9 || die "another $PROG holds $LAB_DIR/.lock for 300 s"
fi

# ================================================================ status
if [ "$CMD" = status ]; then
    acct=$(installed_accounting)
    any=0 all=1
    show() { # show NAME PIDFILE
        if pid_alive "$2" "$1"; then printf '  %-16s running (pid %s)\n' "${2##*/}" "$(pid_of "$2")"; any=1
        else printf '  %-16s not running\n' "${2##*/}"; all=0; fi
    }
    echo "lab dir: $LAB_DIR; config: $( [ -n "$acct" ] && echo "$CONF ($( [ "$acct" = 1 ] && echo with || echo without) accounting)" || echo "none of ours in $ETC")"
    if munge_ok; then echo "  munged           working$(pid_alive "$RUN/munged.pid" munged && echo " (started by us, pid $(pid_of "$RUN/munged.pid"))")"
    else echo "  munged           not working"; all=0; fi
    if [ "$acct" = 1 ]; then
        show mariadbd "$DBPID"
        show slurmdbd "$RUN/slurmdbd.pid"
    fi
    show slurmctld "$RUN/slurmctld.pid"
    n=0
    for f in "$RUN"/slurmd-node*.pid; do [ -e "$f" ] || continue; show slurmd "$f"; n=$((n + 1)); done
    [ "$n" -gt 0 ] || { echo "  slurmd           none"; all=0; }
    [ "$any" = 1 ] || exit 3
    if [ "$all" = 1 ] && scontrol ping 2> /dev/null | grep -q 'is UP'; then
        sinfo -N -h -o '  %N %T %E' 2> /dev/null | sort -u
        bad=$(sinfo -N -h -o '%T' 2> /dev/null | grep -cvE '^(idle|allocated|mixed|completing)$' || true)
        [ "$bad" = 0 ] && { echo "status: up"; exit 0; }
        echo "status: up, but not every node is usable"; exit 1
    fi
    echo "status: partly running"; exit 1
fi

# ================================================================ stop
if [ "$CMD" = stop ]; then
    T0=$(now)
    stopped_any=0
    if [ -d "$RUN" ]; then
        # 1. cancel jobs so that no job processes outlive their slurmd
        if [ "$KEEP_JOBS" != 1 ] && pid_alive "$RUN/slurmctld.pid" slurmctld && command -v squeue > /dev/null; then
            ids=$(squeue -h -t PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING,REQUEUED,RESIZING,SIGNALING,STAGE_OUT -o %i 2> /dev/null || true)
            if [ -n "$ids" ]; then
                log "cancelling jobs: $(tr '\n' ' ' <<< "$ids")"
                # shellcheck disable=SC2086
                scancel $ids 2> /dev/null || true
                deadline=$(( $(date +%s) + CANCEL_WAIT ))
                while [ -n "$(squeue -h -t RUNNING,COMPLETING,SUSPENDED -o %i 2> /dev/null || true)" ] &&
                      [ "$(date +%s)" -lt "$deadline" ]; do
                    sleep 0.5
                done
            fi
        fi
        # 2. slurmd, slurmctld, slurmdbd, MariaDB, munged (only if ours)
        for f in "$RUN"/slurmd-node*.pid; do pid_alive "$f" slurmd && stopped_any=1; done
        for d in slurmctld slurmdbd; do pid_alive "$RUN/$d.pid" "$d" && stopped_any=1; done
        pid_alive "$DBPID" mariadbd && stopped_any=1
        # munged only if it is still the one this script started
        last=()
        if [ -e "$RUN/munged.pid" ]; then
            if pid_alive "$RUN/munged.pid" munged && [ "$(pid_of "$RUN/munged.pid")" = "$(pid_of /run/munge/munged.pid)" ]; then
                stopped_any=1
                last+=("$RUN/munged.pid")
            else
                rm -f "$RUN/munged.pid"
            fi
        fi
        # slurmdbd after slurmctld, which reports to it; then MariaDB and
        # munged (each daemon takes about 2 s to exit)
        stop_pidfiles 15 "$RUN"/slurmd-node*.pid "$RUN/slurmctld.pid"
        stop_pidfiles 15 "$RUN/slurmdbd.pid"
        stop_pidfiles 60 "$DBPID" "${last[@]}"
        # 3. slurmstepd processes left over by this cluster's slurmd, with the
        #    job processes under them: the daemons (and so slurmstepd) work
        #    in $LAB_DIR/log.
        for p in /proc/[0-9]*; do
            [ "$(cat "$p/comm" 2> /dev/null || true)" = slurmstepd ] || continue
            case "$(readlink "$p/cwd" 2> /dev/null || true)" in
                "$LOGD"|"$LOGD"/*)
                    log "killing leftover $(tr '\0' ' ' < "$p/cmdline" 2> /dev/null)(pid ${p#/proc/}) and its processes"
                    kill_tree "${p#/proc/}" ;;
            esac
        done
    fi
    [ "$stopped_any" = 1 ] || log "nothing was running from $RUN"
    if [ "$PURGE" = 1 ]; then
        for f in "$CONF" "$CGCONF" "$DBDCONF"; do
            if ours "$f"; then
                rm -f "$f"; log "removed $f"
                if [ -e "$f.before-dispatch" ]; then mv "$f.before-dispatch" "$f"; log "restored $f from $f.before-dispatch"; fi
            fi
        done
        # the lock file is in the lab dir; keep the fd, drop the tree
        rm -rf "$LAB_DIR"
        log "removed $LAB_DIR"
    fi
    log "stopped in $(since "$T0") s"
    exit 0
fi

# ================================================================ start
if [ "$ACCOUNTING" = 0 ] && [ "$STORE_COMMENT" = 1 ]; then
    log "note: SLURM_LAB_STORE_COMMENT=1 has no effect without accounting"
fi

# ---------------------------------------------------------------- install
want=("${SLURM_PKGS[@]}")
[ "$ACCOUNTING" = 1 ] && want+=("${DBD_PKGS[@]}")
# one dpkg-query for all (a package dpkg never saw is not listed at all)
installed=" $(dpkg-query -W -f='${Package}=${Status};' "${want[@]}" 2> /dev/null | tr ';' ' ' || true)"
missing=()
for p in "${want[@]}"; do
    case "$installed" in *" $p=install ok installed "*) ;; *) missing+=("$p") ;; esac
done
if [ "${#missing[@]}" -gt 0 ]; then
    T_INST=$(now)
    command -v apt-get > /dev/null || die "missing packages ${missing[*]} and no apt-get (Debian 12 expected)"
    log "installing ${missing[*]} from Debian packages"
    APTLOG=$(mktemp /tmp/slurm-cluster-apt.XXXXXX)
    # Package scripts must not start daemons with Debian's default paths (no
    # systemd; sysvinit scripts would). Only if no policy-rc.d exists; ours
    # is removed right after.
    own_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        own_policy=1
    fi
    apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >> "$APTLOG" 2>&1; }
    # apt-get update only when needed: no candidate for a package (empty or
    # old lists), or the install failed (e.g. a stale list points at a file
    # the mirror no longer has).
    need_update=0
    for p in "${missing[@]}"; do
        cand=$(apt-cache policy "$p" 2> /dev/null | sed -n 's/^ *Candidate: *//p')
        case "$cand" in ""|"(none)") need_update=1 ;; esac
    done
    rc=0
    if [ "$need_update" = 1 ]; then
        log "apt-get update (no candidate for some packages)"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >> "$APTLOG" 2>&1 || rc=$?
        [ "$rc" = 0 ] && { apt_install || rc=$?; }
    elif ! apt_install; then
        log "apt-get install failed; running apt-get update and retrying"
        rc=0
        DEBIAN_FRONTEND=noninteractive apt-get update -q >> "$APTLOG" 2>&1 || rc=$?
        [ "$rc" = 0 ] && { apt_install || rc=$?; }
    fi
    [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
    if [ "$rc" -ne 0 ]; then
        tail_log "$APTLOG"
        die "apt-get failed (rc=$rc); full log: $APTLOG"
    fi
    rm -f "$APTLOG"
    log "installed in $(since "$T_INST") s: $(dpkg-query -W -f='${Package} ${Version}  ' "${missing[@]}")"
fi
bins=(munged munge unmunge slurmctld slurmd sinfo scontrol sbatch sudo)
[ "$ACCOUNTING" = 1 ] && bins+=(slurmdbd sacctmgr sacct mariadbd mariadb mariadb-install-db mariadb-admin)
for b in "${bins[@]}"; do
    command -v "$b" > /dev/null || die "'$b' not found after install"
done

T_CONF=$(now)

running_any=0
for d in slurmctld slurmdbd; do pid_alive "$RUN/$d.pid" "$d" && running_any=1; done
pid_alive "$DBPID" mariadbd && running_any=1
for f in "$RUN"/slurmd-node*.pid; do pid_alive "$f" slurmd && running_any=1; done

if [ "$FRESH" = 1 ]; then
    [ "$running_any" = 0 ] || die "--fresh / SLURM_LAB_FRESH=1 but the cluster is running; run '$0 stop' first"
    log "fresh start: wiping $STATE, $SPOOL, $MDB and the logs in $LOGD"
    rm -rf "$STATE" "$SPOOL" "$MDB"
    rm -f "$LOGD"/*.log "$LOGD"/*.stderr
fi
mkdir -p "$LAB_DIR/etc" "$RUN" "$LOGD" "$STATE"
for i in $(seq 1 "$NODES"); do mkdir -p "$SPOOL/node$i"; done
chmod 0755 "$LAB_DIR" "$LAB_DIR/etc" "$RUN" "$LOGD" "$STATE" "$SPOOL"

# ---------------------------------------------------------------- config
# slurmd 22.05 initialises its cgroup plugin even with proctrack/linuxproc and
# task/none, and fails ("No filesystem mounted on /sys/fs/cgroup") if nothing
# is mounted there.
mountpoint -q /sys/fs/cgroup ||
    die "/sys/fs/cgroup is not mounted; slurmd 22.05 refuses to start without it"
if [ "$CGROUP" = 1 ]; then
    for c in memory freezer cpuset; do
        mountpoint -q "/sys/fs/cgroup/$c" ||
            die "SLURM_LAB_CGROUP=1 needs cgroup v1 with the '$c' controller mounted at /sys/fs/cgroup/$c; use SLURM_LAB_CGROUP=0"
    done
    PROCTRACK=proctrack/cgroup TASK=task/cgroup ACCTG=jobacct_gather/cgroup ACCTG_PARAMS=""
else
    # without cgroups the only memory enforcement is polling RSS and killing
    PROCTRACK=proctrack/linuxproc TASK=task/none ACCTG=jobacct_gather/linux
    ACCTG_PARAMS="JobAcctGatherParams=OverMemoryKill"
fi
if [ "$ACCOUNTING" = 1 ]; then
    ACCT_LINES="# accounting: slurmdbd (MariaDB behind it); sacct works as on a real site
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT"
    [ "$STORE_COMMENT" = 1 ] && ACCT_LINES="$ACCT_LINES
AccountingStoreFlags=job_comment"
else
    ACCT_LINES="# no accounting: sacct fails; 'sacct -c' reads the jobcomp file
AccountingStorageType=accounting_storage/none"
fi
PORT_LAST=$((PORT_BASE + NODES - 1))
if [ "$NODES" -eq 1 ]; then NODE_RANGE=node1; PORTS=$PORT_BASE
else NODE_RANGE="node[1-$NODES]"; PORTS="[$PORT_BASE-$PORT_LAST]"; fi

# install_conf NEW DEST MODE: install NEW as DEST if different; refuses to
# replace a file this script did not write unless SLURM_LAB_FORCE=1.
# Returns 0 if DEST changed, 1 if not.
install_conf() {
    local new=$1 dest=$2 mode=$3
    if [ -e "$dest" ] && ! ours "$dest"; then
        [ "$FORCE" = 1 ] || die "$dest exists and was not written by this script; set SLURM_LAB_FORCE=1 to replace it (a backup is kept)"
        cp -p "$dest" "$dest.before-dispatch"
        log "backed up $dest to $dest.before-dispatch"
    fi
    if cmp -s "$new" "$dest" 2> /dev/null; then return 1; fi
    install -m "$mode" "$new" "$dest"
    return 0
}

mkdir -p "$ETC"
NEW=$LAB_DIR/etc/slurm.conf
cat > "$NEW" <<EOF
$MARK
# dispatch's Slurm test cluster on one machine: every node is a slurmd on
# 127.0.0.1 with its own port, started as "slurmd -N nodeX".
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=$CRED_EXPIRE
MailProg=/bin/true
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGD/slurmctld.log
SlurmdLogFile=$LOGD/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# declared CPUs/memory are taken as-is, whatever the machine has
SlurmdParameters=config_overrides
ProctrackType=$PROCTRACK
TaskPlugin=$TASK
JobAcctGatherType=$ACCTG
JobAcctGatherFrequency=task=5
$ACCTG_PARAMS
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_interval=10
$ACCT_LINES
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGD/jobcomp.log
ReturnToService=1
SlurmdTimeout=$SLURMD_TIMEOUT
MinJobAge=$MIN_JOB_AGE
KillWait=$KILL_WAIT
# Preemption by partition tier: jobs in "high" preempt jobs in "low"
# (requeued) and in "lowcancel" (cancelled); "debug" jobs are never preempted.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=$NODE_RANGE NodeHostname=localhost NodeAddr=127.0.0.1 Port=$PORTS CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF
PartitionName=low Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE
PartitionName=lowcancel Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF
conf_changed=0
install_conf "$NEW" "$CONF" 0644 && conf_changed=1

if [ "$CGROUP" = 1 ]; then
    CGNEW=$LAB_DIR/etc/cgroup.conf
    printf '%s\nCgroupPlugin=cgroup/v1\nConstrainCores=yes\nConstrainRAMSpace=yes\nConstrainSwapSpace=no\n' "$MARK" > "$CGNEW"
    install_conf "$CGNEW" "$CGCONF" 0644 && conf_changed=1
elif ours "$CGCONF"; then
    rm -f "$CGCONF"
    conf_changed=1
fi

dbd_changed=0 dbd_started=0 ctld_started=0
if [ "$ACCOUNTING" = 1 ]; then
    # the database password: random, made once, kept with the database
    PASSF=$LAB_DIR/etc/db.pass
    if [ ! -s "$PASSF" ]; then
        (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$PASSF")
    fi
    chmod 0600 "$PASSF"
    DBPASS=$(cat "$PASSF")
    DBDNEW=$LAB_DIR/etc/slurmdbd.conf
    (umask 077; cat > "$DBDNEW" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$LOGD/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DBPASS
StorageLoc=$DBNAME
EOF
)
    # slurmdbd refuses a slurmdbd.conf readable by others
    install_conf "$DBDNEW" "$DBDCONF" 0600 && dbd_changed=1
    chown root:root "$DBDCONF"
elif ours "$DBDCONF"; then
    rm -f "$DBDCONF"
fi

# ---------------------------------------------------------------- munge
if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if munge_ok; then
    if pid_alive "$RUN/munged.pid" munged; then log "munged already running (pid $(pid_of "$RUN/munged.pid"))"
    else log "munged already running (not started by this script; left alone)"; fi
else
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    chmod 0755 /run/munge
    rm -f "$RUN/munged.pid"
    # --force: start even if a stale socket from a dead munged is left over
    if command -v runuser > /dev/null; then runuser -u munge -- /usr/sbin/munged --force 9>&-
    else su -s /bin/sh munge -c '/usr/sbin/munged --force' 9>&-; fi
    wait_pidfile /run/munge/munged.pid munged 10 ||
        { tail_log /var/log/munge/munged.log; die "munged did not start"; }
    cp /run/munge/munged.pid "$RUN/munged.pid"
    for i in $(seq 1 50); do munge_ok && break; sleep 0.1; done
    munge_ok || { tail_log /var/log/munge/munged.log; die "munged runs but 'munge -n | unmunge' fails"; }
    log "started munged (pid $(pid_of "$RUN/munged.pid"))"
fi

# Daemons inherit the working directory; keep it inside the lab dir so that
# nothing lands where the script was called from (stop relies on it too).
cd "$LOGD"

# ---------------------------------------------------------------- restarts on change
if [ "$conf_changed" = 1 ] && [ "$running_any" = 1 ]; then
    log "configuration changed: restarting the Slurm daemons started by this script"
    stop_pidfiles 15 "$RUN"/slurmd-node*.pid "$RUN/slurmctld.pid"
fi
if [ "$ACCOUNTING" = 1 ] && [ "$dbd_changed" = 1 ] && pid_alive "$RUN/slurmdbd.pid" slurmdbd; then
    log "slurmdbd.conf changed: restarting slurmdbd"
    stop_pidfiles 15 "$RUN/slurmdbd.pid"
fi
if [ "$ACCOUNTING" = 0 ]; then
    # a cluster without accounting has no slurmdbd or database running (both
    # at once: what slurmdbd still had to write is of no use any more)
    stop_pidfiles 60 "$RUN/slurmdbd.pid" "$DBPID"
fi
# slurmd of nodes no longer configured (SLURM_LAB_NODES was lowered)
extra=()
for f in "$RUN"/slurmd-node*.pid; do
    [ -e "$f" ] || continue
    n=${f##*/slurmd-node}; n=${n%.pid}
    if [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt "$NODES" ]; then extra+=("$f"); fi
done
[ "${#extra[@]}" -eq 0 ] || stop_pidfiles 15 "${extra[@]}"

# ---------------------------------------------------------------- MariaDB + slurmdbd
if [ "$ACCOUNTING" = 1 ]; then
    DBUSER=mysql
    id -u mysql > /dev/null 2>&1 || DBUSER=root
    DBARGS=(--no-defaults --user="$DBUSER" --datadir="$DATADIR" --socket="$DBSOCK"
            --pid-file="$DBPID" --port="$DB_PORT" --bind-address=127.0.0.1
            --log-error="$LOGD/mariadbd.log" --skip-name-resolve --skip-log-bin
            --innodb-buffer-pool-size=128M --innodb-log-file-size=64M
            --innodb-lock-wait-timeout=900 --innodb-flush-log-at-trx-commit=2)
    printf '%s\n' "${DBARGS[@]}" > "$LAB_DIR/etc/mariadbd.args.new"
    if pid_alive "$DBPID" mariadbd && ! cmp -s "$LAB_DIR/etc/mariadbd.args.new" "$LAB_DIR/etc/mariadbd.args"; then
        log "MariaDB settings changed: restarting it (and slurmdbd)"
        stop_pidfiles 15 "$RUN/slurmdbd.pid"
        stop_pidfiles 60 "$DBPID"
    fi
    mv -f "$LAB_DIR/etc/mariadbd.args.new" "$LAB_DIR/etc/mariadbd.args"
    if pid_alive "$DBPID" mariadbd; then
        log "mariadbd already running (pid $(pid_of "$DBPID"))"
    else
        mkdir -p "$DBRUN"
        rm -f "$DBPID" "$DBSOCK"
        touch "$LOGD/mariadbd.log"
        chown "$DBUSER": "$MDB" "$DBRUN" "$LOGD/mariadbd.log"
        if [ ! -d "$DATADIR/mysql" ]; then
            T_DB=$(now)
            rm -rf "$DATADIR"
            mkdir -p "$DATADIR"
            chown "$DBUSER": "$DATADIR"
            mariadb-install-db --no-defaults --user="$DBUSER" --datadir="$DATADIR" \
                --auth-root-authentication-method=socket --skip-test-db \
                > "$LOGD/mariadb-install-db.log" 2>&1 ||
                { tail_log "$LOGD/mariadb-install-db.log"; die "mariadb-install-db failed"; }
            log "initialised MariaDB data dir $DATADIR in $(since "$T_DB") s"
        fi
        chown -R "$DBUSER": "$DATADIR"
        # mariadbd does not daemonize: run it in its own session, detached
        setsid mariadbd "${DBARGS[@]}" < /dev/null >> "$LOGD/mariadbd.stderr" 2>&1 9>&- &
        dbpid=$!
        ok=0
        for i in $(seq 1 300); do
            if pid_alive "$DBPID" mariadbd && mariadb-admin --no-defaults -S "$DBSOCK" -u root ping > /dev/null 2>&1; then ok=1; break; fi
            [ -d "/proc/$dbpid" ] || break
            sleep 0.1
        done
        [ "$ok" = 1 ] || { tail_log "$LOGD/mariadbd.log" "$LOGD/mariadbd.stderr"; die "MariaDB did not come up (exited, or not answering within 30 s)"; }
        log "started mariadbd (pid $(pid_of "$DBPID"), 127.0.0.1:$DB_PORT)"
    fi
    if ! pid_alive "$RUN/slurmdbd.pid" slurmdbd; then
        # idempotent: the database and its user, with the current password
        db <<EOF || { tail_log "$LOGD/mariadbd.log"; die "could not create the accounting database/user"; }
CREATE DATABASE IF NOT EXISTS $DBNAME;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DBPASS';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DBPASS';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DBPASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DBPASS';
GRANT ALL ON $DBNAME.* TO 'slurm'@'localhost';
GRANT ALL ON $DBNAME.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
        rm -f "$RUN/slurmdbd.pid"
        slurmdbd >> "$LOGD/slurmdbd.stderr" 2>&1 9>&- ||
            { tail_log "$LOGD/slurmdbd.stderr" "$LOGD/slurmdbd.log"; die "slurmdbd failed to start"; }
        wait_pidfile "$RUN/slurmdbd.pid" slurmdbd 15 ||
            { tail_log "$LOGD/slurmdbd.log" "$LOGD/slurmdbd.stderr"; die "slurmdbd did not come up"; }
        log "started slurmdbd (pid $(pid_of "$RUN/slurmdbd.pid"), port $DBD_PORT)"
        dbd_started=1
    else
        log "slurmdbd already running (pid $(pid_of "$RUN/slurmdbd.pid"))"
    fi
fi
# cluster and root's association in the database: checked when slurmdbd was
# started now or the cluster is not yet known to be registered (marker file)
if [ "$ACCOUNTING" = 1 ] && { [ "$dbd_started" = 1 ] || [ ! -e "$RUN/registered-$CLUSTER" ]; }; then
    rm -f "$RUN"/registered-*
    # slurmdbd answers once it has created/checked its tables
    deadline=$(( $(date +%s) + WAIT ))
    until sacctmgr -n -P show cluster format=cluster > "$LOGD/sacctmgr.out" 2>&1; do
        pid_alive "$RUN/slurmdbd.pid" slurmdbd ||
            { tail_log "$LOGD/slurmdbd.log"; die "slurmdbd exited"; }
        [ "$(date +%s)" -lt "$deadline" ] ||
            { tail_log "$LOGD/sacctmgr.out" "$LOGD/slurmdbd.log"; die "slurmdbd did not answer sacctmgr within $WAIT s"; }
        sleep 0.2
    done
    if ! grep -qx "$CLUSTER" "$LOGD/sacctmgr.out"; then
        sacctmgr -i add cluster "$CLUSTER" > "$LOGD/sacctmgr.out" 2>&1 ||
            { tail_log "$LOGD/sacctmgr.out" "$LOGD/slurmdbd.log"; die "sacctmgr add cluster $CLUSTER failed"; }
        log "registered cluster '$CLUSTER' in slurmdbd"
    fi
    # root's association (sacctmgr add cluster normally creates it)
    if [ -z "$(sacctmgr -n -P show assoc where cluster="$CLUSTER" user=root format=user 2> /dev/null)" ]; then
        sacctmgr -i add user root account=root cluster="$CLUSTER" > "$LOGD/sacctmgr.out" 2>&1 ||
            { tail_log "$LOGD/sacctmgr.out"; die "sacctmgr add user root failed"; }
        log "added user root (account root) to cluster '$CLUSTER'"
    fi
    touch "$RUN/registered-$CLUSTER"
fi

# ---------------------------------------------------------------- job owners
# Two ordinary Unix users whose jobs dispatch submits, releases and cancels as
# them (sudo -n -u USER; root needs no sudoers rule). No home directory: the
# jobs run in the directory they are submitted from, and write /tmp.
for u in $USERS; do
    if ! id -u "$u" > /dev/null 2>&1; then
        useradd -M -U -s /bin/sh -c "dispatch test job owner" "$u" ||
            die "useradd $u failed"
        log "created Unix user $u (uid $(id -u "$u"))"
    fi
    if [ "$ACCOUNTING" = 1 ] &&
        [ -z "$(sacctmgr -n -P show assoc where cluster="$CLUSTER" user="$u" format=user 2> /dev/null)" ]; then
        if [ -z "$(sacctmgr -n -P show account dispatch-users format=account 2> /dev/null)" ]; then
            sacctmgr -i add account dispatch-users cluster="$CLUSTER" \
                description="dispatch test job owners" organization=dispatch > "$LOGD/sacctmgr.out" 2>&1 ||
                { tail_log "$LOGD/sacctmgr.out"; die "sacctmgr add account dispatch-users failed"; }
        fi
        sacctmgr -i add user "$u" account=dispatch-users cluster="$CLUSTER" > "$LOGD/sacctmgr.out" 2>&1 ||
            { tail_log "$LOGD/sacctmgr.out"; die "sacctmgr add user $u failed"; }
        log "added user $u (account dispatch-users) to cluster '$CLUSTER'"
    fi
done
# A site's setup for them (deploy/slurm/README.md, "Jobs run as their owners"):
# the owners in group dispatch-users, a service user dj-dispatch, and the
# shipped sudoers rule granting it sbatch/scontrol release/scancel as them.
if [ -n "$USERS" ]; then
    getent group dispatch-users > /dev/null || groupadd dispatch-users || die "groupadd dispatch-users failed"
    for u in $USERS; do
        id -nG "$u" | tr ' ' '\n' | grep -qx dispatch-users || usermod -a -G dispatch-users "$u" ||
            die "usermod -a -G dispatch-users $u failed"
    done
    if ! id -u dj-dispatch > /dev/null 2>&1; then
        useradd -M -U -s /bin/sh -c "dispatch test service user" dj-dispatch || die "useradd dj-dispatch failed"
        log "created Unix user dj-dispatch (the service user of the sudoers test)"
    fi
    [ -r "$TOP/deploy/slurm/sudoers.dispatch" ] || die "$TOP/deploy/slurm/sudoers.dispatch is missing"
    rule=$(sed 's/^dispatch ALL = /dj-dispatch ALL = /' "$TOP/deploy/slurm/sudoers.dispatch")
    if [ "$(cat /etc/sudoers.d/dispatch-test 2> /dev/null)" != "$rule" ]; then
        printf '%s\n' "$rule" > /etc/sudoers.d/.dispatch-test.new
        chmod 0440 /etc/sudoers.d/.dispatch-test.new
        visudo -cqf /etc/sudoers.d/.dispatch-test.new || die "deploy/slurm/sudoers.dispatch does not parse"
        mv /etc/sudoers.d/.dispatch-test.new /etc/sudoers.d/dispatch-test
        log "installed /etc/sudoers.d/dispatch-test (deploy/slurm/sudoers.dispatch for dj-dispatch)"
    fi
fi

# ---------------------------------------------------------------- slurmctld + slurmd
if pid_alive "$RUN/slurmctld.pid" slurmctld; then
    log "slurmctld already running (pid $(pid_of "$RUN/slurmctld.pid"))"
else
    rm -f "$RUN/slurmctld.pid"
    slurmctld -f "$CONF" >> "$LOGD/slurmctld.stderr" 2>&1 9>&- ||
        { tail_log "$LOGD/slurmctld.stderr" "$LOGD/slurmctld.log"; die "slurmctld failed to start"; }
    wait_pidfile "$RUN/slurmctld.pid" slurmctld 15 ||
        { tail_log "$LOGD/slurmctld.log"; die "slurmctld did not come up"; }
    log "started slurmctld (pid $(pid_of "$RUN/slurmctld.pid"))"
    ctld_started=1
fi
for i in $(seq 1 "$NODES"); do
    f=$RUN/slurmd-node$i.pid
    if pid_alive "$f" slurmd; then continue; fi
    rm -f "$f"
    slurmd -f "$CONF" -N "node$i" >> "$LOGD/slurmd-node$i.stderr" 2>&1 9>&- ||
        { tail_log "$LOGD/slurmd-node$i.stderr" "$LOGD/slurmd-node$i.log"; die "slurmd for node$i failed to start"; }
    wait_pidfile "$f" slurmd 15 ||
        { tail_log "$LOGD/slurmd-node$i.log"; die "slurmd for node$i did not come up"; }
    log "started slurmd for node$i (pid $(pid_of "$f"), port $((PORT_BASE + i - 1)))"
done

# ---------------------------------------------------------------- readiness
deadline=$(( $(date +%s) + WAIT ))
until scontrol ping 2> /dev/null | grep -q 'is UP'; do
    pid_alive "$RUN/slurmctld.pid" slurmctld ||
        { tail_log "$LOGD/slurmctld.log"; die "slurmctld exited (see the log above)"; }
    [ "$(date +%s)" -lt "$deadline" ] ||
        { tail_log "$LOGD/slurmctld.log"; die "slurmctld did not answer 'scontrol ping' within $WAIT s"; }
    sleep 0.2
done
resumed=" "
while :; do
    ready=0
    while read -r name state; do
        case "$state" in
            *NOT_RESPONDING*|*UNKNOWN*|*POWER*|*REBOOT*) ;;
            DOWN*|*DRAIN*|*FAIL*)
                # left DOWN/DRAINED/FAILING by a test (or in the saved state):
                # READY means every node usable, so resume it, once
                case "$resumed" in *" $name "*) ;; *)
                    log "resuming $name (state was $state)"
                    scontrol update nodename="$name" state=resume || true
                    resumed="$resumed$name " ;;
                esac ;;
            IDLE*|ALLOCATED*|MIXED*|COMPLETING*) ready=$((ready + 1)) ;;
        esac
    done < <(scontrol -o show nodes 2> /dev/null | sed -n 's/^NodeName=\([^ ]*\) .* State=\([^ ]*\) .*/\1 \2/p')
    [ "$ready" -ge "$NODES" ] && break
    for i in $(seq 1 "$NODES"); do
        pid_alive "$RUN/slurmd-node$i.pid" slurmd ||
            { tail_log "$LOGD/slurmd-node$i.log"; die "slurmd for node$i exited (see the log above)"; }
    done
    if [ "$(date +%s)" -ge "$deadline" ]; then
        sinfo -N -l >&2 || true
        tail_log "$LOGD/slurmctld.log"
        die "only $ready of $NODES nodes ready after $WAIT s; logs in $LOGD"
    fi
    sleep 0.2
done
if [ "$ACCOUNTING" = 1 ] && { [ "$ctld_started" = 1 ] || [ "$dbd_started" = 1 ]; }; then
    # slurmctld registers with slurmdbd (ControlPort set) shortly after start
    until [ "$(sacctmgr -n -P show cluster where cluster="$CLUSTER" format=controlport 2> /dev/null)" = "$CTLD_PORT" ]; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            tail_log "$LOGD/slurmctld.log" "$LOGD/slurmdbd.log"
            die "slurmctld did not register with slurmdbd within $WAIT s"
        fi
        sleep 0.2
    done
fi
if [ "$ACCOUNTING" = 1 ]; then
    sacct -n -X -S now > /dev/null 2> "$LOGD/sacct.err" ||
        { tail_log "$LOGD/sacct.err" "$LOGD/slurmdbd.log"; die "sacct does not work"; }
fi

log "READY: $NODES nodes, $(scontrol --version), $( [ "$ACCOUNTING" = 1 ] && echo "accounting via slurmdbd (cluster $CLUSTER)" || echo "no accounting (jobcomp file $LOGD/jobcomp.log)"), lab dir $LAB_DIR"
log "timing: configure+start $(since "$T_CONF") s, total $(since "$T_START") s"
