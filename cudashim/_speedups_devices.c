/* The compiled fast path, device arguments: the translator's caches read in C, Rewriter (a
 * callable's device arguments translated, patching/rewriter.py), DefaultDevice (Tensor.cuda())
 * and NamedDevice (torch.device("cuda") through the class stand-in's __call__). */

#include "_speedups.h"

/* ------------------------------------------------------------------------------------ */
/* Translation: the translator's caches read in C, its function called on a miss          */
/* ------------------------------------------------------------------------------------ */

typedef struct {
    PyObject *translate;      /* spec -> translated spec (the Python translator) */
    PyObject *cache;          /* dict spec -> result or the unchanged marker, or NULL */
    PyObject *indices;        /* dict int -> result (ints are kept apart: True == 1), or NULL */
    PyObject *unchanged;      /* the marker for "hand back the caller's object" */
    /* The value last found in the caches, and what it translates to (itself where unchanged).
     * A cache entry never changes once made, so the same object translates the same: a
     * program passing one device (or "cpu") to every call pays a pointer comparison, not a
     * dict lookup. Only objects whose equality is their class's own are kept (an exact str
     * or int, a class that cannot be subclassed: torch.device). */
    PyObject *last, *last_result;
} Translation;

static int translation_init(Translation *t, PyObject *translate, PyObject *cache,
                            PyObject *indices, PyObject *unchanged)
{
    if (!PyCallable_Check(translate)) {
        PyErr_SetString(PyExc_TypeError, "translate must be callable");
        return 0;
    }
    if ((cache != Py_None && !PyDict_Check(cache)) || (indices != Py_None && !PyDict_Check(indices))) {
        PyErr_SetString(PyExc_TypeError, "the translation caches must be dicts or None");
        return 0;
    }
    t->translate = translate;
    Py_INCREF(translate);
    t->cache = cache == Py_None ? NULL : (Py_INCREF(cache), cache);
    t->indices = indices == Py_None ? NULL : (Py_INCREF(indices), indices);
    Py_INCREF(unchanged);
    t->unchanged = unchanged;
    return 1;
}

static int translation_traverse(Translation *t, visitproc visit, void *arg)
{
    Py_VISIT(t->translate);
    Py_VISIT(t->cache);
    Py_VISIT(t->indices);
    Py_VISIT(t->unchanged);
    Py_VISIT(t->last);
    Py_VISIT(t->last_result);
    return 0;
}

static void translation_clear(Translation *t)
{
    Py_CLEAR(t->translate);
    Py_CLEAR(t->cache);
    Py_CLEAR(t->indices);
    Py_CLEAR(t->unchanged);
    Py_CLEAR(t->last);
    Py_CLEAR(t->last_result);
}

/* A new reference to the translated value (``value`` itself where nothing changes). */
static int kept_by_identity(PyObject *value)
{
    return PyUnicode_CheckExact(value) || PyLong_CheckExact(value) ||
           !PyType_HasFeature(Py_TYPE(value), Py_TPFLAGS_BASETYPE);
}

static PyObject *translate_value(Translation *t, PyObject *value)
{
    PyObject *table;
    if (value == t->last) {
        Py_INCREF(t->last_result);
        return t->last_result;
    }
    table = PyLong_CheckExact(value) ? t->indices : t->cache;
    if (table != NULL) {
        PyObject *hit = PyDict_GetItemWithError(table, value);     /* borrowed */
        if (hit != NULL) {
            hit = hit == t->unchanged ? value : hit;
            if (kept_by_identity(value)) {
                Py_INCREF(value);
                Py_INCREF(hit);
                Py_XSETREF(t->last, value);
                Py_XSETREF(t->last_result, hit);
            }
            Py_INCREF(hit);
            return hit;
        }
        if (PyErr_Occurred())
            PyErr_Clear();            /* unhashable: the translator decides, as on a miss */
    }
    return PyObject_CallOneArg(t->translate, value);
}

/* ------------------------------------------------------------------------------------ */
/* Rewriter                                                                              */
/* ------------------------------------------------------------------------------------ */

/* No limits to keep in step with Python: a Rewriter takes as many slots, and a slot as many
 * classes, as its declaration has. */
typedef struct {
    Py_ssize_t position;      /* among the positionals, or -1: keyword only */
    PyObject *keyword;        /* interned */
    PyObject *classes;        /* a tuple of types, or NULL: any class. A positional of another
                                 class is another argument */
    Translation translation;
    int pins;                 /* pin_memory where the Rewriter has pinned: True asks for it */
} Slot;

