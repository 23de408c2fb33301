"""How a scan is shown: a summary first, then each finding; or JSON for tools."""

from __future__ import annotations

import json
from typing import List

from . import ScanResult
from .findings import CLASSES, NEEDS_CHANGE


def as_text(result: ScanResult) -> str:
    target, counts = result.target, result.counts()
    files = len(result.files)
    lines: List[str] = [
        f"cudashim scan: {files} file{'s' if files != 1 else ''} for the '{target.name}' backend "
        f"(device type '{target.device_type}', {target.how_chosen})", ""]
    width = max(len(kind) for kind in CLASSES)
    lines += [f"  {kind:<{width}}  {counts.get(kind, 0)}" for kind in CLASSES]
    blocked = result.blocked_files()
    if blocked:
        lines += ["", "files with blockers:"]
        lines += [f"  {path}  ({count})" for path, count in sorted(blocked.items())]
    if result.errors:
        lines += ["", "could not be read:"] + [f"  {error}" for error in result.errors]
    for kind in CLASSES:
        found = [finding for finding in result.findings if finding.kind == kind]
        if not found:
            continue
        lines += ["", f"{kind}:"]
        for finding in found:
            lines.append(f"  {finding.path}:{finding.line}:{finding.column}  {finding.code}")
            lines.append(f"      {finding.what}")
            if finding.fix:
                label = "fix" if kind == NEEDS_CHANGE else "way out"
                lines.append(f"      {label}: {finding.fix}")
    return "\n".join(lines) + "\n"


def as_json(result: ScanResult) -> str:
    return json.dumps(result.as_dict(), indent=2) + "\n"
