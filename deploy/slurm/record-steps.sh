#!/usr/bin/env bash
# record-steps.sh: record, on the running test cluster (scripts/slurm-cluster.sh
# start, WITH accounting), what the slurm backend's own squeue and sacct
# commands print for the memory and "gone" scenarios of issue 15, as parser
# test data: OUT/<scenario>/<phase>/{squeue-O.txt,sacct.txt,output-*} and
# OUT/<scenario>/commands.txt.
#
#   record-steps.sh [OUT]     [tests/data/slurm of this repo]
#
# squeue-O.txt and sacct.txt use exactly the backend's formats (QUEUE_FIELDS
# and ACCT_FIELDS of libs/dispatch_backends/slurm/parse.py; a unit test
# checks they match): job AND step rows, --duplicates, no -X.
#
# Scenarios (about 3 min; the cluster is switched to SLURM_LAB_CGROUP=1 for
# the cgroup ones and back to the defaults at the end):
#   oom-steps           --mem=100M hog.sh, OverMemoryKill (no cgroup)
#   sigkill-self        --mem=100M, the script SIGKILLs itself (a signal 9
#                       far under the memory request)
#   gone-completed      exit 0, then again once slurmctld forgot it (MinJobAge)
#   oom-cgroup-steps    --mem=100M hog.sh under cgroup v1
#   oom-cgroup-child    the hog is a child the cgroup OOM killer kills; the
#                       batch script goes on and exits 0 (galaxy#6832)
#   oom-cgroup-srun     the hog is an srun step; the script exits 1 after it
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CLUSTER_SH=$REPO/scripts/slurm-cluster.sh
OUT=${1:-$REPO/tests/data/slurm}
W=${SLURM_SCENARIO_DIR:-/tmp/dispatch-slurm-steps}

SQ_OFMT='JobID:|,JobArrayID:|,ArrayJobID:|,ArrayTaskID:|,Name:|,State:|,Reason:|,RestartCnt:|,exit_code:|,Partition:|,NodeList:|,SubmitTime:|,StartTime:|,EndTime:|,UserName:|,Comment:|'
SA_FIELDS='JobID,JobIDRaw,JobName,Partition,State,ExitCode,Reason,NodeList,Submit,Start,End,DBIndex,MaxRSS,ReqMem,AllocTRES,Comment,SubmitLine'
export SLURM_TIME_FORMAT=standard

scontrol ping | grep -q 'is UP' || { echo "cluster not running; run scripts/slurm-cluster.sh start" >&2; exit 1; }
sacct -n -X -S now > /dev/null || { echo "sacct does not work: start the cluster with accounting" >&2; exit 1; }
mkdir -p "$W" "$OUT"
cd "$W"
say() { echo "$(date +%T) $*"; }

sub() { # sub SCENARIO SBATCH-ARGS...: submit; print the job id (also to commands.txt)
    local sc=$1 id; shift
    mkdir -p "$OUT/$sc"
    printf '%q ' sbatch --parsable "$@" | sed 's/ $/\n/' >> "$OUT/$sc/commands.txt"
    id=$(sbatch --parsable "$@")
    echo "# -> job $id" >> "$OUT/$sc/commands.txt"
    echo "$id"
}
state() { scontrol -o show job "$1" 2> /dev/null | grep -oE 'JobState=[A-Z_]+' | head -n 1 | cut -d= -f2; }
wait_ended() { # wait_ended ID SECONDS: until slurmctld shows an end and sacct a final batch step
    for _ in $(seq 1 $(($2 * 2))); do
        if [[ "$(state "$1")" =~ ^(COMPLETED|FAILED|OUT_OF_MEMORY|CANCELLED|TIMEOUT)$ ]] &&
            sacct -P -n -j "$1.batch" -o State | grep -qE '^(COMPLETED|FAILED|OUT_OF_MEMORY|CANCELLED)'; then
            return 0
        fi
        sleep 0.5
    done
    say "TIMEOUT waiting for job $1 to end; going on"
}
wait_forgotten() { # wait_forgotten ID SECONDS: until squeue no longer lists it
    for _ in $(seq 1 $(($2 * 2))); do
        [ -z "$(squeue -h -t all -j "$1" -o %i 2> /dev/null)" ] && return 0
        sleep 0.5
    done
    say "TIMEOUT waiting for slurmctld to forget job $1; going on"
}
snap() { # snap SCENARIO PHASE ID
    local d=$OUT/$1/$2 id=$3
    rm -rf "$d"; mkdir -p "$d"
    squeue -h -t all -u root -O "$SQ_OFMT" | awk -F'|' -v id="$id" '$1 + 0 == id' > "$d/squeue-O.txt" || true
    sacct -P -n --duplicates -o "$SA_FIELDS" -j "$id" > "$d/sacct.txt" 2> "$d/sacct.txt.err" || true
    [ -s "$d/sacct.txt.err" ] || rm -f "$d/sacct.txt.err"
    for f in "$W/slurm-$id.out"; do [ -e "$f" ] && cp "$f" "$d/output-${f##*/}"; done
    say "snap $1/$2: $(cut -d'|' -f1,5,6,13,14,15 "$d/sacct.txt" | tr '\n' ' ')"
}

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
cat > child.sh <<'EOF'
#!/bin/bash
./hog.sh
echo "the script goes on after its child"
exit 0
EOF
cat > srun.sh <<'EOF'
#!/bin/bash
srun ./hog.sh
echo "srun exit=$?"
exit 1
EOF
chmod +x hog.sh child.sh srun.sh
rm -f "$W"/slurm-*.out
for sc in oom-steps sigkill-self gone-completed oom-cgroup-steps oom-cgroup-child oom-cgroup-srun; do rm -rf "${OUT:?}/$sc"; done

say "== default config (OverMemoryKill, no cgroup)"
J=$(sub oom-steps -J oom-steps --mem=100M hog.sh)
K=$(sub sigkill-self -J sigkill-self --mem=100M --wrap 'sleep 6; kill -9 $$')
G=$(sub gone-completed -J gone-completed --wrap 'sleep 2; exit 0')
wait_ended "$J" 120; snap oom-steps end "$J"
wait_ended "$K" 120; snap sigkill-self end "$K"
wait_ended "$G" 120; snap gone-completed end "$G"
wait_forgotten "$G" 300; snap gone-completed gone "$G"

say "== cgroup v1"
SLURM_LAB_CGROUP=1 "$CLUSTER_SH" start | tail -n 1
for sc in oom-cgroup-steps oom-cgroup-child oom-cgroup-srun; do
    mkdir -p "$OUT/$sc"
    echo "# recorded with SLURM_LAB_CGROUP=1 scripts/slurm-cluster.sh start" > "$OUT/$sc/commands.txt"
done
A=$(sub oom-cgroup-steps -J oom-cgroup-steps --mem=100M hog.sh)
B=$(sub oom-cgroup-child -J oom-cgroup-child --mem=100M child.sh)
C=$(sub oom-cgroup-srun -J oom-cgroup-srun --mem=100M srun.sh)
wait_ended "$A" 120; snap oom-cgroup-steps end "$A"
wait_ended "$B" 120; snap oom-cgroup-child end "$B"
wait_ended "$C" 120; snap oom-cgroup-srun end "$C"

say "== back to the defaults"
"$CLUSTER_SH" start | tail -n 1
