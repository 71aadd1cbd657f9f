"""The one exception type a person sees: a single line naming the file, tensor, field or limit at fault; and the
kind check that the options' one-line errors share."""

from numbers import Integral, Real


class StrataError(Exception):
    """A user-facing error; the CLI prints its message on one line and exits with code 2."""


def number_of_kind(value, kind: type[Integral] | type[Real]) -> bool:
    """Whether value is a number of that kind (numbers.Integral or numbers.Real, numpy's scalars too), a bool not
    counted."""
    return isinstance(value, kind) and not isinstance(value, bool)
