#!/usr/bin/env python3
"""check_trace.py -- validates a trace gpuarr wrote (GPUARR_TRACE, gpuarr_trace_start/stop)
against the Chrome trace-event format, strictly, with nothing but the json module.

    python3 tests/python/check_trace.py trace.json [--expect NAME ...] [--min-events N]

Checks: the top level is an object with "traceEvents" (a list) and "displayTimeUnit" ("ns" or
"ms"); every event is an object with ph, ts, pid, tid and name of the right types; "X" events
have a numeric dur >= 0; "M" events are process_name / thread_name (with args.name) or
thread_sort_index; no other phases; every tid with events has a thread_name; the "X" events of
each (pid, tid) nest properly (each one ends before the next starts, or lies inside it);
otherData.dropped_events is a count. --expect NAME: an "X" event of that name is present.
Prints a one-line summary; exits 1 with the first problems found.
"""
import json
import sys

PHASES_WITH_DURATION = {"X"}
KNOWN_PHASES = {"X", "M", "i", "I", "s", "t", "f"}


def problems_of(doc, expect, min_events):
    out = []
    if not isinstance(doc, dict):
        return ["the top level is not an object"]
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    if doc.get("displayTimeUnit") not in ("ns", "ms"):
        out.append("displayTimeUnit is %r, not \"ns\" or \"ms\"" % (doc.get("displayTimeUnit"),))
    other = doc.get("otherData", {})
    if not isinstance(other, dict) or not isinstance(other.get("dropped_events"), int) or other["dropped_events"] < 0:
        out.append("otherData.dropped_events is not a count")
    named, used, spans = set(), set(), {}
    for i, e in enumerate(events):
        where = "event %d (%s)" % (i, json.dumps(e)[:120])
        if not isinstance(e, dict):
            out.append(where + ": not an object")
            continue
        complete = True
        for key, types in (("ph", str), ("name", str), ("pid", int), ("tid", int), ("ts", (int, float))):
            if key not in e:
                out.append("%s: no %s" % (where, key))
                complete = False
            elif not isinstance(e[key], types) or isinstance(e[key], bool):
                out.append("%s: %s has the wrong type" % (where, key))
                complete = False
        if not complete:
            continue
        ph = e.get("ph")
        if ph not in KNOWN_PHASES:
            out.append("%s: phase %r is not one gpuarr writes" % (where, ph))
            continue
        if isinstance(e.get("ts"), (int, float)) and e["ts"] < 0:
            out.append(where + ": ts < 0")
        if "args" in e and not isinstance(e["args"], dict):
            out.append(where + ": args is not an object")
        if ph == "M":
            if e.get("name") in ("process_name", "thread_name"):
                if not isinstance(e.get("args", {}).get("name"), str):
                    out.append(where + ": metadata without args.name")
                if e.get("name") == "thread_name":
                    named.add((e.get("pid"), e.get("tid")))
            elif e.get("name") != "thread_sort_index":
                out.append(where + ": unknown metadata " + str(e.get("name")))
            continue
        used.add((e.get("pid"), e.get("tid")))
        if ph in PHASES_WITH_DURATION:
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or isinstance(dur, bool) or dur < 0:
                out.append(where + ": X event without a dur >= 0")
                continue
            spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], dur, e["name"], i))
    for track in sorted(used - named):
        out.append("tid %s of pid %s has events but no thread_name" % (track[1], track[0]))
    for track, xs in spans.items():
        xs.sort(key=lambda x: (x[0], -x[1]))
        stack = []
        for ts, dur, name, i in xs:
            end = ts + dur
            # times are exact to the nanosecond (3 decimals of a microsecond); sums of floats are not
            while stack and stack[-1][0] <= ts + 5e-4:
                stack.pop()
            if stack and end > stack[-1][0] + 5e-4:
                out.append("tid %s: %s (event %d, %.3f..%.3f) overlaps %s (..%.3f) without nesting in it"
                           % (track[1], name, i, ts, end, stack[-1][1], stack[-1][0]))
            stack.append((end, name))
    names = {e.get("name") for e in events if isinstance(e, dict) and e.get("ph") == "X"}
    for want in expect:
        if want not in names:
            out.append("no X event named %r (there are: %s)" % (want, ", ".join(sorted(names))))
    count = sum(len(x) for x in spans.values())
    if count < min_events:
        out.append("%d X events, fewer than %d" % (count, min_events))
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    path, expect, min_events, i = argv[1], [], 0, 2
    while i < len(argv):
        if argv[i] == "--expect":
            expect.append(argv[i + 1])
            i += 2
        elif argv[i] == "--min-events":
            min_events = int(argv[i + 1])
            i += 2
        else:
            print("check_trace.py: unknown argument " + argv[i])
            return 2
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print("check_trace.py: %s is not JSON: %s" % (path, e))
        return 1
    problems = problems_of(doc, expect, min_events)
    if problems:
        print("check_trace.py: %s: %d problems" % (path, len(problems)))
        for p in problems[:20]:
            print("  " + p)
        return 1
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    tracks = {(e["pid"], e["tid"]) for e in xs}
    print("check_trace.py: %s: valid: %d events on %d tracks, %d dropped"
          % (path, len(xs), len(tracks), doc["otherData"]["dropped_events"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
