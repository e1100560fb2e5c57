"""Checks of what a reader or a user gives the code, each failing with an error that names
the value and says how to fix it (InputError): the tests of a count and of a number, and the
check of a config against its rules, which ModelConfig (chapter 3.6) and TrainConfig
(chapter 5) share. Written by hand, without torch: the paper's module imports it."""


class InputError(ValueError):
    """A value given to the code is wrong; the message names it and says how to fix it."""


def is_positive_int(value):
    return type(value) is int and value > 0  # True is an int to Python, but no count


def positive_int(name, value):
    """value, if it is a positive integer; otherwise an InputError naming it."""
    if not is_positive_int(value):
        raise InputError(f"{name} must be a positive integer, got {value!r}")
    return value


def numeric(value):
    return isinstance(value, int | float) and not isinstance(value, bool)  # True is an int


def check_rules(config):
    """Raise an InputError naming the first field of `config` that breaks its rule:
    config.rules() is {field: (what it must be, a test of the value)}."""
    for name, (rule, holds) in config.rules().items():
        value = getattr(config, name)
        if not holds(value):
            raise InputError(f"{name} must be {rule}, got {value!r}")
