"""The commands ``export`` and ``import``: a transaction handed over as one file (.a2pc)."""

from __future__ import annotations

from .args import Command, Opt

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def run_export(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).export(args["output"])


def run_import(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.client().import_bundle(args["bundle"], label=args["label"])


def text_export(r: dict[str, Any]) -> str:
    return f"exported {r['tid']} to {r['path']} ({r['bytes']} bytes, sha256 {r['sha256']})"


def text_import(r: dict[str, Any]) -> str:
    files = r["files"]
    head = (f"{'already imported as' if r['again'] else 'imported as'} {r['tid']} (from "
            f"{r['origin']['tid']}): {len(files)} file{'s' if len(files) != 1 else ''}")
    lines = [head] + [f"  {p}" for p in files]
    for c in r["checks"]:
        cmd = c["command"] if isinstance(c["command"], str) else " ".join(c["command"])
        seen = "" if c["current"] else ", on earlier content"
        lines.append(f"  exporter's check {'passed' if c['passed'] else 'FAILED'}{seen}: {cmd}")
    lines.append(f"next: agent-2pc diff --tid {r['tid']}; stage-cmd to check; commit")
    return "\n".join(lines)


EXPORT = Command(
    "export", "write a live transaction to a bundle file (.a2pc) for another workspace",
    run_export, (
        Opt("--tid", required=True, metavar="TID", help="the transaction id"),
        Opt("--output", required=True, metavar="F.a2pc", short="-o",
            help="the bundle file to write (-o F.a2pc; replaced atomically)")),
    extra={"text": text_export})
IMPORT = Command(
    "import", "register a bundle (.a2pc) as a transaction of this workspace", run_import, (
        Opt("--label", metavar="L", help="the new transaction's label (default: the "
            "bundle's)"),),
    positionals=(("bundle", "the bundle file (.a2pc)"),), extra={"text": text_import})
