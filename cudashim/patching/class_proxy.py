"""Stand-ins for C classes whose constructor takes a device (``torch.device``,
``torch.Generator``): calling them translates, ``isinstance`` still works, and the
instances are the real class's."""


class ClassProxy(type):
    """The metaclass every stand-in's own metaclass derives from: ``real_class`` finds
    the class a stand-in stands for, for code that compares classes by identity
    (TorchScript's ``ann is torch.device``)."""


def real_class(obj):
    """The real class behind a stand-in; anything else unchanged."""
    return type.__getattribute__(obj, "__wrapped__") if isinstance(obj, ClassProxy) else obj


def class_proxy(real_cls, construct, call=None):
    """A stand-in for ``real_cls`` whose calls are ``construct(*args, **kwargs)``; ``call``,
    where given, is the metaclass ``__call__`` (a compiled one that behaves the same)."""
    class _Meta(ClassProxy):
        def __instancecheck__(cls, obj):
            return isinstance(obj, real_cls)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, real_cls)

        def __call__(cls, *args, **kwargs):
            return construct(*args, **kwargs)

        # Equal to the real class and hashed like it: tables keyed by ``torch.device`` that
        # torch builds after activation (torch.compile's, for one) still find real devices.
        def __eq__(cls, other):
            return other is cls or other is real_cls

        def __hash__(cls):
            return hash(real_cls)

        def __getattr__(cls, name):
            return getattr(real_cls, name)

        def __repr__(cls):
            return repr(real_cls)

    if call is not None:
        _Meta.__call__ = call
    return _Meta(real_cls.__name__, (), {"__module__": real_cls.__module__,
                                         "__doc__": real_cls.__doc__,
                                         "__wrapped__": real_cls})
