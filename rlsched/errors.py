"""The one exception type a user may see: bad input, named and explained.

`UserError` carries a paragraph that says what is wrong and how to fix it. The CLI prints it and
exits with status 2; everything else that escapes is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input from the user (config, files, arguments). The message is shown as is."""
