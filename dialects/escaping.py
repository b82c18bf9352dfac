"""Names in printed IR and messages: one escaping, so any name round-trips.

Axis names and pytree paths are user strings: they may hold `"`, `\\`,
newlines or non-ASCII. IR prints them as MLIR string literals (xDSL's
`Printer.print_string_literal`: `\\\\`, `\\22`, and `\\XX` for each byte
outside printable ASCII), which the parser reads back exactly; messages quote
them the same way, so a message stays one line.
"""

from __future__ import annotations


def quoted(name: str) -> str:
    """`name` as an MLIR string literal, e.g. `"a\\22b"` for `a"b`."""
    out = ['"']
    for byte in name.encode("utf-8"):
        if byte == 0x5C:
            out.append("\\\\")
        elif byte < 0x20 or byte > 0x7E or byte == 0x22:
            out.append(f"\\{byte:02X}")
        else:
            out.append(chr(byte))
    out.append('"')
    return "".join(out)


def readable(text: str) -> str:
    """`text` as it is where it is plain printable ASCII without `"` or `\\`,
    else `quoted(text)`: one line that shows every character, for tables."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return quoted(text)
