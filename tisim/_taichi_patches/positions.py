"""Short source positions in Taichi's AST translation.

Why: for every AST node of every kernel it translates, Taichi 1.7 builds a message quoting
the node's source line under a caret underline (``textwrap``), kept only for compile-error
messages. The short form keeps the message's first line (file, line and kernel or function)
without the quote; with ``source_cache`` it halves the front end's time (see there).
``tisim --debug`` (``backend.init(debug=True)``) keeps Taichi's full messages.

Applies to: Taichi 1.7 (``ASTTransformerContext.get_pos_info``).
Results: unchanged (only compile-error messages are shorter).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def install() -> bool:
    """Replace ``ASTTransformerContext.get_pos_info``; returns whether it is in place."""
    try:
        from taichi.lang.ast.ast_transformer_utils import ASTTransformerContext as Context
    except ImportError as exc:
        log.debug("Taichi's source positions left as they are: %s", exc)
        return False
    full = getattr(Context, "get_pos_info", None)
    if full is None:
        log.debug("Taichi's source positions left as they are: not 1.7's front end")
        return False
    if getattr(full, "_tisim", False):
        return True

    def get_pos_info(self, node):
        return f'File "{self.file}", line {node.lineno + self.lineno_offset}, in {self.func.func.__name__}:\n'

    get_pos_info._tisim = True
    Context.get_pos_info = get_pos_info
    return True
