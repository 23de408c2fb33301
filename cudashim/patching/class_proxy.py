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


def subclassable_class_proxy(real_cls, construct, also):
    """A stand-in for ``real_cls`` that code may also derive from (torch's own modules derive
    from ``torch.Stream`` and ``torch.Event`` when they are imported, which may be after
    activation): a subclass of the real class whose calls are ``construct(*args, **kwargs)``
    and whose instances are the real class's and ``also``'s; a class derived from it is an
    ordinary subclass of the real class."""
    classes = (real_cls, also)

    class _Meta(ClassProxy):
        def __instancecheck__(cls, obj):
            return isinstance(obj, classes) if cls is stand_in else type.__instancecheck__(cls, obj)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, classes) if cls is stand_in else type.__subclasscheck__(cls, sub)

        def __call__(cls, *args, **kwargs):
            return construct(*args, **kwargs) if cls is stand_in else type.__call__(cls, *args, **kwargs)

        def __repr__(cls):
            return repr(real_cls) if cls is stand_in else type.__repr__(cls)

    stand_in = _Meta(real_cls.__name__, (real_cls,), {"__module__": real_cls.__module__,
                                                      "__doc__": real_cls.__doc__,
                                                      "__wrapped__": real_cls})
    return stand_in
