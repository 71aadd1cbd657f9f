"""The one exception type a person sees: a single line naming the file, tensor, field or limit at fault."""


class StrataError(Exception):
    """A user-facing error; the CLI prints its message on one line and exits with code 2."""
