#!/usr/bin/env python3
"""Tables for docs/benchmarks.md from a gpu-loop.sh output folder.

  scripts/loop-report.py OUT_DIR[:OUT_DIR...] [--planner HOST:PORT --memplan PATH]

Several folders joined with ':' (one seed's draws over several calls: MEMPLAN_RANDOM_FIRST) make
one table and one summary; a draw found in several takes the last folder that holds its plan.

Per workload (plan-i.json, the stored plan with its measurement): the executed plan, the
planner's prediction as it was made (calibrated by the workloads before it), the raw model's
prediction (factor 1, no residual), the measured allocator peaks and step time, and the errors
against the reserved peak (the CUDA context, which the allocator does not count, is left out of
the prediction for the comparison).

--assume-clipping: the runs clipped gradients (memplan-agent's default --clip 1.0) but were
planned before the workload said so; re-predictions then model it.
--skip LIST: workload numbers to leave out of the re-predictions.
--summary: after the table, the error distribution of the peaks and step times as predicted
(share within ±5 % and ±3 %, count under by more than 3 %, step times within ±10 %), then the
same shares per method, optimizer, rank count and clipping. Rows other than full fine-tunes
with AdamW on one rank with clipping name their category after the model.

With --replay-from ADDR (a memplan-planner serving a copy of the run's planner.db) and --planner
ADDR (one with an empty database), it re-predicts every executed plan from the run's own profiled
trace with the current cost model and replays the measurements in order, so the table shows what
this build predicts, first uncalibrated, then calibrated by the runs before it.

With --planner (a running memplan-planner with an empty database), it also replays the run with
the analytic (architecture-only) trace: it stores OUT_DIR/hw.json as the hardware profile, asks
for the analytic prediction of the very plan each workload ran (every knob fixed), reports the
measured peak against it in the same order, and prints the analytic errors before and after
calibration.
"""
import json
import os
import subprocess
import sys

MiB = 1 << 20


def load(out, i):
    try:
        return json.load(open(f"{out}/plan-{i}.json"))["plan"]
    except (OSError, ValueError, KeyError):
        return None


def knobs(p):
    return (f'{p.get("n_persist", 0)}/{p.get("n_chunks", 0)} of {int(p["chunk_bytes"]) >> 20} MiB, '
            f'{p.get("n_buffer", 0)} buf, ckpt {p.get("n_checkpoint", 0)}, '
            f'hs {p.get("n_hs_offload", 0)}, swap {p.get("n_swap", 0)}')


def reserved_part(pred):
    """Prediction minus CUDA context, and the raw model part (factor 1, no residual).

    The factor scales only the bytes above exact_bytes (docs/cost-model.md, the calibration
    contract), so the raw part is exact + (peak - context - residual - exact) / factor."""
    b = pred["breakdown"]
    ctx = int(b.get("cuda_context_bytes", 0))
    peak = int(pred["peak_bytes"])
    factor = b.get("fragmentation_factor", 1.0) or 1.0
    residual = int(b.get("calibration_residual_bytes", 0))
    exact = int(b.get("exact_bytes", 0))
    return peak - ctx, exact + (peak - ctx - residual - exact) / factor


