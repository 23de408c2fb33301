/* The compiled fast path, who asks: CallerCache (the caller's code object -> does its module
 * hear the truth), TruthSwitch (torch.cuda functions by who asks) and IsCuda (the
 * Tensor.is_cuda property, patches/tensors.py). */

#include "_speedups.h"

/* ------------------------------------------------------------------------------------ */
/* CallerCache                                                                           */
/* ------------------------------------------------------------------------------------ */

/* Open addressing over code object pointers. A code object is held (a reference), so its
 * address cannot be reused by another while it is in the table. */
#define CALLER_SLOTS 16384            /* a power of two; the limit Python gives keeps it half empty */

typedef struct {
    PyObject *code;
    int answer;
} CallerEntry;

typedef struct {
    PyObject_HEAD
    PyObject *decide;                 /* module name -> bool */
    CallerEntry *table;
    Py_ssize_t used;
    Py_ssize_t limit;                 /* at most this many entries (callers.BY_CODE_LIMIT) */
} CallerCacheObject;

static inline size_t caller_slot(PyObject *code)
{
    return ((uintptr_t)code >> 4) & (CALLER_SLOTS - 1);
}

static int caller_decide(CallerCacheObject *self, PyFrameObject *frame)
{
    PyObject *globals = NULL, *name = NULL, *answer;
    int result;
    if (frame != NULL) {
#if PY_VERSION_HEX >= 0x030B0000
        globals = PyFrame_GetGlobals(frame);
#else
        globals = PyObject_GetAttrString((PyObject *)frame, "f_globals");
#endif
        if (globals == NULL)
            return -1;
        name = PyDict_Check(globals) ? PyDict_GetItemString(globals, "__name__") : NULL;
    }
    /* No Python caller, or one without a module name: decided as the nameless module "". */
    if (name == NULL)
        name = PyUnicode_FromString("");
    else
        Py_INCREF(name);
    answer = name == NULL ? NULL : PyObject_CallOneArg(self->decide, name);
    Py_XDECREF(name);
    Py_XDECREF(globals);
    if (answer == NULL)
        return -1;
    result = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return result;
}

/* Does the code running in ``frame`` hear the truth? 1, 0, or -1 with an exception set. */
static int caller_answer(CallerCacheObject *self, PyFrameObject *frame)
{
    PyCodeObject *code;
    size_t slot;
    int answer;
    if (frame == NULL)                /* no Python caller: decided as a nameless module */
        return caller_decide(self, NULL);
    code = PyFrame_GetCode(frame);    /* a new reference */
    slot = caller_slot((PyObject *)code);
    for (;;) {
        CallerEntry *entry = &self->table[slot];
        if (entry->code == (PyObject *)code) {
            Py_DECREF(code);
            return entry->answer;
        }
        if (entry->code == NULL)
            break;
        slot = (slot + 1) & (CALLER_SLOTS - 1);
    }
    answer = caller_decide(self, frame);
    if (answer >= 0 && self->used < self->limit) {
        self->table[slot].code = (PyObject *)code;      /* the table keeps the reference */
        self->table[slot].answer = answer;
        self->used++;
    } else {
        Py_DECREF(code);
    }
    return answer;
}

/* The frame ``depth`` levels up: 1 is the Python code calling into C. Borrowed-like: the
 * caller must Py_XDECREF what ``*owned`` holds. */
static PyFrameObject *frame_at(int depth, PyFrameObject **owned)
{
    PyFrameObject *frame = PyEval_GetFrame();
    *owned = NULL;
    while (frame != NULL && depth-- > 1) {
        PyFrameObject *back = PyFrame_GetBack(frame);   /* a new reference */
        Py_XDECREF(*owned);
        *owned = back;
        frame = back;
    }
    return frame;
}

static void caller_cache_clear_table(CallerCacheObject *self)
{
    Py_ssize_t i;
    for (i = 0; i < CALLER_SLOTS; i++)
        Py_CLEAR(self->table[i].code);
    self->used = 0;
}