#define SMALL_STACK 16            /* arguments copied on the C stack; more are allocated */

typedef struct {
    PyObject_HEAD
    PyObject *original;
    Py_ssize_t nslots;
    Slot *slots;
    PyObject *dict;
    vectorcallfunc vectorcall;
    /* Where not NULL: placed(result) after a call whose device argument, translated, is
     * device (a factory's tensor made on the device: cudashim/residency.py counts it). */
    PyObject *device, *placed;
    /* Where not NULL, a call that names no device makes its tensor where its first argument
     * is (``torch.zeros_like(x)``, ``x.new_zeros(n)``): placed(result) where this device memory
     * holds that argument's storage (a DeviceMemory is asked in C). */
    PyObject *memory;
    /* Where not NULL: pinned(result) after a call that passed pin_memory=True (a factory's
     * host tensor where the target cannot pin: cudashim/residency.py knows it as pinned). */
    PyObject *pinned;
} RewriterObject;

static int keyword_matches(PyObject *name, PyObject *keyword)
{
    if (name == keyword)
        return 1;
    if (PyUnicode_CHECK_INTERNED(name))
        return 0;                 /* two interned strings are equal only if identical */
    return PyUnicode_Compare(name, keyword) == 0;
}

static int class_allowed(Slot *slot, PyObject *value)
{
    Py_ssize_t i;
    if (slot->classes == NULL)
        return 1;
    for (i = 0; i < PyTuple_GET_SIZE(slot->classes); i++)
        if ((PyObject *)Py_TYPE(value) == PyTuple_GET_ITEM(slot->classes, i))
            return 1;
    return 0;
}

static PyObject *Rewriter_vectorcall(RewriterObject *self, PyObject *const *args,
                                     size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    Py_ssize_t total = nargs + nkw, i;
    PyObject *small[SMALL_STACK + 1], **stack = NULL, *result;
    Py_ssize_t s;
    int on_device = 0, on_pinned = 0, device_named = 0;

    for (s = 0; s < self->nslots; s++) {
        Slot *slot = &self->slots[s];
        Py_ssize_t where = -1;
        PyObject *value, *translated;
        if (slot->position >= 0 && nargs > slot->position) {
            if (!class_allowed(slot, args[slot->position]))
                continue;
            where = slot->position;
        } else if (nkw) {
            for (i = 0; i < nkw; i++)
                if (keyword_matches(PyTuple_GET_ITEM(kwnames, i), slot->keyword)) {
                    where = nargs + i;
                    break;
                }
        }
        if (where < 0)
            continue;
        value = stack != NULL ? stack[where] : args[where];
        if (value == Py_None)
            continue;
        if (slot->pins && value == Py_True)
            on_pinned = 1;
        if (!slot->pins)
            device_named = 1;
        translated = translate_value(&slot->translation, value);
        if (translated == NULL)
            goto error;
        if (translated == self->device)
            on_device = 1;
        if (translated == value) {
            Py_DECREF(translated);
            continue;
        }
        if (stack == NULL) {
            /* One slot in front, so the callee may use it (PY_VECTORCALL_ARGUMENTS_OFFSET). */
            stack = total < SMALL_STACK ? small : PyMem_Malloc((total + 1) * sizeof(PyObject *));
            if (stack == NULL) {
                Py_DECREF(translated);
                PyErr_NoMemory();
                goto error;
            }
            stack++;
            memcpy(stack, args, total * sizeof(PyObject *));
        }
        if (stack[where] != args[where])      /* two slots for one argument: the last wins */
            Py_DECREF(stack[where]);
        stack[where] = translated;        /* owned: released below, where it differs from args */
    }
    if (stack == NULL)
        result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    else
        result = PyObject_Vectorcall(self->original, stack, nargs | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                     kwnames);
    if (self->memory != NULL && !device_named && nargs >= 1 && result != NULL) {
        int yes = device_memory_holds(self->memory, args[0]);
        if (yes < 0)
            Py_CLEAR(result);
        on_device = yes > 0;
    }
    if (on_device && result != NULL) {
        PyObject *placed = PyObject_CallOneArg(self->placed, result);
        if (placed == NULL)
            Py_CLEAR(result);
        Py_XDECREF(placed);
    }
    if (on_pinned && result != NULL) {
        PyObject *pinned = PyObject_CallOneArg(self->pinned, result);
        if (pinned == NULL)
            Py_CLEAR(result);
        Py_XDECREF(pinned);
    }
    goto done;
error:
    result = NULL;
done:
    if (stack != NULL) {
        for (i = 0; i < total; i++)
            if (stack[i] != args[i])
                Py_DECREF(stack[i]);
        if (stack - 1 != small)
            PyMem_Free(stack - 1);
    }
    return result;
}