def memplan(args, cli, addr):
    r = subprocess.run([cli, "--planner", addr, "--json"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"memplan {' '.join(args)}: {r.stderr.strip()}")
    return json.loads(r.stdout)


ASSUME_CLIPPING = False  # --assume-clipping: runs from before the workload carried the flag


def fixed_plan_args(head, p, w):
    """`memplan plan` arguments that pin every knob of plan `p` at workload `w`."""
    args = head + ["--batch", str(w.get("micro_batch")), "--seq", str(w.get("seq_len")),
                   "--chunk-mib", str(int(p["chunk_bytes"]) >> 20),
                   "--n-persist", str(p.get("n_persist", 0)),
                   "--n-buffer", str(p.get("n_buffer", 0)),
                   "--n-swap", str(p.get("n_swap", 0)), "--n-ckpt", str(p.get("n_checkpoint", 0)),
                   "--n-hs-offload", str(p.get("n_hs_offload", 0)),
                   "--host-memory", "pageable" if p.get("host_memory") == "HOST_MEMORY_PAGEABLE"
                   else "pinned", "--safety-margin", "0.001", "--skip-limits"]
    if w.get("grad_clipping") or ASSUME_CLIPPING:
        args.append("--grad-clipping")
    return args


def replay_row(head, i, req, resp, m, cli, addr, with_measured_step):
    """Predicts the executed plan (every knob fixed) with `head`, prints the row, then reports
    the measurement against that prediction so later rows see the calibration."""
    w = req.get("workload", {})
    a = memplan(fixed_plan_args(head, resp["plan"], w), cli, addr)
    pred_res, raw = reserved_part(a["prediction"])
    reserved = int(m["peak_reserved_bytes"])
    step = f"{a['prediction']['iteration_seconds']:.3f}"
    if with_measured_step:
        step += f" / {m['step_seconds']:.3f}"
    print(f"| {i} | {req['arch']['name']} | {w.get('micro_batch')}×{w.get('seq_len')} | "
          f"{pred_res / MiB:,.0f} | {raw / MiB:,.0f} | {reserved / MiB:,.0f} | "
          f"{(pred_res - reserved) / reserved * 100:+.1f} % | "
          f"{(raw - reserved) / reserved * 100:+.1f} % | {step} |")
    memplan(["measure", "--plan-id", a["plan_id"], "--peak-reserved", str(reserved),
             "--step-seconds", str(m["step_seconds"])], cli, addr)


def last_error(path):
    """The agent's own error in a run's output, shortened: its first 'memplan-agent train:' line
    (rank 0's cause; the other ranks report that rank 0 failed), else the last line naming the
    agent (a launcher's)."""
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return "no output"
    own = [l for l in lines if l.startswith("memplan-agent ") and ": " in l]
    other = [l for l in lines if "memplan-agent" in l and ": " in l]
    line = own[0] if own else other[-1] if other else "no error line"
    return line[:200].replace("|", "/")


def does_not_fit(reason):
    """The planner answered that nothing fits the drawn card: a right answer, not a failure."""
    return "found no plan that fits" in reason


def category(req):
    """(method, optimizer, ranks, clipping) of a stored request, as the summary groups them."""
    kind = str(req.get("training", {}).get("kind", "FULL")).replace("KIND_UNSPECIFIED", "FULL")
    w = req.get("workload", {})
    return (kind.lower(), req.get("optimizer") or "adamw",
            f"{int(w.get('world_size') or 1)} rank(s)",
            "clip" if w.get("grad_clipping") else "no clip")


def print_categories(measured):
    """Per method, optimizer, rank count and clipping: the peak and step-time shares."""
    print()
    print("| category | workloads | peak within ±5 % | under by > 3 % | step within ±10 % |")
    print("|---|---:|---:|---:|---:|")
    for axis, name in enumerate(("method", "optimizer", "ranks", "clipping")):
        groups = {}
        for cat, peak, step in measured:
            groups.setdefault(cat[axis], []).append((peak, step))
        for value in sorted(groups):
            g = groups[value]
            steps = [s for _, s in g if s is not None]
            print(f"| {name}: {value} | {len(g)} | {sum(abs(p) <= 5 for p, _ in g)} | "
                  f"{sum(p < -3 for p, _ in g)} | {sum(abs(s) <= 10 for s in steps)} of {len(steps)} |")


def print_summary(peak_errors, step_errors, ooms, planned, no_fit=0):
    """The error distribution of the predictions as made (prediction minus measured, in %)."""
    def share(values, pred):
        return f"{sum(1 for v in values if pred(v))} of {len(values)}"

    def spread(values):
        v = sorted(values)
        if not v:
            return "none"
        q = lambda f: v[min(len(v) - 1, int(f * (len(v) - 1) + 0.5))]
        return (f"min {v[0]:+.1f} %, p10 {q(0.1):+.1f} %, median {q(0.5):+.1f} %, "
                f"p90 {q(0.9):+.1f} %, max {v[-1]:+.1f} %")

    print()
    print(f"workloads planned: {planned}; measured: {len(peak_errors)}; OOM: {ooms}; "
          f"nothing fits the card (the planner said so): {no_fit}; "
          f"stopped unmeasured: {planned - len(peak_errors) - ooms - no_fit}")
    print(f"peak (reserved) error: {spread(peak_errors)}")
    print(f"  within ±5 %: {share(peak_errors, lambda e: abs(e) <= 5)}; "
          f"within ±3 %: {share(peak_errors, lambda e: abs(e) <= 3)}; "
          f"under by more than 3 %: {share(peak_errors, lambda e: e < -3)}")
    print(f"step time error: {spread(step_errors)}")
    print(f"  within ±10 %: {share(step_errors, lambda e: abs(e) <= 10)}")


def main():
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    outs = argv[0].split(":")
    out = outs[0]  # the replays below read its hw.json
    global ASSUME_CLIPPING
    ASSUME_CLIPPING = "--assume-clipping" in argv
    summary = "--summary" in argv
    argv = [a for a in argv if a not in ("--assume-clipping", "--summary")]
    opts = dict(zip(argv[1::2], argv[2::2]))
    # Draws by their own number ("=== K: MODEL BxS ..."): a loop that starts at a later draw
    # (MEMPLAN_RANDOM_FIRST) or loop.txt files of several calls concatenated (a draw cut by one
    # call and re-run by the next: the later header counts) number them as they ran.
    # Each draw's folder: the last one holding its plan, else the last that ran it.
    draws, ran, planned = {}, {}, {}
    for d_out in outs:
        if os.path.exists(f"{d_out}/loop.txt"):
            for d in open(f"{d_out}/loop.txt").read().splitlines():
                if d.startswith("=== ") and d.split()[1].rstrip(":").isdigit():
                    k = int(d.split()[1].rstrip(":"))
                    draws[k] = d.split()
                    ran[k] = d_out
        for f in os.listdir(d_out):
            if f.startswith("plan-") and f.endswith(".json") and f[5:-5].isdigit():
                planned[int(f[5:-5])] = d_out
    where = {**ran, **planned}
    rows, failed = [], []
    for i in sorted(where):
        stored = load(where[i], i)
        if stored is None:
            # No stored plan: the run stopped before the planner answered (see run-i.txt).
            failed.append((i, " ".join(draws[i][2:4]) if i in draws else "?",
                           last_error(f"{where[i]}/run-{i}.txt")))
            continue
        req, resp = stored["request"], stored["response"]
        m = (stored.get("measurements") or [{}])[0]
        rows.append((i, req, resp, m))
    print("| # | model | batch×seq | margin | plan | predicted MiB | raw model MiB | measured "
          "allocated / reserved MiB | error | raw error | predicted / measured step s |")
    print("|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    peak_errors, step_errors, ooms, measured, no_fit = [], [], 0, [], 0
    for i, req, resp, m in rows:
        w = req.get("workload", {})
        margin = req.get("safety_margin", 0.05) or 0.05
        cat = category(req)
        name = f'{req.get("arch", {}).get("name", "?")} ({", ".join(cat)})'
        if cat == ("full", "adamw", "1 rank(s)", "clip"):
            name = req.get("arch", {}).get("name", "?")
        if not m or m.get("oom"):
            # No measurement at all: the run stopped after the plan (a time limit, a crash).
            reason = last_error(f"{where[i]}/run-{i}.txt")
            no_fit += 0 if m else 1 if does_not_fit(reason) else 0
            what = "OOM" if m else f"not measured: {reason}"
            print(f"| {i} | {name} | {w.get('micro_batch')}×{w.get('seq_len')} | {margin:.2f} | "
                  f"{knobs(resp['plan'])} | | | {what} | | | |")
            ooms += 1 if m else 0
            continue
        pred_res, raw = reserved_part(resp["prediction"])
        reserved = int(m["peak_reserved_bytes"])
        err = (pred_res - reserved) / reserved * 100
        peak_errors.append(err)
        step_err = None
        if m.get("step_seconds"):
            step_err = ((resp["prediction"]["iteration_seconds"] - m["step_seconds"]) /
                        m["step_seconds"] * 100)
            step_errors.append(step_err)
        measured.append((cat, err, step_err))
        raw_err = (raw - reserved) / reserved * 100
        print(f"| {i} | {name} | {w.get('micro_batch')}×{w.get('seq_len')} | {margin:.2f} | "
              f"{knobs(resp['plan'])} | {pred_res / MiB:,.0f} | {raw / MiB:,.0f} | "
              f"{int(m['peak_allocated_bytes']) / MiB:,.0f} / {reserved / MiB:,.0f} | "
              f"{err:+.1f} % | {raw_err:+.1f} % | "
              f"{resp['prediction']['iteration_seconds']:.3f} / {m['step_seconds']:.3f} |")
    for i, what, error in failed:
        print(f"| {i} | {what} | | no plan: {error} | | | | | | |")
    if summary:
        print_summary(peak_errors, step_errors, ooms, len(rows), no_fit)
        print_categories(measured)
        if failed:
            print(f"runs that stopped before a plan: {len(failed)} "
                  f"({', '.join(str(i) for i, _, _ in failed)})")
    if "--planner" not in opts:
        return 0
    addr, cli = opts["--planner"], opts.get("--memplan", "memplan")
    hw = memplan(["hardware", "submit", f"{out}/hw.json"], cli, addr)
    hw_id = hw.get("profile_id") or hw.get("profileId")
    skip = {int(x) for x in opts.get("--skip", "").split(",") if x}
    if "--replay-from" in opts:
        src = opts["--replay-from"]
        print()
        print("| # | model | batch×seq | predicted MiB (this build, replayed) | raw MiB | measured "
              "reserved MiB | error | raw error | predicted / measured step s |")
        print("|---|---|---|---:|---:|---:|---:|---:|---:|")
        for i, req, resp, m in rows:
            if not m or m.get("oom") or i in skip or not resp.get("trace_id"):
                continue
            trace = memplan(["trace", "get", resp["trace_id"]], cli, src)
            trace = trace.get("trace", trace)
            path = f"/tmp/loop-report-trace-{i}.json"
            json.dump(trace, open(path, "w"))
            new_id = memplan(["trace", "submit", path], cli, addr)["trace_id"]
            replay_row(["plan", "--trace-id", new_id, "--hardware-id", hw_id], i, req, resp, m,
                       cli, addr, with_measured_step=True)
        return 0
    print()
    print("| # | model | batch×seq | analytic MiB (as predicted) | raw analytic MiB | measured "
          "reserved MiB | analytic error | raw analytic error | analytic step s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for i, req, resp, m in rows:
        if not m or m.get("oom"):
            continue
        if i in skip:
            continue
        replay_row(["plan", "--arch", req["arch"]["name"], "--hardware-id", hw_id], i, req, resp, m,
                   cli, addr, with_measured_step=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
