"""MkDocs hook: the CLI reference, rendered at build time from the typer app itself (each
command's --help), so it cannot drift from the commands. A page holding the marker
`<!-- cli-reference -->` gets it in place of the marker."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's commands, not another's
MARKER = "<!-- cli-reference -->"


def render() -> str:
    import typer.main

    from seedledger.engine.cli import app

    os.environ.setdefault("COLUMNS", "100")
    root = typer.main.get_command(app)
    root_ctx = root.context_class(root, info_name="seedledger")
    parts = ["## seedledger", "", "```text", root.get_help(root_ctx).rstrip(), "```", ""]
    for name in root.list_commands(root_ctx):
        cmd = root.get_command(root_ctx, name)
        sub = getattr(cmd, "list_commands", None)
        ctx = cmd.context_class(cmd, info_name=name, parent=root_ctx)
        parts += [f"## seedledger {name}", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""]
        for child in sub(ctx) if sub else []:
            grand = cmd.get_command(ctx, child)
            gctx = grand.context_class(grand, info_name=child, parent=ctx)
            parts += [f"### seedledger {name} {child}", "", "```text", grand.get_help(gctx).rstrip(), "```", ""]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown
