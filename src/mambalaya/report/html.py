"""A Markdown report as one self-contained HTML page (``report.md`` -> ``report.html``).

The page is the Markdown rendered as it stands (Python-Markdown with tables and a table of
contents), so it carries exactly the report's content, with three changes that make it a single
file to send:

- every local image is embedded: ``figures/NAME.png`` is replaced by the inline SVG of
  ``figures/NAME.svg`` beside it (its ids prefixed so that figures cannot clash), or, without
  an SVG, by the PNG as a ``data:`` URI; a link to the figure's file becomes a link that saves
  the inline SVG; a figure of the run the Markdown does not show is appended at the end;
- every table is sortable by clicking (or pressing Enter on) a header: a few lines of inline
  script, numbers compared as numbers (``1,750,000,000``, ``1.9×``, ``+15%``);
- raw HTML in the Markdown is shown as text, never interpreted.

Nothing on the page refers to the network: no stylesheet, script or image is loaded from
anywhere. The module reads the report and the figure files and writes the page; it knows
nothing of how they were made.
"""

from __future__ import annotations

import base64
import html
import os
import re
from pathlib import Path
from typing import Iterable
from urllib.parse import unquote, urlsplit
from xml.etree import ElementTree as etree

import markdown
from markdown.extensions.toc import TocExtension
from markdown.treeprocessors import Treeprocessor

from mambalaya.errors import MambalayaError

FIGURE_SUFFIXES = (".svg", ".png")
#: An inline figure is shown as wide as its PNG, which save_figure draws at 150 dots per inch
#: (so 1 pt of the SVG is 150/72 CSS px), and never wider than the page.
FIGURE_DPI = 150
_SVG_WIDTH = re.compile(r'<svg\b[^>]*?\swidth="([\d.]+)(pt|px)?"')
_SVG_START = re.compile(r"<svg[\s>]")
_SVG_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)
_SVG_ID = re.compile(r'(\sid=")([^"]+)(")')
_SVG_REF = re.compile(r'((?:xlink:)?href="#|url\(#)([^")]+)')
_NOT_ID = re.compile(r"[^A-Za-z0-9_.-]+")


def write_html_report(markdown_path: Path, figures: Iterable[Path] = ()) -> Path:
    """Write ``markdown_path`` as a self-contained page beside it (same name, ``.html``).

    Images are looked up relative to the Markdown file's folder; ``figures`` (PNG/SVG files of
    the same run) that the Markdown does not show are appended under their own heading.
    """
    markdown_path = Path(markdown_path)
    try:
        text = markdown_path.read_text(encoding="utf-8")
    except OSError as err:
        raise MambalayaError(f"cannot read the report {str(markdown_path)!r} to render it as HTML: {err}") from err
    page = render_html(text, markdown_path.parent, figures, source=markdown_path.name)
    out = markdown_path.with_suffix(".html")
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as err:
        raise MambalayaError(f"cannot write the HTML report {str(out)!r}: {err}") from err
    return out


def render_html(markdown_text: str, base_dir: Path, figures: Iterable[Path] = (), *, source: str = "report.md") -> str:
    """The page for ``markdown_text``, whose relative image paths start at ``base_dir``."""
    md = markdown.Markdown(extensions=["tables", TocExtension(toc_depth="2-3")])
    md.preprocessors.deregister("html_block")  # raw HTML is text, escaped like any other
    md.inlinePatterns.deregister("html")
    embed = _EmbedFigures(md, Path(base_dir), _figure_bases(figures), source)
    md.treeprocessors.register(embed, "mambalaya_embed_figures", 15)  # after inline (20), before toc (5)
    body = md.convert(markdown_text)
    return _page(_title(markdown_text, source), md.toc, body, source)


def _figure_bases(figures: Iterable[Path]) -> list[Path]:
    """Each figure once, as its absolute path without the suffix, in the order given."""
    bases = (Path(p) for p in figures if Path(p).suffix.lower() in FIGURE_SUFFIXES)
    return list(dict.fromkeys(_figure_base(p) for p in bases))


def _figure_base(path: Path) -> Path:
    """``path`` made absolute, without a figure suffix (``figures/a.png`` and ``figures/a.svg``
    are one figure)."""
    path = Path(os.path.abspath(path))
    return path.with_name(path.stem) if path.suffix.lower() in FIGURE_SUFFIXES else path


