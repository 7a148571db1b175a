"""The one exception type for user mistakes.

Anything a user can get wrong (a flag, a config field, a data file) raises `UserError` with a
one-line message that names the field or file and what is wrong. The CLIs catch it, print
`relif: error: <message>` and exit with status 2; no traceback is shown.
"""


class UserError(Exception):
    """Bad input from the user: a one-line, actionable message."""