static int slot_init(Slot *slot, PyObject *spec)
{
    PyObject *position, *keyword, *translate, *classes, *cache, *indices, *unchanged;
    if (!PyArg_ParseTuple(spec, "OUOOOOO:Rewriter slot", &position, &keyword, &classes,
                          &translate, &cache, &indices, &unchanged))
        return 0;
    if (position == Py_None) {
        slot->position = -1;
    } else {
        slot->position = PyLong_AsSsize_t(position);
        if (slot->position < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a slot's position must be >= 0 or None");
            return 0;
        }
    }
    Py_INCREF(keyword);
    PyUnicode_InternInPlace(&keyword);
    slot->keyword = keyword;
    if (classes != Py_None) {
        Py_ssize_t i;
        slot->classes = PySequence_Tuple(classes);
        if (slot->classes == NULL)
            return 0;
        for (i = 0; i < PyTuple_GET_SIZE(slot->classes); i++)
            if (!PyType_Check(PyTuple_GET_ITEM(slot->classes, i))) {
                PyErr_SetString(PyExc_TypeError, "a slot's classes must be types");
                return 0;
            }
    }
    return translation_init(&slot->translation, translate, cache, indices, unchanged);
}

static void slot_clear(Slot *slot)
{
    Py_CLEAR(slot->keyword);
    Py_CLEAR(slot->classes);
    translation_clear(&slot->translation);
}

static PyObject *Rewriter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"original", "slots", "device", "placed", "pinned", "memory", NULL};
    PyObject *original, *slots, *device = NULL, *placed = NULL, *pinned = NULL, *memory = NULL;
    RewriterObject *self;
    Py_ssize_t n, i;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!|OOOO:Rewriter", keywords, &original,
                                     &PyTuple_Type, &slots, &device, &placed, &pinned, &memory))
        return NULL;
    if (memory == Py_None)
        memory = NULL;
    if (device == Py_None && placed == Py_None)
        device = placed = NULL;
    if (pinned == Py_None)
        pinned = NULL;
    if (pinned != NULL && !PyCallable_Check(pinned)) {
        PyErr_SetString(PyExc_TypeError, "Rewriter's pinned must be callable");
        return NULL;
    }
    if ((device == NULL) != (placed == NULL) || (placed != NULL && !PyCallable_Check(placed))) {
        PyErr_SetString(PyExc_TypeError, "Rewriter takes a device and a callable placed, or neither");
        return NULL;
    }
    if (memory != NULL && placed == NULL) {
        PyErr_SetString(PyExc_TypeError, "Rewriter's memory needs placed");
        return NULL;
    }
    n = PyTuple_GET_SIZE(slots);
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "Rewriter takes at least one slot");
        return NULL;
    }
    self = (RewriterObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(original);
    self->original = original;
    Py_XINCREF(device);
    self->device = device;
    Py_XINCREF(placed);
    self->placed = placed;
    Py_XINCREF(pinned);
    self->pinned = pinned;
    Py_XINCREF(memory);
    self->memory = memory;
    self->vectorcall = (vectorcallfunc)Rewriter_vectorcall;
    self->slots = PyMem_Calloc(n, sizeof(Slot));
    if (self->slots == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (i = 0; i < n; i++) {
        self->nslots = i + 1;
        if (!slot_init(&self->slots[i], PyTuple_GET_ITEM(slots, i))) {
            Py_DECREF(self);
            return NULL;
        }
        self->slots[i].pins = pinned != NULL &&
            PyUnicode_CompareWithASCIIString(self->slots[i].keyword, "pin_memory") == 0;
    }
    return (PyObject *)self;
}

static int Rewriter_traverse(RewriterObject *self, visitproc visit, void *arg)
{
    Py_ssize_t s;
    Py_VISIT(self->original);
    Py_VISIT(self->dict);
    Py_VISIT(self->device);
    Py_VISIT(self->placed);
    Py_VISIT(self->memory);
    Py_VISIT(self->pinned);
    for (s = 0; s < self->nslots; s++) {
        Py_VISIT(self->slots[s].classes);
        translation_traverse(&self->slots[s].translation, visit, arg);
    }
    return 0;
}

static int Rewriter_clear(RewriterObject *self)
{
    Py_ssize_t s;
    Py_CLEAR(self->original);
    Py_CLEAR(self->dict);
    Py_CLEAR(self->device);
    Py_CLEAR(self->placed);
    Py_CLEAR(self->memory);
    Py_CLEAR(self->pinned);
    for (s = 0; s < self->nslots; s++)
        slot_clear(&self->slots[s]);
    self->nslots = 0;
    return 0;
}

static void Rewriter_dealloc(RewriterObject *self)
{
    PyObject_GC_UnTrack(self);
    Rewriter_clear(self);
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Rewriter_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(RewriterObject, vectorcall), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(RewriterObject, dict), READONLY},
    {"original", T_OBJECT, offsetof(RewriterObject, original), READONLY},
    {NULL}
};