def _local_path(url: str) -> str | None:
    """The relative file path ``url`` names, or None for a link elsewhere (a scheme, a host or
    only a fragment)."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or not parts.path:
        return None
    return unquote(parts.path)


class _EmbedFigures(Treeprocessor):
    """Inlines each local image, makes tables sortable, points figure links at the inline copy."""

    def __init__(self, md: markdown.Markdown, base_dir: Path, figures: list[Path], source: str) -> None:
        super().__init__(md)
        self.base_dir = base_dir
        self.figures = figures
        self.source = source
        self.ids: dict[Path, str] = {}  # figure (absolute path without suffix) -> id of its first inline copy
        self.used_ids: set[str] = set()
        self.svg: set[Path] = set()  # the figures embedded as SVG

    def run(self, root: etree.Element) -> None:
        for parent in list(root.iter()):
            for index, child in enumerate(list(parent)):
                if child.tag == "img":
                    parent[index] = self._embed(child)
                elif child.tag == "table":
                    parent[index] = _sortable(child)
        self._append_unshown(root)
        for link in root.iter("a"):
            self._point_at_inline(link)

    def _embed(self, img: etree.Element) -> etree.Element:
        src = img.get("src", "")
        rel = _local_path(src)
        if rel is None:
            if src.startswith("data:"):
                return img
            raise MambalayaError(
                f"{self.source} shows the image {src!r} from elsewhere; a self-contained HTML report can only "
                f"embed images from its own folder ({self.base_dir})")
        return self._embed_file(_figure_base(self.base_dir / rel), img)

    def _embed_file(self, base: Path, img: etree.Element) -> etree.Element:
        """The inline copy of figure ``base`` (its SVG, else its PNG) in place of ``img``."""
        svg, png = base.with_name(base.name + ".svg"), base.with_name(base.name + ".png")
        fid = self._new_id(base)
        if svg.is_file():
            self.svg.add(base)
            markup = inline_svg(_read(svg, self.source).decode("utf-8"), f"{fid}-")
            span = etree.Element("span", {"class": "figure", "id": fid, "role": "img", "aria-label": img.get("alt", "")})
            width_px = shown_width_px(markup)
            if width_px is not None:
                span.set("style", f"width: {width_px:.0f}px")
            span.text = self.md.htmlStash.store(markup)
            span.tail = img.tail
            return span
        if png.is_file():
            img.set("src", "data:image/png;base64," + base64.b64encode(_read(png, self.source)).decode("ascii"))
            img.set("id", fid)
            return img
        raise MambalayaError(
            f"{self.source} shows the image {img.get('src', base.name)!r}, but neither {svg.name} nor {png.name} "
            f"is in {svg.parent}; the HTML report embeds every figure, so it cannot be written without it")

    def _new_id(self, base: Path) -> str:
        stem = "fig-" + _NOT_ID.sub("-", base.name)
        fid, n = stem, 1
        while fid in self.used_ids:
            n += 1
            fid = f"{stem}-{n}"
        self.used_ids.add(fid)
        self.ids.setdefault(base, fid)
        return fid

    def _append_unshown(self, root: etree.Element) -> None:
        unshown = [b for b in self.figures if b not in self.ids]
        if not unshown:
            return
        etree.SubElement(root, "h2").text = "Figures not shown above"
        for base in unshown:
            etree.SubElement(root, "p").append(self._embed_file(base, etree.Element("img", {"alt": base.name})))
            etree.SubElement(etree.SubElement(root, "p"), "em").text = base.name

    def _point_at_inline(self, link: etree.Element) -> None:
        rel = _local_path(link.get("href", ""))
        if rel is None:
            return
        base = _figure_base(self.base_dir / rel)
        if base not in self.ids:
            return
        link.set("href", f"#{self.ids[base]}")
        if base in self.svg:
            link.set("data-figure", self.ids[base])
            link.set("data-svg-download", base.name + ".svg")


def _read(path: Path, source: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise MambalayaError(f"cannot read {str(path)!r}, a figure of {source}: {err}") from err


def _sortable(table: etree.Element) -> etree.Element:
    """``table`` marked sortable, in a box that scrolls sideways when the table is wide."""
    table.set("class", "sortable")
    wrap = etree.Element("div", {"class": "table-wrap"})
    wrap.tail, table.tail = table.tail, None
    wrap.append(table)
    return wrap


def inline_svg(svg_text: str, id_prefix: str) -> str:
    """An SVG file's ``<svg>`` element, to place inside HTML: without the XML prolog, doctype and
    metadata, and with every id (and every reference to one) prefixed by ``id_prefix``."""
    start = _SVG_START.search(svg_text)
    if start is None:
        raise MambalayaError("an SVG figure has no <svg> element")
    svg = _SVG_METADATA.sub("", svg_text[start.start():]).strip()
    ids = {m.group(2) for m in _SVG_ID.finditer(svg)}
    svg = _SVG_ID.sub(lambda m: f"{m.group(1)}{id_prefix}{m.group(2)}{m.group(3)}", svg)
    return _SVG_REF.sub(lambda m: m.group(1) + (id_prefix if m.group(2) in ids else "") + m.group(2), svg)


def shown_width_px(svg: str) -> float | None:
    """The width in CSS px at which the ``<svg>`` element is shown (that of its PNG at
    FIGURE_DPI), or None when its width is not in pt or px."""
    width = _SVG_WIDTH.match(svg)
    if width is None:
        return None
    points = float(width.group(1)) * (72 / 96 if width.group(2) in (None, "px") else 1.0)
    return points / 72 * FIGURE_DPI


def _title(markdown_text: str, source: str) -> str:
    first = re.search(r"^#\s+(.+?)\s*#*\s*$", markdown_text, re.MULTILINE)
    return first.group(1).replace("`", "") if first else source


_STYLE = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f; margin: 0; }
main { max-width: 76rem; margin: 0 auto; padding: 1rem 1.5rem 4rem; }
h1, h2, h3 { line-height: 1.25; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: .9em;
       background: #f2f2f4; padding: 0 .25em; border-radius: 3px; }
nav.toc { background: #f7f7f9; border: 1px solid #e2e2e6; border-radius: 4px; padding: .5em 1em; font-size: .9em; }
nav.toc ul { margin: .2em 0; padding-left: 1.3em; }
.table-wrap { overflow-x: auto; margin: 1em 0; }
table { border-collapse: collapse; font-size: .85em; }
th, td { border: 1px solid #d0d0d6; padding: .25em .55em; text-align: left; vertical-align: top; }
tbody tr:nth-child(even) { background: #f7f7f9; }
table.sortable th { cursor: pointer; user-select: none; background: #eceef4; white-space: nowrap; }
table.sortable th::after { content: " \\2195"; color: #9a9aa5; }
table.sortable th[aria-sort="ascending"]::after { content: " \\25B2"; color: #333; }
table.sortable th[aria-sort="descending"]::after { content: " \\25BC"; color: #333; }
.figure { display: block; max-width: 100%; margin: 1em 0 .3em; }
.figure svg, p > img { display: block; max-width: 100%; height: auto; }
.figure[style] svg { width: 100%; }
footer { color: #666; font-size: .85em; margin-top: 3em; }
"""

