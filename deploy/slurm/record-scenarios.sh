#!/usr/bin/env bash
# record-scenarios.sh: replay the job scenarios of deploy/slurm/README.md on
# the running test cluster (scripts/slurm-cluster.sh start, WITH accounting)
# and save what squeue, sacct and scontrol print for each, as parser test
# data: OUT/<scenario>/<phase>/{squeue.json,squeue.txt,squeue-O.txt,
# sacct.txt,sacct.json,scontrol.txt,slurmctld.log,jobcomp.txt,output-*}.
#
#   record-scenarios.sh [OUT]     [tests/data/slurm of this repo]
#
# It takes about 5 min, changes node states, and at the end restarts the
# cluster three times (job_comment + cgroup variant, no accounting, back to
# the defaults). Start from a fresh cluster for small job ids:
#   scripts/slurm-cluster.sh stop && scripts/slurm-cluster.sh start --fresh
# Needs python3 (JSON filtering, the memory hog and the watcher).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CLUSTER_SH=$REPO/scripts/slurm-cluster.sh
OUT=${1:-$REPO/tests/data/slurm}
LAB_DIR=${SLURM_LAB_DIR:-/tmp/dispatch-slurm}
W=${SLURM_SCENARIO_DIR:-/tmp/dispatch-slurm-scenarios}

# the formats recorded (also written to OUT/README.md by hand)
SQ_FMT='%i|%A|%F|%K|%j|%T|%t|%r|%P|%N|%V|%S|%e|%l|%M|%E|%k'
SQ_OFMT='JobID:|,JobArrayID:|,ArrayJobID:|,ArrayTaskID:|,Name:|,State:|,StateCompact:|,Reason:|,RestartCnt:|,Requeue:|,DerivedEC:|,PreemptTime:|,Partition:|,NodeList:|,SubmitTime:|,StartTime:|,EndTime:|,Comment:|'
SA_FIELDS='JobID,JobIDRaw,JobName,Partition,State,ExitCode,DerivedExitCode,Reason,Comment,NodeList,NNodes,Submit,Eligible,Start,End,Elapsed,Timelimit,Flags,DBIndex,SubmitLine'

scontrol ping | grep -q 'is UP' || { echo "cluster not running; run scripts/slurm-cluster.sh start" >&2; exit 1; }
sacct -n -X -S now > /dev/null || { echo "sacct does not work: start the cluster with accounting" >&2; exit 1; }
command -v python3 > /dev/null || { echo "python3 is needed" >&2; exit 1; }
mkdir -p "$W" "$OUT"
cd "$W"
T_BEGIN=$(date +%Y-%m-%dT%H:%M:%S)

ts() { date +%T.%N | cut -c1-12; }
say() { echo "$(ts) $*"; }

# ------------------------------------------------------------ watcher
# one squeue and one sacct call per 0.5 s for all jobs; logs every change of
# a job's squeue state/reason/restarts and of its sacct rows (with earlier
# runs: --duplicates) to OUT/transitions.txt
python3 - "$OUT/transitions.txt" "$T_BEGIN" <<'EOF' &
import subprocess, sys, time, datetime
out, since = sys.argv[1], sys.argv[2]
prev = {}
def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except Exception as e:
        return ""
with open(out, "w") as f:
    f.write("# time | job | squeue JobID|State|Reason|RestartCnt | sacct -X --duplicates JobID|JobName|State|ExitCode|Reason rows (;-separated)\n")
    while True:
        now = {}
        for line in run(["squeue", "-h", "-t", "all", "-O", "JobID:|,State:|,Reason:|,RestartCnt:|"]).splitlines():
            jid = line.split("|")[0]
            now.setdefault(jid.split("_")[0], {})[jid] = line.rstrip("|")
        acct = {}
        for line in run(["sacct", "-n", "-P", "-X", "--duplicates", "-S", since,
                         "-o", "JobID,JobName,State,ExitCode,Reason"]).splitlines():
            jid = line.split("|")[0].split("_")[0]
            acct.setdefault(jid, []).append(line)
        for jid in sorted(set(now) | set(acct), key=lambda s: int(s) if s.isdigit() else 0):
            cur = (" ".join(v for _, v in sorted(now.get(jid, {}).items())), " ; ".join(acct.get(jid, [])))
            if prev.get(jid) != cur:
                t = datetime.datetime.now().strftime("%H:%M:%S.%f")[:12]
                f.write(f"{t} | job {jid} | squeue: {cur[0] or '-'} | sacct: {cur[1] or '-'}\n")
                f.flush()
                prev[jid] = cur
        time.sleep(0.5)