PyTypeObject RewriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.Rewriter",
    .tp_basicsize = sizeof(RewriterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Rewriter(original, slots, device=None, placed=None, pinned=None, memory=None): original\n"
             "with its device arguments translated; each slot is (position or None, keyword, classes or None,\n"
             "translate, cache, indices, unchanged); placed(result) after a call whose translated device is\n"
             "device (or that names none, where memory.holds(its first argument)),\n"
             "pinned(result) after one that passed pin_memory=True",
    .tp_new = Rewriter_new,
    .tp_traverse = (traverseproc)Rewriter_traverse,
    .tp_clear = (inquiry)Rewriter_clear,
    .tp_dealloc = (destructor)Rewriter_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(RewriterObject, vectorcall),
    .tp_descr_get = bind_as_method,
    .tp_dictoffset = offsetof(RewriterObject, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = Rewriter_members,
    .tp_getset = wrapper_getset,
    .tp_repr = wrapper_repr,
};

/* ------------------------------------------------------------------------------------ */
/* DefaultDevice                                                                         */
/* ------------------------------------------------------------------------------------ */

/* ``method(self, device=None, ...)``: the common calls (``t.cuda()``, ``t.cuda(1)``) go
 * straight to ``move(self, translated device)``; any other call shape to ``fallback``,
 * the Python method it stands for. */
typedef struct {
    PyObject_HEAD
    PyObject *move, *fallback, *missing, *dict;
    PyObject *host, *host_move;   /* to this device: host_move(self), the same move, cheaper */
    Translation translation;
    vectorcallfunc vectorcall;
} DefaultDeviceObject;

static PyObject *DefaultDevice_vectorcall(DefaultDeviceObject *self, PyObject *const *args,
                                          size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *device, *target, *stack[2], *result;
    if (kwnames != NULL || nargs < 1 || nargs > 2)
        return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
    device = nargs == 2 && args[1] != Py_None ? args[1] : self->missing;
    target = translate_value(&self->translation, device);
    if (target == NULL)
        return NULL;
    if (target == self->host && self->host_move != NULL) {
        Py_DECREF(target);
        return PyObject_Vectorcall(self->host_move, args, 1, NULL);
    }
    stack[0] = args[0];
    stack[1] = target;
    result = PyObject_Vectorcall(self->move, stack, 2, NULL);
    Py_DECREF(target);
    return result;
}

static PyObject *DefaultDevice_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"move", "fallback", "missing", "translate", "cache", "indices",
                               "unchanged", "host", "host_move", NULL};
    PyObject *move, *fallback, *missing, *translate, *cache, *indices, *unchanged;
    PyObject *host = NULL, *host_move = NULL;
    DefaultDeviceObject *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOO|OO:DefaultDevice", keywords, &move,
                                     &fallback, &missing, &translate, &cache, &indices, &unchanged,
                                     &host, &host_move))
        return NULL;
    self = (DefaultDeviceObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(move);
    Py_INCREF(fallback);
    Py_INCREF(missing);
    self->move = move;
    self->fallback = fallback;
    self->missing = missing;
    if (host != NULL && host != Py_None && host_move != NULL && host_move != Py_None) {
        Py_INCREF(host);
        Py_INCREF(host_move);
        self->host = host;
        self->host_move = host_move;
    }
    self->vectorcall = (vectorcallfunc)DefaultDevice_vectorcall;
    if (!translation_init(&self->translation, translate, cache, indices, unchanged)) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int DefaultDevice_traverse(DefaultDeviceObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->move);
    Py_VISIT(self->fallback);
    Py_VISIT(self->missing);
    Py_VISIT(self->host);
    Py_VISIT(self->host_move);
    Py_VISIT(self->dict);
    return translation_traverse(&self->translation, visit, arg);
}

