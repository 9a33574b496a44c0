"""The texts of an SVG plot drawn with ``svg.fonttype`` 'none': each text as a person would read it."""

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
    y: float | None  # the anchor in SVG pixels (None for typeset mathtext, placed glyph by glyph)
    size: float | None  # font size, px


def drawn_texts(uri: str) -> list[DrawnText]:
    """Every text of the SVG data URI ``uri``, in drawing order."""
    svg = ET.fromstring(base64.b64decode(uri.split(",", 1)[1]))
    out = []
    for element in svg.iter(f"{SVG}text"):
        size = re.search(r"font-size: ([\d.]+)px", element.get("style", ""))
        y = element.get("y")
        text = "".join(part.strip() for part in element.itertext())
        out.append(DrawnText(text, float(y) if y else None, float(size.group(1)) if size else None))
    return out


def page_plots(html: str) -> list[str]:
    """The SVG data URIs of a page's ``<img>`` plots."""
    return DATA_URI.findall(html)
