"""Self-contained HTML reports: a run's (or several runs', overlaid) report.html, and the sweep report's.

Both are written as Markdown first and turned into HTML by `markdown_html` (the subset the reports use:
headings, paragraphs, lists, tables, code, bold, figure lines), so the sweep's report.html has exactly the
tables of its report.md. Figures are inline: the run report's as <svg> (hwrepro.study.report.svg), the sweep's
PNGs as data: URLs. The page's Content-Security-Policy forbids loading anything, so it opens from disk with no
server and makes no request.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from hwrepro.harness import records
from hwrepro.harness.config import dotted_fields
from hwrepro.study.report import runs as run_data
from hwrepro.study.report import svg
from hwrepro.study.report.analysis import distinct_labels
from hwrepro.study.report.markdown import markdown_table
from hwrepro.study.report.runs import RunFolder

RUN_REPORT_FILE = "report.html"
POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
STYLE = """body{font:14px/1.45 system-ui,sans-serif;max-width:1100px;margin:1.5em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:2px 7px;text-align:left;
vertical-align:top}th{background:#f2f2f2}code{background:#f4f4f4;padding:0 3px;word-break:break-all}
figure{margin:.8em 0;display:flex;flex-wrap:wrap;gap:12px}img{max-width:100%}.note{color:#8a4b00}"""


# --- Markdown (the reports' subset) to HTML -------------------------------------------------------------


def _inline(text: str) -> str:
    """Escapes text and renders `code`, **bold** and the reports' <br> line breaks."""
    out = html.escape(text, quote=False).replace("&lt;br&gt;", "<br>")
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)


def _cells(line: str) -> list[str]:
    inner = line.strip()[1:-1] if line.strip().endswith("|") else line.strip()[1:]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def markdown_html(text: str, figures: Mapping[str, str]) -> str:
    """HTML of Markdown `text`; a line `![alt](name)` becomes the figure figures[name] (HTML)."""
    out = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = block.split("\n")
        image = re.fullmatch(r"!\[(.*)\]\((.+)\)", block.strip())
        if image:
            out.append(f"<figure>{figures[image.group(2)]}</figure>")
        elif lines[0].startswith("#"):
            level = len(lines[0]) - len(lines[0].lstrip("#"))
            out.append(f"<h{level}>{_inline(lines[0][level:].strip())}</h{level}>")
        elif all(line.startswith("|") for line in lines):
            body = [_cells(line) for line in lines if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip())]
            head = "".join(f"<th>{_inline(c)}</th>" for c in body[0])
            rows = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body[1:])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif all(line.startswith("- ") for line in lines):
            out.append("<ul>" + "".join(f"<li>{_inline(line[2:])}</li>" for line in lines) + "</ul>")
        elif all(re.match(r"\d+\. ", line) for line in lines):
            out.append("<ol>" + "".join(f"<li>{_inline(line.split('. ', 1)[1])}</li>" for line in lines) + "</ol>")
        elif all(line.startswith("    ") for line in lines):
            out.append("<pre><code>" + html.escape("\n".join(line[4:] for line in lines)) + "</code></pre>")
        else:
            out.append(f"<p>{_inline(' '.join(lines))}</p>")
    return "\n".join(out)


def page(title: str, markdown: str, figures: Mapping[str, str]) -> str:
    """A whole HTML document: the Markdown's HTML with its figures, inline style, no external resource."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n"
            f"{markdown_html(markdown, figures)}\n</body></html>\n")


def png_figure(path: Path, alt: str) -> str:
    """An <img> holding the PNG file's bytes (a data: URL)."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def write_page(path: Path, text: str) -> Path:
    records.write_text_atomic(Path(path), text)
    return Path(path)


# --- the run report ---------------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return markdown_table(header, [[_cell(v) for v in r] for r in rows])


def _cell(v: Any) -> str:
    """A value as a table cell: floats to 6 significant digits, None as a dash, on one line."""
    if isinstance(v, float):
        return f"{v:.6g}"
    return "–" if v is None else str(v).replace("\n", " ")


def _label(key: str) -> str:
    return key.removeprefix("eval_") + (" (evaluation)" if key.startswith("eval_") else "")