static PyObject *CallerCache_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"decide", "limit", NULL};
    PyObject *decide;
    Py_ssize_t limit;
    CallerCacheObject *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "On:CallerCache", keywords, &decide, &limit))
        return NULL;
    if (!PyCallable_Check(decide)) {
        PyErr_SetString(PyExc_TypeError, "CallerCache(decide, limit): decide must be callable");
        return NULL;
    }
    if (limit < 0 || limit > CALLER_SLOTS / 2) {
        PyErr_Format(PyExc_ValueError, "CallerCache(decide, limit): limit must be 0 to %d",
                     CALLER_SLOTS / 2);
        return NULL;
    }
    self = (CallerCacheObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->table = PyMem_Calloc(CALLER_SLOTS, sizeof(CallerEntry));
    if (self->table == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    Py_INCREF(decide);
    self->decide = decide;
    self->limit = limit;
    return (PyObject *)self;
}

static int CallerCache_traverse(CallerCacheObject *self, visitproc visit, void *arg)
{
    Py_ssize_t i;
    Py_VISIT(self->decide);
    if (self->table != NULL)
        for (i = 0; i < CALLER_SLOTS; i++)
            Py_VISIT(self->table[i].code);
    return 0;
}

static int CallerCache_clear(CallerCacheObject *self)
{
    Py_CLEAR(self->decide);
    if (self->table != NULL)
        caller_cache_clear_table(self);
    return 0;
}

static void CallerCache_dealloc(CallerCacheObject *self)
{
    PyObject_GC_UnTrack(self);
    CallerCache_clear(self);
    PyMem_Free(self->table);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *CallerCache_ask(CallerCacheObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int depth = 2, answer;
    PyFrameObject *owned, *frame;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "ask() takes at most one argument (depth)");
        return NULL;
    }
    if (nargs == 1) {
        depth = (int)PyLong_AsLong(args[0]);
        if (depth == -1 && PyErr_Occurred())
            return NULL;
    }
    /* As sys._getframe(depth) seen from a Python ask(): 1 is ask's caller. */
    frame = frame_at(depth, &owned);
    answer = caller_answer(self, frame);
    Py_XDECREF(owned);
    if (answer < 0)
        return NULL;
    return PyBool_FromLong(answer);
}

static PyObject *CallerCache_clear_method(CallerCacheObject *self, PyObject *unused)
{
    caller_cache_clear_table(self);
    Py_RETURN_NONE;
}

static Py_ssize_t CallerCache_len(CallerCacheObject *self)
{
    return self->used;
}

static PyMethodDef CallerCache_methods[] = {
    {"ask", (PyCFunction)(void (*)(void))CallerCache_ask, METH_FASTCALL,
     "ask(depth=2): does the code depth - 1 frames above the caller hear the truth?"},
    {"clear", (PyCFunction)CallerCache_clear_method, METH_NOARGS, "forget every answer"},
    {NULL}
};

static PySequenceMethods CallerCache_as_sequence = {
    .sq_length = (lenfunc)CallerCache_len,
};

PyTypeObject CallerCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.CallerCache",
    .tp_basicsize = sizeof(CallerCacheObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "CallerCache(decide, limit): decide(module name) per calling code object, remembered\n"
              "for up to limit code objects",
    .tp_new = CallerCache_new,
    .tp_traverse = (traverseproc)CallerCache_traverse,
    .tp_clear = (inquiry)CallerCache_clear,
    .tp_dealloc = (destructor)CallerCache_dealloc,
    .tp_methods = CallerCache_methods,
    .tp_as_sequence = &CallerCache_as_sequence,
};

static int check_cache(PyObject *cache)
{
    if (!PyObject_TypeCheck(cache, &CallerCacheType)) {
        PyErr_SetString(PyExc_TypeError, "expected a cudashim._speedups.CallerCache");
        return 0;
    }
    return 1;
}

/* Is the code running right now (the Python caller of the C function) honest? */
static inline int current_caller_honest(PyObject *cache)
{
    return caller_answer((CallerCacheObject *)cache, PyEval_GetFrame());
}

/* ------------------------------------------------------------------------------------ */
/* TruthSwitch                                                                           */
/* ------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *cache, *real, *ours, *dict;
    vectorcallfunc vectorcall;
} TruthSwitchObject;

static PyObject *TruthSwitch_vectorcall(TruthSwitchObject *self, PyObject *const *args,
                                        size_t nargsf, PyObject *kwnames)
{
    int honest = current_caller_honest(self->cache);
    if (honest < 0)
        return NULL;
    return PyObject_Vectorcall(honest ? self->real : self->ours, args, nargsf, kwnames);
}

static PyObject *TruthSwitch_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"cache", "real", "ours", NULL};
    PyObject *cache, *real, *ours;
    TruthSwitchObject *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:TruthSwitch", keywords, &cache, &real, &ours))
        return NULL;
    if (!check_cache(cache))
        return NULL;
    self = (TruthSwitchObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(cache);
    Py_INCREF(real);
    Py_INCREF(ours);
    self->cache = cache;
    self->real = real;
    self->ours = ours;
    self->vectorcall = (vectorcallfunc)TruthSwitch_vectorcall;
    return (PyObject *)self;
}

static int TruthSwitch_traverse(TruthSwitchObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cache);
    Py_VISIT(self->real);
    Py_VISIT(self->ours);
    Py_VISIT(self->dict);
    return 0;
}

static int TruthSwitch_clear(TruthSwitchObject *self)
{
    Py_CLEAR(self->cache);
    Py_CLEAR(self->real);
    Py_CLEAR(self->ours);
    Py_CLEAR(self->dict);
    return 0;
}

static void TruthSwitch_dealloc(TruthSwitchObject *self)
{
    PyObject_GC_UnTrack(self);
    TruthSwitch_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef TruthSwitch_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(TruthSwitchObject, vectorcall), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(TruthSwitchObject, dict), READONLY},
    {"real", T_OBJECT, offsetof(TruthSwitchObject, real), READONLY},
    {"ours", T_OBJECT, offsetof(TruthSwitchObject, ours), READONLY},
    {NULL}
};

PyTypeObject TruthSwitchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.TruthSwitch",
    .tp_basicsize = sizeof(TruthSwitchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "TruthSwitch(cache, real, ours): real for callers that hear the truth, ours otherwise",
    .tp_new = TruthSwitch_new,
    .tp_traverse = (traverseproc)TruthSwitch_traverse,
    .tp_clear = (inquiry)TruthSwitch_clear,
    .tp_dealloc = (destructor)TruthSwitch_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(TruthSwitchObject, vectorcall),
    .tp_dictoffset = offsetof(TruthSwitchObject, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = TruthSwitch_members,
    .tp_getset = wrapper_getset,
    .tp_repr = wrapper_repr,
};

/* ------------------------------------------------------------------------------------ */
/* IsCuda                                                                                */
/* ------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *cache;
    PyObject *real;           /* TensorBase.is_cuda, a getset descriptor */
    PyObject *on_target;      /* TensorBase.is_<target type> (a descriptor), or a callable */
    int on_target_is_descriptor;
    PyObject *doc;
} IsCudaObject;

