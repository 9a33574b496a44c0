"""What a plot shows in words: the texts of an SVG plot drawn with its text kept as text.

Matplotlib writes text into an SVG as glyph outlines by default; with ``svg.fonttype`` 'none'
(the :func:`tests.conftest.plot_text_as_text` fixture) it writes each text as an SVG
``<text>``, typeset the same way: a tick label that matplotlib typesets as ``10^5`` is the
characters "105" there, and one left as TeX source is ``$\\mathdefault{10^{5}}$``, which is
what a person would see drawn.
"""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

SVG = "{http://www.w3.org/2000/svg}"
DATA_URI = re.compile(r'src="(data:image/svg\+xml;base64,[^"]+)"')


@dataclass(frozen=True)
class DrawnText:
    text: str  # as drawn: typeset mathtext is its characters, without the markup
    x: float | None  # the anchor in SVG pixels (None for typeset mathtext, placed glyph by glyph)
    y: float | None
    size: float | None  # font size, px


def drawn_texts(uri: str) -> list[DrawnText]:
    """Every text of the SVG data URI ``uri``, in drawing order."""
    svg = ET.fromstring(base64.b64decode(uri.split(",", 1)[1]))
    out = []
    for element in svg.iter(f"{SVG}text"):
        size = re.search(r"font-size: ([\d.]+)px", element.get("style", ""))
        x, y = element.get("x"), element.get("y")
        out.append(
            DrawnText(
                text="".join(part.strip() for part in element.itertext()),
                x=float(x) if x else None,
                y=float(y) if y else None,
                size=float(size.group(1)) if size else None,
            )
        )
    return out


def page_plots(html: str) -> list[str]:
    """The SVG data URIs of a page's ``<img>`` plots."""
    return DATA_URI.findall(html)
