"""The errors partir raises for bad input, at every stage.

Every refusal of partir is a `PartirError` whose message names what is wrong
(the op, value, axis or option) and says what to do instead. The subclasses
also derive from the built-in error a caller would expect (`ValueError` for
a bad value, `TypeError` for a value of the wrong kind), so
`except ValueError` keeps working. The module sits below every stage (it
imports nothing), so the dialects, the rewrites, the lowering and the API all
raise from the same hierarchy; `partir` re-exports it.
"""

from __future__ import annotations


class PartirError(Exception):
    """Bad input that partir refuses, with a message saying what to do."""


class PartirValueError(PartirError, ValueError):
    """A value partir cannot use: an unknown axis, a dim an axis does not
    divide, a name that selects nothing, a mesh larger than the devices."""


class PartirTypeError(PartirError, TypeError):
    """A value of the wrong kind: a tactic that is not a `partir.Tactic`, a
    dim given as a string, an argument that is not an array."""


class UnsupportedError(PartirValueError):
    """A program partir cannot partition faithfully: an op no stage can
    emit or run. The message names the op, where it is, and the nearest
    alternative partir supports."""