static int DefaultDevice_clear(DefaultDeviceObject *self)
{
    Py_CLEAR(self->move);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->missing);
    Py_CLEAR(self->host);
    Py_CLEAR(self->host_move);
    Py_CLEAR(self->dict);
    translation_clear(&self->translation);
    return 0;
}

static void DefaultDevice_dealloc(DefaultDeviceObject *self)
{
    PyObject_GC_UnTrack(self);
    DefaultDevice_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef DefaultDevice_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(DefaultDeviceObject, vectorcall), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(DefaultDeviceObject, dict), READONLY},
    {NULL}
};

PyTypeObject DefaultDeviceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.DefaultDevice",
    .tp_basicsize = sizeof(DefaultDeviceObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "DefaultDevice(move, fallback, missing, translate, cache, indices, unchanged, "
              "host=None, host_move=None)",
    .tp_new = DefaultDevice_new,
    .tp_traverse = (traverseproc)DefaultDevice_traverse,
    .tp_clear = (inquiry)DefaultDevice_clear,
    .tp_dealloc = (destructor)DefaultDevice_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(DefaultDeviceObject, vectorcall),
    .tp_descr_get = bind_as_method,
    .tp_dictoffset = offsetof(DefaultDeviceObject, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = DefaultDevice_members,
    .tp_getset = wrapper_getset,
    .tp_repr = wrapper_repr,
};

/* ------------------------------------------------------------------------------------ */
/* NamedDevice                                                                           */
/* ------------------------------------------------------------------------------------ */

/* A metaclass ``__call__``: (cls, spec) with a string spec seen before is one dict lookup;
 * every other call goes to ``construct`` without ``cls``. */
typedef struct {
    PyObject_HEAD
    PyObject *named, *construct, *dict;
    vectorcallfunc vectorcall;
} NamedDeviceObject;

static PyObject *NamedDevice_vectorcall(NamedDeviceObject *self, PyObject *const *args,
                                        size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 2 && kwnames == NULL && PyUnicode_CheckExact(args[1])) {
        PyObject *hit = PyDict_GetItemWithError(self->named, args[1]);
        if (hit != NULL) {
            Py_INCREF(hit);
            return hit;
        }
        if (PyErr_Occurred())
            return NULL;
    }
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "NamedDevice: called without the class");
        return NULL;
    }
    return PyObject_Vectorcall(self->construct, args + 1, nargs - 1, kwnames);
}

static PyObject *NamedDevice_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"named", "construct", NULL};
    PyObject *named, *construct;
    NamedDeviceObject *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O:NamedDevice", keywords, &PyDict_Type,
                                     &named, &construct))
        return NULL;
    self = (NamedDeviceObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(named);
    Py_INCREF(construct);
    self->named = named;
    self->construct = construct;
    self->vectorcall = (vectorcallfunc)NamedDevice_vectorcall;
    return (PyObject *)self;
}

static int NamedDevice_traverse(NamedDeviceObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->named);
    Py_VISIT(self->construct);
    Py_VISIT(self->dict);
    return 0;
}

static int NamedDevice_clear(NamedDeviceObject *self)
{
    Py_CLEAR(self->named);
    Py_CLEAR(self->construct);
    Py_CLEAR(self->dict);
    return 0;
}

static void NamedDevice_dealloc(NamedDeviceObject *self)
{
    PyObject_GC_UnTrack(self);
    NamedDevice_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef NamedDevice_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(NamedDeviceObject, vectorcall), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(NamedDeviceObject, dict), READONLY},
    {NULL}
};

PyTypeObject NamedDeviceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.NamedDevice",
    .tp_basicsize = sizeof(NamedDeviceObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "NamedDevice(named, construct): a metaclass __call__ answering cached device names",
    .tp_new = NamedDevice_new,
    .tp_traverse = (traverseproc)NamedDevice_traverse,
    .tp_clear = (inquiry)NamedDevice_clear,
    .tp_dealloc = (destructor)NamedDevice_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(NamedDeviceObject, vectorcall),
    .tp_descr_get = bind_as_method,
    .tp_dictoffset = offsetof(NamedDeviceObject, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = NamedDevice_members,
    .tp_getset = wrapper_getset,
    .tp_repr = wrapper_repr,
};
