"""Runs a card model's cross-field rules inside pydantic validation, with their field paths.

Owns how rule problems join pydantic's own errors (also when other fields failed); no rules here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, TypeVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic.functional_validators import ModelWrapValidatorHandler
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from loom_runtime.card.errors import Problem

M = TypeVar("M", bound=BaseModel)
_STRICT = ConfigDict(strict=True)


# A cross-field check of one model: every problem as (path relative to the model, code, message).
Rule = Callable[[Any], Sequence[Problem]]


def _details(problems: Sequence[Problem]) -> list[InitErrorDetails]:
    return [
        InitErrorDetails(type=PydanticCustomError(code, message), loc=tuple(path), input=None)
        for path, code, message in problems
    ]


def raise_for(title: str, problems: Sequence[Problem]) -> None:
    """Raise the problems as one pydantic ValidationError (if any), paths relative to the model.

    pydantic merges them, with their full path, into the errors of the enclosing card.
    """
    if problems:
        raise ValidationError.from_exception_data(title, _details(problems))


def _carried(errors: Sequence[ErrorDetails]) -> list[InitErrorDetails]:
    return [
        InitErrorDetails(
            type=PydanticCustomError(e["type"], e["msg"]), loc=e["loc"], input=e["input"]
        )
        for e in errors
    ]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class of `M` or `M | None`, else None."""
    for arg in (annotation, *get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _adapter(info: FieldInfo) -> TypeAdapter[Any]:
    """Validates one field on its own exactly as its model does: constraints, strictness."""
    if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
        return TypeAdapter(info.annotation)  # a model brings its own (strict) config
    form: Any = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return TypeAdapter(form, config=_STRICT)


def _partial(info: FieldInfo, raw: object) -> tuple[bool, Any]:
    """`(found, value)`: `raw` parsed as field `info`, or built from the parts that parse.

    A model (or list of models) that fails is built with only its valid fields set; reading a
    field that failed raises AttributeError, so a rule that needs it is skipped, never misled.
    """
    try:
        return True, _adapter(info).validate_python(raw)
    except ValidationError:
        pass
    annotation = info.annotation
    model = _model_in(annotation)
    if model is not None and isinstance(raw, Mapping):
        return True, _construct(model, raw)
    args = get_args(annotation)
    item = _model_in(args[0]) if get_origin(annotation) is list and args else None
    if item is not None and isinstance(raw, list) and all(isinstance(x, Mapping) for x in raw):
        return True, [_construct(item, x) for x in raw]
    return False, None


def _construct(model: type[BaseModel], raw: Mapping[str, Any]) -> BaseModel:
    """An unvalidated `model` holding the fields of `raw` that parse (and defaults for absent)."""
    values: dict[str, Any] = {}
    broken: list[str] = []
    for name, info in model.model_fields.items():
        key = info.alias if info.alias is not None and info.alias in raw else name
        if key not in raw:
            continue
        found, value = _partial(info, raw[key])
        if found:
            values[name] = value
        else:
            broken.append(name)
    built = model.model_construct(**values)
    for name in broken:
        built.__dict__.pop(name, None)  # a default must not stand in for a wrong value
    return built


def _partial_problems(model: type[BaseModel], data: object, rules: Sequence[Rule]) -> list[Problem]:
    """Problems of the rules that can run on the parts of `data` that parse."""
    if not isinstance(data, Mapping):
        return []
    built = _construct(model, data)
    problems: list[Problem] = []
    for rule in rules:
        try:
            problems.extend(rule(built))
        except AttributeError:
            continue  # the rule reads a field that failed; its own error is reported
    return problems


def validate_with_rules(
    model: type[M], data: object, handler: ModelWrapValidatorHandler[M], rules: Sequence[Rule]
) -> M:
    """Body of a `mode="wrap"` model validator: validate, then run every rule that can run.

    When some fields fail, the rules that read only other fields still run, so a card reports
    its cross-field problems together with its type errors instead of one round at a time.
    """
    try:
        built = handler(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        extra = _partial_problems(model, data, rules)
        raise ValidationError.from_exception_data(
            model.__name__, _carried(errors) + _details(extra)
        ) from None
    raise_for(model.__name__, [p for rule in rules for p in rule(built)])
    return built