static PyObject *descriptor_get(PyObject *descriptor, PyObject *obj)
{
    return Py_TYPE(descriptor)->tp_descr_get(descriptor, obj, (PyObject *)Py_TYPE(obj));
}

static PyObject *IsCuda_get(IsCudaObject *self, PyObject *obj, PyObject *type)
{
    int honest;
    PyObject *on;
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return (PyObject *)self;
    }
    honest = current_caller_honest(self->cache);
    if (honest < 0)
        return NULL;
    if (honest)
        return descriptor_get(self->real, obj);
    on = self->on_target_is_descriptor ? descriptor_get(self->on_target, obj)
                                       : PyObject_CallOneArg(self->on_target, obj);
    if (on == NULL)
        return NULL;
    if (on == Py_True)
        return on;
    Py_DECREF(on);
    return descriptor_get(self->real, obj);
}

static int IsCuda_set(IsCudaObject *self, PyObject *obj, PyObject *value)
{
    PyErr_Format(PyExc_AttributeError, "property 'is_cuda' of '%.100s' object has no setter",
                 Py_TYPE(obj)->tp_name);
    return -1;
}

static PyObject *IsCuda_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"cache", "real", "on_target", "doc", NULL};
    PyObject *cache, *real, *on_target, *doc = Py_None;
    IsCudaObject *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|O:IsCuda", keywords, &cache, &real,
                                     &on_target, &doc))
        return NULL;
    if (!check_cache(cache))
        return NULL;
    if (Py_TYPE(real)->tp_descr_get == NULL) {
        PyErr_SetString(PyExc_TypeError, "IsCuda: real must be a descriptor");
        return NULL;
    }
    self = (IsCudaObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(cache);
    Py_INCREF(real);
    Py_INCREF(on_target);
    Py_INCREF(doc);
    self->cache = cache;
    self->real = real;
    self->on_target = on_target;
    /* A getset descriptor such as TensorBase.is_cpu: read it in C, no call. */
    self->on_target_is_descriptor = Py_TYPE(on_target)->tp_descr_get != NULL &&
                                    Py_TYPE(on_target) == Py_TYPE(real);
    self->doc = doc;
    return (PyObject *)self;
}

static int IsCuda_traverse(IsCudaObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cache);
    Py_VISIT(self->real);
    Py_VISIT(self->on_target);
    Py_VISIT(self->doc);
    return 0;
}

static int IsCuda_clear(IsCudaObject *self)
{
    Py_CLEAR(self->cache);
    Py_CLEAR(self->real);
    Py_CLEAR(self->on_target);
    Py_CLEAR(self->doc);
    return 0;
}

static void IsCuda_dealloc(IsCudaObject *self)
{
    PyObject_GC_UnTrack(self);
    IsCuda_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef IsCuda_members[] = {
    {"__doc__", T_OBJECT, offsetof(IsCudaObject, doc), READONLY},
    {NULL}
};

PyTypeObject IsCudaType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.IsCuda",
    .tp_basicsize = sizeof(IsCudaObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = IsCuda_new,
    .tp_traverse = (traverseproc)IsCuda_traverse,
    .tp_clear = (inquiry)IsCuda_clear,
    .tp_dealloc = (destructor)IsCuda_dealloc,
    .tp_descr_get = (descrgetfunc)IsCuda_get,
    .tp_descr_set = (descrsetfunc)IsCuda_set,
    .tp_members = IsCuda_members,
};