EOF
WATCHER=$!
trap 'kill $WATCHER 2> /dev/null || true' EXIT

# ------------------------------------------------------------ helpers
# run SCENARIO CMD...: run CMD, and append it to OUT/SCENARIO/commands.txt
run() {
    local sc=$1; shift
    mkdir -p "$OUT/$sc"
    printf '%q ' "$@" | sed 's/ $/\n/' >> "$OUT/$sc/commands.txt"
    "$@"
}
# sub SCENARIO SBATCH-ARGS...: submit, print the job id (also to commands.txt)
sub() {
    local sc=$1 id; shift
    id=$(run "$sc" sbatch --parsable "$@")
    echo "# -> job $id" >> "$OUT/$sc/commands.txt"
    echo "$id"
}
# state ID: the job's JobState from scontrol (empty if unknown)
state() { scontrol -o show job "$1" 2> /dev/null | grep -oE 'JobState=[A-Z_]+' | head -n 1 | cut -d= -f2; }
# wait_state ID REGEX SECONDS (on timeout it says so and goes on: the
# recording shows what happened instead)
wait_state() {
    for _ in $(seq 1 $(($3 * 5))); do
        [[ "$(state "$1")" =~ ^($2)$ ]] && return 0
        sleep 0.2
    done
    say "TIMEOUT waiting for job $1 to reach $2 (is $(state "$1")); going on"
}
# wait_rerun ID N SECONDS: until scontrol shows RUNNING with Restarts=N
wait_rerun() {
    for _ in $(seq 1 $(($3 * 5))); do
        scontrol -o show job "$1" 2> /dev/null | grep -q "JobState=RUNNING .*Restarts=$2 " && return 0
        sleep 0.2
    done
    say "TIMEOUT waiting for job $1 to run with Restarts=$2; going on"
}
# wait_array_done ID SECONDS: until no task of array job ID is pending/running
wait_array_done() {
    for _ in $(seq 1 $(($2 * 5))); do
        [ -z "$(squeue -h -j "$1" -t PD,R,CG,CF -o %i 2> /dev/null)" ] && return 0
        sleep 0.2
    done
    say "TIMEOUT waiting for array $1"
}
# snap SCENARIO PHASE ID...: save every command's output for the jobs
snap() {
    local sc=$1 ph=$2; shift 2
    local d=$OUT/$sc/$ph ids id f
    ids=$(IFS=,; echo "$*")
    rm -rf "$d"; mkdir -p "$d"
    squeue --json > "$d/squeue.all.json" 2> "$d/squeue.json.err" || true
    # squeue --json ignores -j: keep only these jobs (and array tasks)
    python3 - "$d/squeue.all.json" "$ids" > "$d/squeue.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
ids = {int(x) for x in sys.argv[2].split(",")}
d["jobs"] = [j for j in d["jobs"] if j.get("job_id") in ids or j.get("array_job_id") in ids]
print(json.dumps(d, indent=2))
EOF
    rm -f "$d/squeue.all.json"
    squeue -h -t all -j "$ids" -o "$SQ_FMT" > "$d/squeue.txt" 2> "$d/squeue.txt.err" || true
    squeue -h -t all -j "$ids" -O "$SQ_OFMT" > "$d/squeue-O.txt" 2> "$d/squeue-O.txt.err" || true
    sacct -P -n --duplicates -o "$SA_FIELDS" -j "$ids" > "$d/sacct.txt" 2> "$d/sacct.txt.err" || true
    sacct -P -n -o "$SA_FIELDS" -j "$ids" > "$d/sacct-noduplicates.txt" 2> /dev/null || true
    sacct --json --duplicates -j "$ids" > "$d/sacct.json" 2> "$d/sacct.json.err" || true
    : > "$d/scontrol.txt"
    for id in "$@"; do scontrol -o show job "$id" >> "$d/scontrol.txt" 2>> "$d/scontrol.txt.err" || true; done
    # (only lines of this recording: job ids repeat after a --fresh start)
    for id in "$@"; do
        grep -E "JobId=$id([ _]|$)|JobId=$id\\.|job_id=$id |jobid $id |JOB $id " "$LAB_DIR/log/slurmctld.log" |
            awk -v t="[$T_BEGIN" 'substr($0, 1, 20) >= t' || true
    done | awk '!seen[$0]++' > "$d/slurmctld.log"
    for id in "$@"; do grep -E "^JobId=$id " "$LAB_DIR/log/jobcomp.log" || true; done > "$d/jobcomp.txt"
    for id in "$@"; do
        for f in "$W/slurm-$id.out" "$W"/slurm-"$id"_*.out; do [ -e "$f" ] && cp "$f" "$d/output-${f##*/}"; done
    done
    for f in "$d"/*.err "$d/slurmctld.log" "$d/jobcomp.txt"; do [ -s "$f" ] || rm -f "$f"; done
    say "snap $sc/$ph: jobs $ids: $(cut -d'|' -f1,5,6,8 "$d/sacct.txt" | tr '\n' ' ')"
}

# a script that runs long until it has been requeued RERUN_AFTER times (1
# unless set), then ends with exit 0 after 15 s
cat > rerun.sh <<'EOF'
#!/bin/bash
echo "start: restart count '${SLURM_RESTART_COUNT:-}' on $SLURMD_NODENAME at $(date +%T)"
if [ "${SLURM_RESTART_COUNT:-0}" -ge "${RERUN_AFTER:-1}" ]; then sleep 15; echo done; exit 0; fi
sleep 600
EOF
cat > hog.sh <<'EOF'
#!/bin/bash
python3 -c '
import time
a = []
for i in range(40):
    a.append(bytearray(25 * 1024 * 1024)); time.sleep(0.25)
print("allocated", 25 * len(a), "MB", flush=True)
time.sleep(20)
'
echo "hog exit=$?"
EOF
chmod +x rerun.sh hog.sh
rm -f "$W"/slurm-*.out

say "== A. endings, holds, requeue, arrays, comment, memory (timelimit runs meanwhile)"
J_TL=$(sub timelimit -J timelimit -w node1 --time=1 --wrap 'sleep 600')
J_OK=$(sub exit0 -J exit0 --wrap 'sleep 5; exit 0')
J_E1=$(sub exit1 -J exit1 --wrap 'sleep 2; exit 1')
J_E3=$(sub exit3 -J exit3 --wrap 'sleep 2; exit 3')
J_CA=$(sub scancel-running -J scancel-running --wrap 'sleep 600')
J_RQ=$(sub requeue -J requeue rerun.sh)
J_HU=$(sub hold-release -J hold-release --hold --wrap 'sleep 2')
J_HA=$(sub admin-hold -J admin-hold --begin=now+3600 --wrap 'true')
# shellcheck disable=SC2016
J_AR=$(sub array -J array --array=1-3 --wrap 'sleep 3; exit $((SLURM_ARRAY_TASK_ID == 2))')
J_DJ=$(sub dj-comment --job-name=dj-abc --comment='dj:job=abc sub=1 att=1' --wrap 'sleep 3; exit 0')
J_OOM=$(sub oom -J oom --mem=100M hog.sh)
snap array submitted "$J_AR"
sleep 0.5
snap hold-release held "$J_HU"
run admin-hold scontrol hold "$J_HA"
snap admin-hold held "$J_HA"
run hold-release scontrol release "$J_HU"
snap hold-release released "$J_HU"
wait_state "$J_DJ" RUNNING 30 && snap dj-comment running "$J_DJ"
wait_state "$J_OK" COMPLETED 30 && snap exit0 end-immediate "$J_OK"
wait_state "$J_RQ" RUNNING 30
run requeue scontrol requeue "$J_RQ"
sleep 0.5
snap requeue requeued "$J_RQ"
wait_state "$J_CA" RUNNING 30
run scancel-running scancel "$J_CA"
run admin-hold scancel "$J_HA"
wait_state "$J_OOM" "FAILED|OUT_OF_MEMORY|COMPLETED|CANCELLED" 60
wait_state "$J_HU" COMPLETED 30
wait_state "$J_DJ" COMPLETED 30
wait_array_done "$J_AR" 60
sleep 5    # let the accounting records settle (see README: sacct lags)
snap exit0 end "$J_OK"
snap exit1 end "$J_E1"
snap exit3 end "$J_E3"
snap scancel-running end "$J_CA"
snap admin-hold cancelled "$J_HA"
snap hold-release end "$J_HU"
snap array end "$J_AR"
snap dj-comment end "$J_DJ"
snap oom end "$J_OOM"
wait_rerun "$J_RQ" 1 60 && snap requeue rerun "$J_RQ"
wait_state "$J_RQ" COMPLETED 30; sleep 3
snap requeue end "$J_RQ"

say "== B. node set DOWN under a requeueable and a --no-requeue job"
J_NR=$(sub node-down-requeue -J node-down-requeue -x node1 rerun.sh)
wait_state "$J_NR" RUNNING 30
NODE=$(squeue -h -j "$J_NR" -o %N)
J_NN=$(sub node-down-norequeue -J node-down-norequeue --no-requeue -w "$NODE" --wrap 'sleep 600')
wait_state "$J_NN" RUNNING 30
sleep 1
run node-down-requeue scontrol update nodename="$NODE" state=down reason=dispatch-test
echo "# (the same command put the node of job $J_NN down; see node-down-requeue/commands.txt)" >> "$OUT/node-down-norequeue/commands.txt"
sleep 1
snap node-down-requeue requeued "$J_NR"
snap node-down-norequeue end-immediate "$J_NN"
wait_rerun "$J_NR" 1 60 && snap node-down-requeue rerun "$J_NR"
wait_state "$J_NR" COMPLETED 30; sleep 3
snap node-down-requeue end "$J_NR"
snap node-down-norequeue end "$J_NN"
run node-down-requeue scontrol update nodename="$NODE" state=resume

say "== C. preemption: high preempts low (REQUEUE) and lowcancel (CANCEL)"
V=$(sub preempt-requeue -J victim-low -p low -N 2 -w node2,node3 --exclusive rerun.sh)
wait_state "$V" RUNNING 30; sleep 1
P=$(sub preempt-requeue -J preemptor -p high -N 2 -w node2,node3 --exclusive --wrap 'sleep 5')
for _ in $(seq 1 100); do [ "$(state "$V")" != RUNNING ] && break; sleep 0.1; done
sleep 0.5
snap preempt-requeue preempted "$V" "$P"
wait_rerun "$V" 1 60 && snap preempt-requeue rerun "$V" "$P"
wait_state "$V" COMPLETED 30; sleep 3
snap preempt-requeue end "$V" "$P"

V=$(sub preempt-cancel -J victim-lowcancel -p lowcancel -N 2 -w node2,node3 --exclusive --wrap 'sleep 600')
wait_state "$V" RUNNING 30; sleep 1
P=$(sub preempt-cancel -J preemptor -p high -N 2 -w node2,node3 --exclusive --wrap 'sleep 5')
for _ in $(seq 1 100); do [ "$(state "$V")" != RUNNING ] && break; sleep 0.1; done
sleep 0.5
snap preempt-cancel preempted "$V" "$P"
wait_state "$P" COMPLETED 30; sleep 3
snap preempt-cancel end "$V" "$P"

say "== D. time limit (--time=1, on node1)"
wait_state "$J_TL" TIMEOUT 150; sleep 3
snap timelimit end "$J_TL"

say "== D2. requeued twice: preempted (REQUEUE), then its node set DOWN"
J=$(RERUN_AFTER=2 sub requeue-twice -J requeue-twice -p low rerun.sh)
echo "# (submitted with RERUN_AFTER=2 in the environment: rerun.sh ends once Restarts reaches 2)" >> "$OUT/requeue-twice/commands.txt"
wait_state "$J" RUNNING 30; sleep 1
NODE=$(squeue -h -j "$J" -o %N)
P=$(sub requeue-twice -J preemptor -p high -w "$NODE" --exclusive --wrap 'sleep 5')
for _ in $(seq 1 100); do [ "$(state "$J")" != RUNNING ] && break; sleep 0.1; done
sleep 0.5
snap requeue-twice preempted "$J" "$P"
wait_rerun "$J" 1 60
sleep 1
NODE=$(squeue -h -j "$J" -o %N)
run requeue-twice scontrol update nodename="$NODE" state=down reason=dispatch-test
sleep 1
snap requeue-twice node-down "$J" "$P"
wait_rerun "$J" 2 60 && snap requeue-twice rerun "$J" "$P"
run requeue-twice scontrol update nodename="$NODE" state=resume
wait_state "$J" COMPLETED 30; sleep 3
snap requeue-twice end "$J" "$P"

say "== E. variants that need a restart: AccountingStoreFlags=job_comment and cgroup v1"
kill "$WATCHER" 2> /dev/null || true
SLURM_LAB_STORE_COMMENT=1 SLURM_LAB_CGROUP=1 "$CLUSTER_SH" start | tail -n 2
J=$(sub dj-comment-stored --job-name=dj-abc --comment='dj:job=abc sub=1 att=1' --wrap 'sleep 3; exit 0')
J_OC=$(sub oom-cgroup -J oom-cgroup --mem=100M hog.sh)
wait_state "$J" COMPLETED 30
wait_state "$J_OC" "FAILED|OUT_OF_MEMORY|COMPLETED|CANCELLED" 60; sleep 5
snap dj-comment-stored end "$J"
snap oom-cgroup end "$J_OC"
echo "# recorded with SLURM_LAB_STORE_COMMENT=1 SLURM_LAB_CGROUP=1 scripts/slurm-cluster.sh start" >> "$OUT/dj-comment-stored/commands.txt"
echo "# recorded with SLURM_LAB_STORE_COMMENT=1 SLURM_LAB_CGROUP=1 scripts/slurm-cluster.sh start" >> "$OUT/oom-cgroup/commands.txt"

say "== F. no accounting (jobcomp/filetxt only)"
"$CLUSTER_SH" start --no-accounting | tail -n 2
J=$(sub no-accounting -J exit1 --wrap 'sleep 1; exit 1')
wait_state "$J" FAILED 30; sleep 1
d=$OUT/no-accounting/end
snap no-accounting end "$J"
sacct -c -P -n -o "$SA_FIELDS" -j "$J" > "$d/sacct-c.txt" 2> "$d/sacct-c.txt.err" || true
sacct -c --json -j "$J" > "$d/sacct-c.json" 2> "$d/sacct-c.json.err" || true
for f in "$d"/*.err; do [ -s "$f" ] || rm -f "$f"; done
echo "# recorded with scripts/slurm-cluster.sh start --no-accounting" >> "$OUT/no-accounting/commands.txt"

say "== back to the default configuration"
"$CLUSTER_SH" start | tail -n 2
say "done; data in $OUT"
