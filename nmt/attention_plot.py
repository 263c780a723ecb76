"""Cross-attention heat maps as an SVG file, with no plotting library.

`plot_attention(path, Translator.attention(line))` draws one panel per (decoder layer, head): rows are the output
pieces, columns the source pieces, each cell coloured by its weight on the viridis scale from 0 to 1 (the
colormap's table at 17 points, linearly interpolated), with the pieces as labels. SVG is text: any browser
shows it, and it scales. (A plotting library would cost every process start of this package its import time:
Keras imports matplotlib.pyplot, when installed, for image utilities we never use.)
"""

from __future__ import annotations

import os
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import numpy as np

SUFFIX = ".svg"
# viridis at 0, 1/16, ..., 1 (matplotlib's 256-entry table at indices 0, 16, ..., 255), to within 3 per channel
VIRIDIS = (
    (0x44, 0x01, 0x54), (0x48, 0x18, 0x6A), (0x47, 0x2D, 0x7B), (0x42, 0x40, 0x86), (0x3B, 0x52, 0x8B),
    (0x33, 0x63, 0x8D), (0x2C, 0x72, 0x8E), (0x26, 0x82, 0x8E), (0x21, 0x91, 0x8C), (0x1F, 0xA0, 0x88),
    (0x28, 0xAE, 0x80), (0x3F, 0xBC, 0x73), (0x5E, 0xC9, 0x62), (0x84, 0xD4, 0x4B), (0xAD, 0xDC, 0x30),
    (0xD8, 0xE2, 0x19), (0xFD, 0xE7, 0x25),
)  # fmt: skip
CELL = 16  # pixels per heat-map cell
LABEL = 7  # pixels per character of a label (12 px sans-serif, roughly)
GAP = 24  # pixels between panels


def color(weight: float) -> str:
    """The viridis colour of `weight` (clipped to [0, 1]) as `#rrggbb`."""
    position = min(max(float(weight), 0.0), 1.0) * (len(VIRIDIS) - 1)
    low = min(int(position), len(VIRIDIS) - 2)
    fraction = position - low
    mixed = (round(a + (b - a) * fraction) for a, b in zip(VIRIDIS[low], VIRIDIS[low + 1]))
    return "#" + "".join(f"{channel:02x}" for channel in mixed)


def check_path(path: str | Path) -> None:
    """ValueError unless `path` names an SVG file."""
    if Path(path).suffix.lower() != SUFFIX:
        raise ValueError(
            f"attention maps are written as SVG: give a file name ending in {SUFFIX}, not {path}"
        )


def _text(
    x: float, y: float, text: str, *, anchor: str = "start", rotate: bool = False, size: int = 12
) -> str:
    turn = f' transform="rotate(-90 {x:.0f} {y:.0f})"' if rotate else ""
    return (
        f'<text x="{x:.0f}" y="{y:.0f}" font-size="{size}" text-anchor="{anchor}"{turn}>{escape(text)}</text>'
    )


def attention_svg(maps: dict, *, title: str = "") -> str:
    """The SVG document of `maps` (see `plot_attention`)."""
    weights = [np.asarray(layer, dtype=np.float32) for layer in maps["weights"]]
    source, target = list(maps["source"]), list(maps["target"])
    heads = weights[0].shape[0]
    left = LABEL * max(map(len, target), default=1) + 8  # target labels
    labels = LABEL * max(map(len, source), default=1) + 4  # source labels, above the cells
    top = 24 + 18 + labels  # title, panel title, source labels
    width, height = CELL * len(source), CELL * len(target)
    panel_w, panel_h = left + max(width, LABEL * 16) + GAP, top + height + GAP  # room for the panel title
    parts = []
    for layer, layer_weights in enumerate(weights):
        for head in range(heads):
            x0, y0 = head * panel_w + left, layer * panel_h + top
            parts.append(_text(x0, y0 - labels - 6, f"layer {layer + 1}, head {head + 1}"))
            for column, piece in enumerate(source):
                parts.append(_text(x0 + CELL * column + CELL * 0.7, y0 - 4, piece, rotate=True))
            for row, piece in enumerate(target):
                parts.append(_text(x0 - 4, y0 + CELL * row + CELL * 0.75, piece, anchor="end"))
                for column in range(len(source)):
                    value = float(layer_weights[head, row, column])
                    parts.append(
                        f'<rect x="{x0 + CELL * column}" y="{y0 + CELL * row}" width="{CELL}" height="{CELL}" '
                        f'fill="{color(value)}"><title>{value:.3f}</title></rect>'
                    )
    total_w, total_h = heads * panel_w, len(weights) * panel_h
    heading = _text(total_w / 2, 18, title or maps.get("translation", ""), anchor="middle", size=14)
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" '
            f'viewBox="0 0 {total_w} {total_h}" font-family="sans-serif">',
            f"<title>{escape(title or maps.get('translation', ''))}</title>",
            f'<rect width="100%" height="100%" fill={quoteattr("white")}/>',
            heading,
            *parts,
            "</svg>",
            "",
        ]
    )


def plot_attention(path: str | Path, maps: dict, *, title: str = "") -> None:
    """Writes the cross-attention heat maps of `Translator.attention` to the SVG file `path` (rows: decoder layers,
    columns: heads), through a temporary file renamed at the end.

    `maps`: {"source": source pieces, "target": output pieces, "translation": str (the default title), "weights":
    one array (heads, len(target), len(source)) per decoder layer, values in [0, 1]}.
    """
    check_path(path)
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(attention_svg(maps, title=title), encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)  # after a failed write (a full disk): nothing half-written stays
