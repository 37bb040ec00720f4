"""Text from the history, shown as text: run ids, labels, project and scenario names, module
and series names, warning fields and evidence are whatever a producer (or anyone who can write
to the broker) sent. None of it may become markup in a viewer's browser — an image fetched
from elsewhere, a link, a tag, a block that escapes the page's own HTML.

Each Streamlit or plotly context needs its own escaping, one function each:

- :func:`html_text` — inside HTML the page builds (``st.markdown(..., unsafe_allow_html=True)``
  with a block-level element first: CommonMark then parses nothing inside it);
- :func:`md_text` — Markdown contexts that take no HTML: widget and expander labels, alerts,
  ``st.metric`` values;
- :func:`md_code` — the same contexts, as a code span (store paths, commands);
- :func:`plot_text` — plotly names, titles, hover texts and annotations (plotly's own subset
  of HTML: ``<a href>``, ``<b>``, ``<br>``...);

Where none is needed: ``st.text``, ``st.code``, ``st.json``, ``st.dataframe`` cells, and the
options of ``st.selectbox`` / ``st.multiselect`` render their strings as plain text.
"""

from __future__ import annotations

import html
import re
import string

__all__ = ["WORD_JOINER", "block", "html_text", "md_code", "md_text", "plot_text"]

WORD_JOINER = "\u2060"  # invisible, zero width, no break: splits what autolinks would match
_HTML_SAFE = frozenset(string.ascii_letters + string.digits + " -_.,")
_MD_PUNCTUATION = frozenset(string.punctuation)  # CommonMark: each escapable with a backslash
_AUTOLINK_GLUE = frozenset(".:@")


def html_text(value: object) -> str:
    """``value`` (any object, as ``str``) as HTML text or attribute value: every ASCII
    character but letters, digits, space and ``-_.,`` as a numeric character reference.

    So no tag, no entity, no line break (a blank line would end the HTML block and start
    Markdown), no ``:`` (Streamlit rewrites ``:material/`` in the raw source) reaches the
    parser; the browser shows exactly the characters of ``value``.

    >>> html_text('a <b>&\\n\\n![x](http://h/i.png)')
    'a &#60;b&#62;&#38;&#10;&#10;&#33;&#91;x&#93;&#40;http&#58;&#47;&#47;h&#47;i.png&#41;'
    """
    return "".join(c if c in _HTML_SAFE or not c.isascii() else f"&#{ord(c)};" for c in str(value))


def block(inner: str, tag: str = "div") -> str:
    """``inner`` (HTML whose text went through :func:`html_text`) as one HTML block for
    ``st.markdown(..., unsafe_allow_html=True)``: a block-level element on a single line,
    whitespace kept as it is in the text (``white-space: pre-wrap``)."""
    if "\n" in inner or "\r" in inner:
        raise ValueError("a line break in an HTML block: escape the text with html_text")
    return f'<{tag} style="white-space: pre-wrap">{inner}</{tag}>'


def md_text(value: object) -> str:
    """``value`` as inline Markdown that renders as its characters, on one line.

    Every ASCII punctuation character is backslash-escaped (no emphasis, link, image, HTML,
    maths, Streamlit directive or icon), a line break becomes a space, and an invisible word
    joiner goes before each ``.``, ``:`` and ``@``: GFM's autolink literals (``www.x.y``,
    ``http://``, ``a@b.c``) and emoji shortcodes are matched on the text *after* the escapes
    are resolved, so the escapes alone would not stop them.

    >>> md_text("**a** www.x.io") == "\\\\*\\\\*a\\\\*\\\\* www\\u2060\\\\.x\\u2060\\\\.io"
    True
    """
    out = []
    for c in str(value):
        if c in "\r\n":
            out.append(" ")
        elif c in _AUTOLINK_GLUE:
            out.append(WORD_JOINER + "\\" + c)
        elif c in _MD_PUNCTUATION:
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


def md_code(value: object) -> str:
    """``value`` as a Markdown code span (monospace, nothing inside it parsed), on one line.

    >>> md_code("a`b")
    '`` a`b ``'
    """
    text = " ".join(str(value).splitlines()).replace(":material/", f":{WORD_JOINER}material/")
    fence = "`" * (1 + max((len(run) for run in re.findall("`+", text)), default=0))
    return f"{fence} {text} {fence}"  # one space each side: CommonMark strips exactly that


def plot_text(value: object) -> str:
    """``value`` for plotly text (trace names, titles, hover text, annotations): ``&``, ``<``
    and ``>`` as entities, so plotly's pseudo-HTML makes no tag of it, and ``$`` as one, so
    a string in dollars is not taken for LaTeX.

    >>> plot_text('<a href="x">$y$</a> &')
    '&lt;a href="x"&gt;&#36;y&#36;&lt;/a&gt; &amp;'
    """
    return html.escape(str(value), quote=False).replace("$", "&#36;")
