"""Rich tables and trees for the audit views of `engine.cli.audit` (humans; `--json` skips this)."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from seedledger.engine.cli.audit_lines import clip, event_line, imported_mark
from seedledger.engine.cli.audit_lines import fp as _fp
from seedledger.engine.cli.audit_lines import num as _f

# σ as applied: rounded to 12 significant bits (≈ 3.6 digits), so 6 show that 0.001 became
# 0.000999928; `log` and `show` print it alike
SIGMA = ".6g"
MAX_ROWS = 100  # generations and events (log RUN) and members (show) a table lists; --json lists all


def noise_label(perturbation: str | None) -> str:
    """`audit.perturbation`'s name as a reader says it (`full` is full-rank)."""
    return "full-rank" if perturbation == "full" else str(perturbation)


def _elided(what: str, hidden: int) -> Text:
    return Text(f"… {hidden:,} {what} not shown (--json lists all)", style="dim")


def safe(data: Any) -> Any:
    """`data` with every string (and mapping key) fit for a terminal: control characters
    escaped (ledger.names.printable), since run names, payloads, component names and
    samples come from ledgers and seed files others wrote. (Views print with markup off,
    so brackets in them stay literal.)"""
    from seedledger.ledger.names import printable

    if isinstance(data, str):
        return printable(data, limit=None)
    if isinstance(data, dict):
        return {safe(k) if isinstance(k, str) else k: safe(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [safe(v) for v in data]
    return data


def runs_table(rows: list[dict[str, Any]]) -> RenderableType:
    if not rows:
        return Text("no runs in this ledger; start one with `seedledger train CONFIG.yaml`")
    t = Table(title="runs", title_justify="left")
    for col, just in [("run", "left"), ("base model", "left"), ("gens", "right"),
                      ("status", "left"), ("best reward", "right"), ("parent", "left")]:
        t.add_column(col, justify=just)
    for r in rows:
        best = "–" if r["best_reward"] is None else f"{r['best_reward']:.3f} @{r['best_generation']}"
        t.add_row(clip(r["name"]), clip(r["base_model"]), str(r["generations"]), r["status"], best,
                  clip(r["parent"] or ""))
    return t


def log_shown(data: dict[str, Any]) -> dict[str, Any]:
    """What the table of `log RUN` prints of its data, escaped (`safe`): the latest
    MAX_ROWS generations and events, each event as its bounded line (`event_line`), so
    that escaping and layout cost what is shown, whatever the payloads hold."""
    events = data["events"]
    shown = [
        {"at": e["at"], "kind": e["kind"],
         "line": imported_mark(e.get("imported")) + event_line(e["kind"], e["payload"])}
        for e in events[-MAX_ROWS:]
    ]
    return safe({**data, "generations": data["generations"][-MAX_ROWS:], "events": shown,
                 "hidden": {"generations": max(len(data["generations"]) - MAX_ROWS, 0),
                            "events": max(len(events) - MAX_ROWS, 0)}})


def run_log_view(data: dict[str, Any]) -> RenderableType:
    """`log RUN` as tables, from `audit.run_log`'s data (escaped and cut here: `log_shown`)."""
    data = log_shown(data)
    run = data["run"]
    title = (f"{clip(run['name'])}  ({clip(run['base_model'])} on {run['backend']}, "
             f"{noise_label(run['perturbation'])} noise, {run['status']}")
    title += f", forked from {clip(run['parent'])})" if run["parent"] else ")"
    t = Table(title=title, title_justify="left")
    gens = data["generations"]
    evaluated = any(g.get("held_out") is not None for g in gens)  # a column only where scored
    lineage = len({g["run"] for g in gens}) > 1  # a fork's: which run committed each row
    rows = [[str(g["generation"]), *([g["run"]] if lineage else []), _f(g["reward_mean"]), _f(g["reward_max"]),
             *([_f(g.get("held_out"))] if evaluated else []),
             _f(g["lr"], ".4g"), _f(g["sigma"], SIGMA), _fp(g["fingerprint"]), _f(g["seconds"], ".1f")]
            for g in gens]  # the latest ones: where a long run is now
    for i, col in enumerate(["gen", *(["run"] if lineage else []), "R mean", "R max", *(["eval"] if evaluated else []),
                             "lr", "σ", "fingerprint", "sec"]):
        # numbers are never cut (σ as applied has 6 digits): only a run's name may fold
        t.add_column(col, justify="left" if col in ("run", "fingerprint") else "right", no_wrap=col != "run",
                     overflow="fold", min_width=max([len(col), *(len(r[i]) for r in rows)]) if col != "run" else 3)
    for row in rows:
        t.add_row(*row)
    parts: list[RenderableType] = [t]
    if data["hidden"]["generations"]:
        parts.append(_elided("earlier generations", data["hidden"]["generations"]))
    if not data["generations"]:
        parts.append(Text("no generations committed yet"))
    parts += _input_ranges_view(data.get("inputs") or [])
    if data["events"]:
        ev = Table(title="events", title_justify="left", show_header=False, box=None)
        for e in data["events"]:
            ev.add_row(e["at"][:19].replace("T", " "), clip(e["kind"]), e["line"])
        parts.append(ev)
    if data["hidden"]["events"]:
        parts.append(_elided("earlier events", data["hidden"]["events"]))
    return Group(*parts)


def _input_ranges_view(ranges: list[dict[str, Any]]) -> list[RenderableType]:
    """Below `log RUN`: the generation ranges trained on other inputs than the range before
    (ledger.provenance.input_ranges), and those whose sessions recorded none."""
    lines = []
    for i, r in enumerate(ranges):
        span = f"generations {r['first']}..{r['last']}"
        if r["digest"] is None:
            lines.append(f"{span}: inputs not recorded")
        elif i and r["changes"]:
            lines.append(clip(f"{span} trained on changed inputs ({_fp(r['digest'])}): {'; '.join(r['changes'][:8])}"))
        if r["digest"] is not None and not r.get("chained", True):
            lines.append(f"{span}: inputs recorded outside the hash chain (rows committed before migration 0007)")
    return [Text(line, style="bold") if "changed" in line else Text(line, style="dim") for line in lines]


def graph_view(roots: list[dict[str, Any]]) -> RenderableType:
    if not roots:
        return Text("no runs in this ledger")
    tree = Tree(Text("runs", style="bold"), guide_style="dim")

    def add(parent: Tree, node: dict[str, Any]) -> None:
        first = (node["forked_at"] or 0) + 1  # a fork's own generations start after its fork point
        own = f"gens {first}..{node['generations']}" if node["generations"] >= first else "no gens"
        label = Text.assemble((node["name"], "bold"), f"  {own}  {node['status']}")
        if node["forked_at"] is not None:
            label = Text.assemble(f"@{node['forked_at']} → ", label)
        branch = parent.add(label)
        for child in node["children"]:
            add(branch, child)

    for root in roots:
        add(tree, root)
    return tree



def _setting(value: Any) -> str:
    """One optimizer setting; a matrix (the `paths` rule's per-member rows, one row per
    member or path) as its shape: `show RUN@G#M` prints a member's row, `--json` all."""
    if isinstance(value, list) and value and all(isinstance(row, list) for row in value):
        return f"[{len(value)}×{len(value[0])}]"
    return str(value)

def show_view(data: dict[str, Any]) -> RenderableType:
    hp = data["hyperparameters"]
    where = "" if data["recorded_in"] == data["run"] else f" (recorded in {data['recorded_in']})"
    head = Table.grid(padding=(0, 2))
    head.add_row("generation", Text.assemble((f"{data['run']}@{data['generation']}", "bold"), where))
    head.add_row("fingerprint", data["fingerprint"] or "–")
    head.add_row("lr / σ / N", f"{hp['lr']:.4g} / {hp['sigma']:{SIGMA}} / {hp['population']}")
    head.add_row("backend / noise", f"{data['backend']} / {noise_label(data['perturbation'])}")
    head.add_row("optimizer", ", ".join(f"{k}={_setting(v)}" for k, v in hp["optimizer"].items()))
    head.add_row("schedule step", str(hp["schedule_step"]))
    head.add_row("batch", " ".join(map(str, data["batch_indices"])))
    rw = data["reward"]
    head.add_row("reward", f"mean {_f(rw['mean'])}  std {_f(rw['std'])}  "
                 f"min {_f(rw['min'])}  max {_f(rw['max'])}")
    head.add_row("timings", "  ".join(f"{k} {v:.2f}s" for k, v in data["timings"].items()) or "–")
    head.add_row("committed", data["committed_at"] or "–")
    _provenance_rows(head, data.get("base_model"), data.get("inputs"))

    comps = sorted({c for m in data["members"] for c in m["components"]})
    t = Table(title="members", title_justify="left")
    for col in ["#", "key", "sign", "reward", *comps, "coefficient"]:
        t.add_column(col, justify="left" if col == "key" else "right")
    for m in data["members"][:MAX_ROWS]:
        t.add_row(str(m["index"]), m["key"], {1: "+", 0: "0", -1: "−"}[m["sign"]],
                  _f(m["reward"]), *[_component(c, m["components"].get(c)) for c in comps],
                  repr(m["coefficient"]))
    parts: list[RenderableType] = [head, t]
    if len(data["members"]) > MAX_ROWS:
        parts.append(_elided("more members", len(data["members"]) - MAX_ROWS))
    for m in data["members"]:
        if "samples" in m:
            parts.append(_samples_view(m))
    if data.get("evaluations"):
        parts.append(_evaluations_view(data["run"], data["evaluations"]))
    return Group(*parts)


def _provenance_rows(head: Table, base: dict[str, Any] | None, inputs: dict[str, Any] | None) -> None:
    """`show RUN@G`: what the base model is, and the inputs the generation was trained on."""
    if base is not None:
        head.add_row("base model", f"{base['model']} ({_fp(base['fingerprint'])}): {base['description']}")
    if inputs is None:
        head.add_row("inputs", "inputs not recorded")
        return
    head.add_row("inputs", f"{_fp(inputs.get('digest'))} (recorded by {inputs.get('session')} "
                 f"from generation {inputs.get('from_generation')})")
    for label, key in (("file", "files"), ("tokenizer", "tokenizer")):
        for name, sha in (inputs.get(key) or {}).items():
            head.add_row(f"  {label}", f"{name}  sha256 {_fp(sha)}")
    head.add_row("  chat template", f"sha256 {_fp(inputs.get('chat_template'))}")
    libs = inputs.get("libraries") or {}
    head.add_row("  libraries", ", ".join(f"{k} {v or 'absent'}" for k, v in libs.items()) or "–")
    sandbox = inputs.get("sandbox") or {}
    head.add_row("  sandbox", ", ".join(f"{k}={v}" for k, v in sandbox.items()) or "–")


def _evaluations_view(run: str, rows: list[dict[str, Any]]) -> RenderableType:
    """`show RUN`: the run's held-out evaluations (`evaluate`, `evaluation.every`, the demo)."""
    t = Table(title=f"held-out evaluations of {run}", title_justify="left")
    for col in ["gen", "rows", "mean", "against", "its mean", "change ± s.e.", "better/worse", "by"]:
        t.add_column(col, justify="left" if col in ("against", "by") else "right")
    for e in rows[-MAX_ROWS:]:
        c = e["change"] if isinstance(e["change"], dict) else {}
        try:
            change = f"{c['mean']:+.4f} ± {c['stderr']:.4f}" if "mean" in c else "–"
        except (TypeError, ValueError, KeyError):  # not the numbers an evaluation records
            change = "?"
        t.add_row(clip(str(e["generation"])), clip(str(e["rows"])), _f(e["mean"], ".4f"),
                  clip(str(e["against"] or "–")), _f(e["against_mean"], ".4f"), change,
                  f"{c.get('better', '–')}/{c.get('worse', '–')}",
                  clip(str(e["by"] or "–")) + (" (imported)" if e.get("imported") else ""))
    return t


def _component(name: str, value: float | None) -> str:
    """A component's cell; Pareto shaping's front as its index, starred when it is the first."""
    if name == "pareto_front" and value is not None:
        return f"★ {value:.0f}" if value == 0 else f"{value:.0f}"
    return _f(value)


def _samples_view(member: dict[str, Any]) -> RenderableType:
    if not member["samples"]:
        return Text(f"member {member['index']}: no stored outputs (train with keep_samples: true)")
    t = Table(title=f"member {member['index']} outputs", title_justify="left", show_lines=True)
    cols = list(dict.fromkeys(k for s in member["samples"] for k in s))
    for col in cols:  # `data`: the dataset columns the reward compared with
        t.add_column("expected" if col == "data" else col, overflow="fold")
    for s in member["samples"]:
        t.add_row(*[_cell(s.get(c)) for c in cols])
    return t


def _cell(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_cell(x)}" for k, x in v.items())
    return format(v, ".3f") if isinstance(v, float) else str(v)


def member_view(data: dict[str, Any]) -> RenderableType:
    """`show RUN@G#M`: what the member's weights are, its row, what the algorithm said."""
    where = "" if data["recorded_in"] == data["run"] else f" (recorded in {data['recorded_in']})"
    sign = {1: "+", 0: "0", -1: "−"}[data["sign"]]
    head = Table.grid(padding=(0, 2))
    head.add_row("member", Text.assemble((data["ref"], "bold"), where))
    weights = f"{data['parent']} {sign} σ·ε(key)" if data["sign"] else f"{data['parent']} (sign 0)"
    if data.get("paths") and "ga" in data:
        terms = data["paths"]["terms"]
        noise = f" {sign} σ·ε(key)" if data["sign"] else ""
        weights = (f"{data['parent']}{noise} + Σₖ bₖ·Mₖ (GA: {sum(b != 0 for b in terms)} of {len(terms)} "
                   "survivor offsets)")
    elif data.get("paths"):
        terms = data["paths"]["terms"]
        weights = (f"{data['parent']} {sign} σ·α·ε(key) + Σⱼ bⱼ·Mⱼ (LM-MA-ES: α {data['paths']['shrink']:.6g}, "
                   f"{sum(b != 0 for b in terms)} of {len(terms)} path terms)")
    head.add_row("weights", weights)
    if data["same_weights_as"]:
        head.add_row("same weights as", data["same_weights_as"])
    head.add_row("parent fingerprint", data["parent_fingerprint"] or "–")
    head.add_row("key", data["key"])
    head.add_row("sign / σ", f"{sign} / {data['sigma']:{SIGMA}}")
    kind = data["perturbation"]
    head.add_row("perturbation", f"{kind['noise_spec']} on {kind['param_selection']}")
    head.add_row("reward", _f(data["reward"]))
    for name, value in data["components"].items():
        head.add_row(f"  {name}", _component(name, value))
    head.add_row("coefficient", repr(data["coefficient"]))
    if "ga" in data:
        ga = data["ga"]
        roles = [r for r in ("elite", "parent", "child", "survivor") if ga.get(r)]
        if ga.get("bred"):
            roles.append("bred from " + " + ".join(f"{w:g}·S{k}" for k, w in ga["bred"]))
        head.add_row("ga", f"fitness {_f(ga['fitness'])}  species {ga['species'] if ga['species'] is not None else '–'}"
                     f"  {', '.join(roles) or 'not selected'}")
    for name in ("cmaes", "lmmaes"):
        if name in data:
            cm = data[name]
            head.add_row(name, f"rank {cm['rank']}{' (selected)' if cm['selected'] else ''}")
    head.add_row("committed", data["committed_at"] or "–")
    if "samples" not in data:
        return head
    return Group(head, _samples_view({"index": data["member"], "samples": data["samples"]}))


def diff_view(data: dict[str, Any], top: int | None = None) -> RenderableType:
    a, b, tot = data["a"], data["b"], data["total"]
    from seedledger.engine.refs import format_ref

    title = (f"{format_ref(b['run'], b['generation'], b.get('member'))} − "
             f"{format_ref(a['run'], a['generation'], a.get('member'))}  "
             f"(shared generations 1..{data['shared_generations']})")
    t = Table(title=title, title_justify="left")
    for col in ["tensor", "shape", "L2", "max |Δ|", "changed"]:  # numbers never wrap; names fold
        t.add_column(col, justify="left" if col in ("tensor", "shape") else "right",
                     overflow="fold", no_wrap=col != "tensor")
    rows = data["tensors"] if top is None else data["tensors"][:top]
    for r in rows:
        t.add_row(r["tensor"], "×".join(map(str, r["shape"])), f"{r['l2']:.4g}",
                  f"{r['max_abs']:.4g}", f"{r['changed']:,}/{r['numel']:,}")
    if top is not None and len(data["tensors"]) > top:
        t.add_row(f"… {len(data['tensors']) - top} more", "", "", "", "")
    t.add_section()
    t.add_row(Text("total", style="bold"), f"{tot['tensors']} tensors", f"{tot['l2']:.4g}",
              f"{tot['max_abs']:.4g}", f"{tot['changed']:,}/{tot['numel']:,}")
    notes = data.get("notes", [])  # a member on either side (a payload may predate them)
    if not notes:
        return t
    return Group(t, *[Text(f"note: {n}", style="dim") for n in notes])


def print_view(view: RenderableType) -> None:
    Console(markup=False, emoji=False).print(view)  # text from ledgers is never markup
