#!/bin/bash
# lifecycle.sh FILE [FIO-OPTION...]: where a request's life goes on a
# vdiskfs mount served over FUSE-over-io_uring. Runs fio (libaio, O_DIRECT,
# 6 s; the options given, default 1 MiB sequential writes at iodepth 16) on
# FILE and, for 0.3 s in the middle, records kernel tracepoints through
# tracefs (fuse_request_send/end, io_uring_submit_req/complete,
# block_rq_issue/complete). It prints, for each stage, how many requests
# were in it on average (Little's law: the time spent in it over the
# window) and the mean time per request:
#   FUSE         the kernel queued the request -> the reply reached it
#   with owner   the owner got the request -> it committed the reply
#   backing I/O  the owner submitted the store I/O -> it completed
#   device       a block request was issued -> completed (merged requests
#                count once)
# What is in FUSE but not with the owner waits in the kernel for the owner
# (queued, or being copied into the entry). With -v it also prints 60 lines
# of the trace. Needs root, fio, python3 and tracefs; see
# docs/BENCHMARKS.md, "How to read it".
set -euo pipefail
file=$1
shift
verbose=0
if [[ ${1:-} == -v ]]; then verbose=1; shift; fi
(($#)) || set -- --rw=write --bs=1M --iodepth=16
T=/sys/kernel/tracing
[[ -d $T/events ]] || mount -t tracefs nodev $T
events=(fuse/fuse_request_send fuse/fuse_request_end io_uring/io_uring_submit_req
	io_uring/io_uring_complete block/block_rq_issue block/block_rq_complete)
out=$(mktemp -d)
cleanup() {
	echo 0 >$T/tracing_on
	for e in "${events[@]}"; do echo 0 >"$T/events/$e/enable"; done
	rm -rf "$out"
}
trap cleanup EXIT
echo 0 >$T/tracing_on
echo >$T/trace
(($(cat $T/buffer_size_kb | tr -dc 0-9) >= 40000)) || echo 40000 >$T/buffer_size_kb
for e in "${events[@]}"; do echo 1 >"$T/events/$e/enable"; done
fio --name=lifecycle --filename="$file" --direct=1 --ioengine=libaio --time_based \
	--runtime=6 "$@" --output-format=json >"$out/fio.json" &
sleep 3
echo 1 >$T/tracing_on
sleep 0.3
echo 0 >$T/tracing_on
wait
cp $T/trace "$out/trace"
python3 - "$out" "$verbose" <<'PY'
import json, re, sys
out, verbose = sys.argv[1], sys.argv[2] == "1"
j = json.load(open(out + "/fio.json"))["jobs"][0]
print("fio: %.0f MB/s, %.0f IOPS" % ((j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e6,
                                    j["read"]["iops"] + j["write"]["iops"]))
IO_TAG = 1 << 62  # fs/fuseuring ioTag: the owner's backing I/O
ev = []
for line in open(out + "/trace"):
    m = re.search(r"\s(\d+\.\d+): (\w+): (.*)", line)
    if m and not line.startswith("#"):
        ev.append((float(m.group(1)), m.group(2), m.group(3), line.rstrip()))
if len(ev) < 2:
    sys.exit("no events traced: is FILE on a vdiskfs mount over io_uring?")
window = ev[-1][0] - ev[0][0]
stages = {k: [] for k in ("FUSE", "with owner", "backing I/O", "device")}
sent, delivered, submitted, issued = {}, {}, {}, {}
dev_bytes = 0
for t, name, args, _ in ev:
    if name == "fuse_request_send":
        sent[re.search(r"req (\d+)", args).group(1)] = t
    elif name == "fuse_request_end":
        t0 = sent.pop(re.search(r"req (\d+)", args).group(1), None)
        if t0 is not None:
            stages["FUSE"].append(t - t0)
    elif name in ("io_uring_complete", "io_uring_submit_req"):
        ud = int(re.search(r"user_data (0x[0-9a-f]+)", args).group(1), 16)
        if name == "io_uring_complete" and ud < 1 << 16:  # an entry got a request
            delivered[ud] = t
        elif name == "io_uring_complete" and ud & IO_TAG and ud >> 63 == 0:
            t0 = submitted.pop(ud, None)
            if t0 is not None:
                stages["backing I/O"].append(t - t0)
        elif name == "io_uring_submit_req" and "URING_CMD" in args and ud in delivered:
            stages["with owner"].append(t - delivered.pop(ud))
        elif name == "io_uring_submit_req" and ud & IO_TAG and ud >> 63 == 0:
            submitted[ud] = t
    elif name in ("block_rq_issue", "block_rq_complete"):
        m = re.search(r"(\d+) \+ (\d+)", args)
        if not m:
            continue
        if name == "block_rq_issue":
            issued[m.group(1)] = t
            dev_bytes += int(m.group(2)) * 512
        elif m.group(1) in issued:
            stages["device"].append(t - issued.pop(m.group(1)))
print("traced %.3f s, device %.0f MB/s" % (window, dev_bytes / window / 1e6))
for k, d in stages.items():
    if d:
        print("%-12s %5.2f in flight, %7.0f us each, %d" % (k, sum(d) / window, sum(d) / len(d) * 1e6, len(d)))
if verbose:
    keep = [l for _, n, _, l in ev if n != "io_uring_submit_req" or "URING_CMD" in l or "WRITE" in l or "READ" in l]
    print("\n".join(keep[len(keep) // 2:len(keep) // 2 + 60]))
PY
