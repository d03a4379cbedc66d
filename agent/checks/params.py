"""The params a check takes, and reading the server's `params` object against them.

Unknown names are refused rather than ignored: a misspelt threshold ("min_tflop")
would otherwise let every run pass."""

from dataclasses import dataclass


class ParamError(ValueError):
    """The params do not fit the check; the message names the param."""


@dataclass(frozen=True)
class Param:
    kind: str  # "int", "number" or "string"
    default: object = None  # None: optional, absent unless given
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple = ()
    help: str = ""

    def read(self, name, value):
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ParamError(f"{name}: expected an integer, got {value!r}")
        elif self.kind == "number":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ParamError(f"{name}: expected a number, got {value!r}")
            if value != value or value in (float("inf"), float("-inf")):
                raise ParamError(f"{name}: expected a finite number, got {value!r}")
        elif self.kind == "string":
            if not isinstance(value, str) or not value:
                raise ParamError(f"{name}: expected a non-empty string, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise ParamError(f"{name}: {value!r} is below the least allowed, {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise ParamError(f"{name}: {value!r} is above the most allowed, {self.maximum:g}")
        if self.choices and value not in self.choices:
            raise ParamError(f"{name}: {value!r} is not one of {', '.join(self.choices)}")
        return value


def read_params(params, spec):
    """The params with defaults filled in: {name: value or None}. A JSON null counts as
    not given. Raises ParamError naming the first param that does not fit."""
    if not isinstance(params, dict):
        raise ParamError(f"params: expected a JSON object, got {params!r}")
    unknown = sorted(name for name in params if name not in spec)
    if unknown:
        raise ParamError(
            f"{unknown[0]}: not a param of this check; it takes {', '.join(sorted(spec))}"
        )
    values = {}
    for name, param in spec.items():
        value = params.get(name)
        values[name] = param.default if value is None else param.read(name, value)
    return values