# Sorts a table by the clicked header (again: the other way); saves an inline figure as SVG.
_SCRIPT = """
(function () {
  "use strict";
  var NUMBER = /^[+-]?(?:\\d[\\d,]*(?:\\.\\d*)?|\\.\\d+)(?:e[+-]?\\d+)?\\s*[\\u00d7%]?$/i;
  var collator = new Intl.Collator(undefined, {numeric: true, sensitivity: "base"});
  function key(cell) {
    var text = cell ? cell.textContent.trim() : "";
    return {number: NUMBER.test(text) ? parseFloat(text.replace(/,/g, "")) : null, text: text};
  }
  function compare(a, b) {
    if (a.number !== null && b.number !== null) return a.number - b.number;
    if (a.number !== null || b.number !== null) return a.number !== null ? -1 : 1;
    return collator.compare(a.text, b.text);
  }
  function sortBy(table, th, column) {
    var ascending = th.getAttribute("aria-sort") !== "ascending";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r, s) {
      var order = compare(key(r.cells[column]), key(s.cells[column]));
      return ascending ? order : -order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    Array.prototype.forEach.call(th.parentNode.cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    if (!table.tHead || !table.tBodies.length) return;
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, column) {
      th.tabIndex = 0;
      th.title = "sort by this column";
      th.addEventListener("click", function () { sortBy(table, th, column); });
      th.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sortBy(table, th, column); }
      });
    });
  });
  document.querySelectorAll("a[data-svg-download]").forEach(function (link) {
    link.addEventListener("click", function () {
      var figure = document.getElementById(link.getAttribute("data-figure"));
      var svg = figure && figure.querySelector("svg");
      if (!svg) return;
      if (link.href.indexOf("blob:") === 0) URL.revokeObjectURL(link.href);
      var text = new XMLSerializer().serializeToString(svg);
      link.href = URL.createObjectURL(new Blob([text], {type: "image/svg+xml"}));
      link.download = link.getAttribute("data-svg-download");
    });
  });
})();
"""


def _with_contents(body: str, toc: str) -> str:
    """``body`` with the table of contents after its title (at its top without one)."""
    nav = f'<nav class="toc" aria-label="contents">{toc}</nav>\n'
    head, title_end, rest = body.partition("</h1>")
    return f"{head}{title_end}\n{nav}{rest}" if title_end else nav + body


def _page(title: str, toc: str, body: str, source: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_STYLE}</style>
</head>
<body>
<main>
{_with_contents(body, toc)}
<footer>This page is {html.escape(source)} with its figures inline: it needs no other file. The CSV tables and
figure files it was made from are in the folder it was written to.</footer>
</main>
<script>{_SCRIPT}</script>
</body>
</html>
"""