def _curve_figures(folders: Sequence[RunFolder], labels: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Markdown lines and figures: each curve metric against step and against training time."""
    lines, figures = [], {}
    for key in run_data.curve_keys(folders):
        charts = []
        for x, xlabel in (("step", "step"), ("time", "training time (s)")):
            series = [svg.Series(label, *run_data.curve(f, key, x)) for f, label in zip(folders, labels)]
            charts.append(svg.line_chart(series, f"{_label(key)} against {xlabel.split(' (')[0]}", xlabel,
                                         _label(key)))
        figures[f"curve-{key}"] = "".join(charts)
        lines += [f"![{key}](curve-{key})", ""]
    if not lines:
        lines = ["No metrics.jsonl line with a loss or an evaluation yet.", ""]
    return lines, figures


def _header(folders: Sequence[RunFolder], labels: Sequence[str]) -> list[str]:
    one = len(folders) == 1
    title = (f"# Run report: {labels[0]} ({folders[0].info.get('experiment')})" if one
             else f"# Runs compared: {', '.join(labels)}")
    out = [title, "", f"Written {records.now()} by `python -m hwrepro.study.report --html`."
           " Curves: metrics.jsonl; final metrics and `param_sha256`: final.json; environment: run.json.", ""]
    out += _table(["run", "status", "start", "end", "resumes", "folder"],
                  [[label, f.info.get("status"), f.info.get("start_time"), f.info.get("end_time"),
                    f.info.get("resumes", 0), f"`{f.dir}`"] for f, label in zip(folders, labels)]) + [""]
    for f, label in zip(folders, labels):
        if f.unparsed:
            out += [f"**metrics.jsonl of {label} is damaged**: {f.unparsed} line(s) do not parse (a write cut "
                    f"off?); this report shows the {len(f.rows)} line(s) that do.", ""]
    return out


def _final_section(folders: Sequence[RunFolder], labels: Sequence[str]) -> list[str]:
    out = ["## Final metrics", ""]
    finals = [f.final or {} for f in folders]
    keys = list(dict.fromkeys(k for fin in finals for k in fin if k != "param_sha256"))
    if not keys:
        return out + ["No final.json: no run here finished.", ""]
    sha = [f"`{fin['param_sha256']}`" if "param_sha256" in fin else None for fin in finals]
    return out + _table(["metric", *labels], [[k, *(fin.get(k) for fin in finals)] for k in keys]
                        + [["param_sha256", *sha]]) + [""]


def _time_section(folders: Sequence[RunFolder], labels: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    splits = [run_data.time_split(f) for f in folders]
    activities = list(dict.fromkeys(k for s in splits for k in s))
    out = ["## Where the time went", ""]
    if not any(sum(s.values()) for s in splits):
        return out + ["Nothing was timed yet.", ""], {}
    out += _table(["activity", *(f"{label}: s" for label in labels), *(f"{label}: share" for label in labels)],
                  [[a, *(s.get(a, 0.0) for s in splits),
                    *(f"{100 * s.get(a, 0.0) / max(sum(s.values()), 1e-12):.1f}%" for s in splits)]
                   for a in activities]) + [""]
    out += ["![time shares](time-shares)", "",
            "steps: training steps (train_seconds) less compilation and table rebuilds; compile: the first step "
            "call after each (re)start; rebuilds: the experiment's table upkeep (SLIDE); evaluation: during "
            "training; checkpoints: saving checkpoints and parameter snapshots; final evaluation: where the "
            "experiment timed it; other: the rest of the wall time (start-up, data, final evaluation otherwise). "
            "A resumed run's wall time is its last process's, so its other is understated.", ""]
    return out, {"time-shares": svg.share_bars(list(zip(labels, splits)), "share of the run's time")}


def _config_section(folders: Sequence[RunFolder], labels: Sequence[str]) -> list[str]:
    out = ["## Config where it differs from the defaults", ""]
    for f, label in zip(folders, labels):
        against, changes = run_data.config_changes(f)
        out += [f"{label + ': ' if len(folders) > 1 else ''}compared with {against}.", ""]
        out += (_table(["field", "default", "this run"], [[f"`{k}`", d, v] for k, d, v in changes])
                if changes else ["No field differs."]) + [""]
    if len(folders) > 1:
        configs = [dotted_fields(f.config) for f in folders]
        fields = [k for k in dict.fromkeys(k for c in configs for k in c)
                  if len({repr(c.get(k)) for c in configs}) > 1]
        out += ["Fields that differ between the runs:", ""]
        out += (_table(["field", *labels], [[f"`{k}`", *(c.get(k) for c in configs)] for k in fields])
                if fields else ["None."]) + [""]
    return out


def _environment_section(folders: Sequence[RunFolder], labels: Sequence[str]) -> list[str]:
    envs = [dict(run_data.environment(f.info)) for f in folders]
    keys = list(dict.fromkeys(k for e in envs for k in e))
    return (["## Environment (run.json)", ""]
            + _table(["entry", *labels], [[f"`{k}`", *(e.get(k) for e in envs)] for k in keys]) + [""])


def run_report(workdirs: Sequence[Path]) -> str:
    """The HTML report of one run folder, or of several overlaid (their curves on shared axes, their tables
    side by side). ReportError when a folder is not a run."""
    folders = [run_data.load_run(w) for w in workdirs]
    labels = distinct_labels([f.name for f in folders], [f.dir for f in folders])
    curves, figures = _curve_figures(folders, labels)
    times, time_figures = _time_section(folders, labels)
    text = "\n".join(_header(folders, labels) + _final_section(folders, labels) + ["## Curves", ""] + curves
                     + times + _config_section(folders, labels) + _environment_section(folders, labels))
    title = f"hwrepro: {', '.join(labels)}"
    return page(title, text, {**figures, **time_figures})


def write_run_report(workdir: Path) -> Path:
    """Writes workdir/report.html (a run's own report) and returns its path."""
    return write_page(Path(workdir) / RUN_REPORT_FILE, run_report([workdir]))


def sweep_page(markdown: str, folder: Path, title: str) -> str:
    """The sweep report's HTML: its Markdown with the PNGs it names (in `folder`) inline."""
    names = re.findall(r"^!\[.*\]\((.+)\)$", markdown, flags=re.M)
    return page(title, markdown, {n: png_figure(Path(folder) / n, n) for n in names})
