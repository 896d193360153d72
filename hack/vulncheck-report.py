#!/usr/bin/env python3
"""Reads govulncheck's JSON stream: fails on each vulnerability the code
calls (a finding whose trace reaches a function of ours) that the accepted
list does not name with its module; prints the accepted ones and stale entries."""
import json
import sys


def stream(path):
    dec, text, i = json.JSONDecoder(), open(path).read(), 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return
        obj, i = dec.raw_decode(text, i)
        yield obj


def main(findings, accepted_path):
    accepted = {}
    for line in open(accepted_path):
        line = line.split("#", 1)[0].strip()
        if line:
            vid, mod, why = (line.split(None, 2) + ["", ""])[:3]
            accepted[(vid, mod)] = why
    summary, called = {}, {}
    for obj in stream(findings):
        if "osv" in obj:
            summary[obj["osv"]["id"]] = obj["osv"].get("summary", "")
        f = obj.get("finding")
        if f and f.get("trace") and f["trace"][0].get("function"):
            t = f["trace"][0]
            called.setdefault((f["osv"], t.get("module", "")), f"reaches {t.get('package', '')}.{t['function']} of {t.get('module', '')}@{t.get('version', '')}, fixed in {f.get('fixed_version', 'no release yet')}")
    bad = 0
    for key in sorted(called):
        if key in accepted:
            print(f"accepted  {key[0]}: {called[key]} ({accepted[key]})")
        else:
            print(f"CALLED    {key[0]}: {summary.get(key[0], '')}\n          {called[key]}")
            bad += 1
    for vid, mod in sorted(set(accepted) - set(called)):
        print(f"stale     {vid} in {mod} is accepted but no longer found: remove it from the list")
    if bad:
        print(f"vulncheck: {bad} called vulnerabilities; fix them (go get, a newer Go) or accept them with a reason")
        return 1
    print(f"vulncheck: no called vulnerability outside the accepted list ({len(called)} accepted)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
