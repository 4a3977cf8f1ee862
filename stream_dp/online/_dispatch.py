"""One public name per algorithm, one river class per task.

``OnPairStrC(task="auc")`` must be a river ``Classifier`` and ``OnPairStrC(task="metric")`` a
``SupervisedTransformer``; a Python class cannot be both. The public class therefore returns an
instance of a task-specific subclass (``isinstance(model, OnPairStrC)`` still holds), and
river's ``clone`` rebuilds that subclass directly.
"""

from __future__ import annotations

from stream_dp.online.interfaces import AUCInterface, MetricInterface

__all__ = ["task_variants"]


def task_variants(cls: type, module_globals: dict) -> None:
    """Create ``<Name>AUC`` and ``<Name>Metric`` subclasses and route construction to them."""
    variants = {}
    for task, iface in (("auc", AUCInterface), ("metric", MetricInterface)):
        name = f"{cls.__name__}{'AUC' if task == 'auc' else 'Metric'}"
        sub = type(name, (cls, iface), {"__module__": cls.__module__, "_task": task})
        sub.__qualname__ = name
        sub.__doc__ = cls.__doc__
        module_globals[name] = sub
        variants[task] = sub
    cls._variants = variants

    def __new__(klass, *args, **kwargs):
        if klass is cls:
            task = kwargs.get("task", args[0] if args else "auc")
            if task not in variants:
                raise ValueError(f"task must be 'auc' or 'metric', got {task!r}")
            klass = variants[task]
        return object.__new__(klass)

    cls.__new__ = __new__
