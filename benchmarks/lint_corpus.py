"""How `iotune lint` agrees with DeepSpeed on a corpus of real public configs
(issue 14). The corpus itself is third-party material and is not committed:
give its directory (configs/*.json) and a verdicts file saying, for each
config, whether DeepSpeed 0.19.8's own config code accepts it and whether its
source reports it running or crashing:

    verdicts.json: [{"file": "01-x.json", "ds_accepts": true, "ds_error": null,
                     "source_says": "runs" | "crashes" | "unknown"}, ...]

Usage:
    python benchmarks/lint_corpus.py CORPUS_DIR [--accelerator cuda] [--json OUT]

For every config it runs `iotune lint --json` in a subprocess (the CLI as a
user runs it) and prints one row: DeepSpeed's verdict, the source's word,
lint's errors and warnings (rule names). Then the summary: false alarms
(lint errors on configs DeepSpeed accepts and whose source says they run),
misses (configs DeepSpeed refuses, or that the source reports crashing at
start-up, on which lint reports no error), and precision of lint's errors.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def lint(config: Path, accelerator: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "iotune", "lint", str(config), "--json", "--accelerator", accelerator],
                          capture_output=True, text=True, timeout=300)
    doc = json.loads(proc.stdout)
    doc["exit"] = proc.returncode
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--accelerator", default="cuda", help="the accelerator the configs were written for")
    ap.add_argument("--json", dest="out", type=Path, default=None, help="write every row here")
    args = ap.parse_args()
    verdicts = json.loads((args.corpus / "verdicts.json").read_text())
    rows = []
    for v in verdicts:
        doc = lint(args.corpus / "configs" / v["file"], args.accelerator)
        errors = sorted({f["rule"] for f in doc.get("findings", []) if f["severity"] == "error"})
        warnings = sorted({f["rule"] for f in doc.get("findings", []) if f["severity"] == "warning"})
        bad = (not v["ds_accepts"]) or v.get("source_says") == "crashes"
        rows.append({**v, "lint_exit": doc["exit"], "lint_errors": errors, "lint_warnings": warnings,
                     "problem": bad, "flagged": bool(errors) or doc["exit"] == 2})
        print(f"{v['file']:<52} ds={'ok ' if v['ds_accepts'] else 'REF'} source={v.get('source_says', '?'):<8} "
              f"lint exit {doc['exit']}  errors={','.join(errors) or '-'}  warnings={len(warnings)}")
    flagged = [r for r in rows if r["flagged"]]
    true_pos = [r for r in flagged if r["problem"]]
    false_alarms = [r for r in flagged if not r["problem"]]
    misses = [r for r in rows if r["problem"] and not r["flagged"]]
    print(f"\n{len(rows)} configs; lint flagged {len(flagged)}: {len(true_pos)} real problems, "
          f"{len(false_alarms)} false alarms; misses: {len(misses)}")
    if flagged:
        print(f"precision of lint's errors: {len(true_pos) / len(flagged):.2f}")
    for r in false_alarms:
        print(f"  false alarm: {r['file']}: {', '.join(r['lint_errors'])}")
    for r in misses:
        print(f"  miss: {r['file']}: {r.get('ds_error') or r.get('notes')}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
